"""Softmax over the last dim: ``torch.softmax(x, -1)``, fp32 math, the output in x's dtype.

    m = max(x),  e = exp(x - m),  y = e / sum(e)                       (per row)
Backward, from the saved output y (rounded to x's dtype, as torch saves it):
    dx = y * (dy - sum(dy * y))                                        (per row)

Two kernel paths per direction, chosen by ``_norm.plan_rows`` (the norms' row plan):
- whole rows: a (BLOCK_R, BLOCK_N) tile holds BLOCK_R whole rows (several narrow rows per tile), so the forward
  reads x once and writes y once, the backward reads dy and y once and writes dx once. On CUDA rows up to
  ``_norm.CUDA_WHOLE_ROW_MAX`` (16K) columns stay whole in one program;
- looped rows (BLOCK_R = 1, rows wider than one tile): the forward walks the row twice, first for the statistics
  with an online max and sum (each chunk's sum of exp(x - m_chunk) rescaled by exp(m_old - m_new)), then to
  normalise; the backward walks it twice, for sum(dy * y) and then for dx. The second walk goes from the row's
  end to its start (``REVERSE_SECOND_PASS``, every backend): the chunks read last by the first walk are the ones
  most likely still in the L2 (or, on an Ascend chip, its L2) when the second begins.

CUDA launch policy (``_plan``; the NPU and CPU take ``plan_rows`` as it is):
- whole rows of 8192+ columns: one row per program, 16 warps forward (Liger-Kernel's choice, 0.96 of copy at
  16384x8192 against our 0.94 on 8 warps, H200), 8 backward (f+b already 0.99); stores of y and dx of rows that
  wide are streaming (``.cs``: written once, read by another kernel at the earliest);
- rows wider than ``_norm.CUDA_WHOLE_ROW_MAX``: ``CUDA_LOOPED`` chunk and warps, and ``CUDA_PREFETCH``: each
  walk loads the next chunk before reducing / storing this one (Triton does not pipeline these loops; a program
  otherwise waits out every chunk's load latency, 0.61-0.64 of copy at 2048x65536). Round 19's probe (H100,
  2048x65536 bf16): 0.245 / 0.577 ms forward / forward+backward against the old loop's 0.265 / 0.680 and
  Liger-Kernel's 0.280 / 0.604 (which keeps the 65536-wide row whole on 32 warps: as whole rows here, 0.296 /
  1.210 on 32 warps, the fp32 tile fills an SM's register file and spills).

Non-finite inputs give what torch gives: a NaN in a row, or +inf, makes the row NaN (exp(inf - inf)); a row of
-inf only is NaN too (0 / 0); -inf entries in a row with a finite entry give 0. No clamp through ``maximum``
(a GPU's maximum drops NaN): the running max may drop a NaN, but that element's exp(NaN - m) is NaN and so is
the row's sum. The online update is written so that -inf never meets -inf: a chunk of -inf only adds 0 while the
running max is still -inf.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile, tiles sized in fp32: dtype_size 4):
- forward: x as loaded, x in fp32, e = exp(x - m), y before the cast: ~4 live values;
- backward: y and dy (as loaded and in fp32), dy * y, dx before the cast: ~5 (the looped backward adds the fp32
  accumulator of dy * y).
bishengir reuses those buffers better than the count: the Ascend compile check's headroom probe fits 8192-element
tiles of both kernels on A2/A3 (Ascend910B3, Ascend910_9392) in fp32, bf16 and fp16, and overflows first at 16384
(16-18 UB bytes per element), so both use 2.5 (192 KiB * 0.8 / (2.5 * 4 B) = 15728 -> tiles of at most 8192
elements: hidden 8192 is one tile, read once, in the forward and the backward; 16384 and wider loop). A 4.0/5.0
count would loop the 8192-wide backward and read dy and y twice.
CUDA's prefetch (looped rows only) keeps one more chunk of each loaded tensor live in registers, as stored
(bf16: half an fp32 value): CUDA tiles are not sized by these multipliers past the 16K whole-row lift, and the
NPU never prefetches, so the multipliers stay.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._norm import CudaWideRows, as_rows, check_grad, plan_rows
from ._triton import (check_float_tensor, chunk_walk, grid_stride, launched_kernel, new_like, program_start,
                      require_launchable)

FORWARD_MEMORY_MULTIPLIER = 2.5
BACKWARD_MEMORY_MULTIPLIER = 2.5
# CUDA tiles for whole rows of 8192+ columns: one row per program; forward on 16 warps (Liger-Kernel's, 0.96 of
# copy at 16384x8192 on an H200 against 0.94 on 8), backward on 8 (the tile rms_norm's forward measured best;
# softmax f+b 0.99 of copy with 8 warps both ways).
CUDA_FORWARD_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=16),)
CUDA_BACKWARD_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=8),)
# CUDA rows wider than the norms' whole-row limit (``_norm.CUDA_WHOLE_ROW_MAX``, 16K) loop: (chunk columns, warps)
# per direction (16K chunks on 16 warps: 4 chunks a 65536-wide row; 8K or 4K chunks measured slower, round 19).
CUDA_LOOPED = {"forward": (16384, 16), "backward": (16384, 16)}
# CUDA looped rows: load the next chunk while this one is reduced or stored (see the module docstring).
CUDA_PREFETCH = True
# CUDA: streaming stores (.cs, evict first) of y / dx for rows at least this wide (written once, never re-read by
# this kernel; Liger-Kernel stores y so). Narrow rows (65536x1024, already ahead of every peer) keep plain stores.
CUDA_STREAM_MIN_COLS = 8192
# Every backend: the looped kernels' second walk goes from the row's end back to its start (see above).
REVERSE_SECOND_PASS = True


@triton.jit
def _store(ptr, value, mask, STREAM: tl.constexpr):
    if STREAM:  # CUDA only (decided by the launcher): written once, evict first
        tl.store(ptr, value, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptr, value, mask=mask)


@launched_kernel(do_not_specialize=["n_rows"])
def _softmax_fwd_kernel(x_ptr, y_ptr, n_rows, n_cols, x_stride, WHOLE_ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                        BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr = False, REVERSE: tl.constexpr = False,
                        STREAM: tl.constexpr = False):
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:  # BLOCK_R whole rows per tile: x read once, y written once
        col_mask = col_ids < n_cols
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=float("-inf")).to(tl.float32)
            e = tl.exp(x - tl.max(x, axis=1)[:, None])
            y = e * (1.0 / tl.sum(e, axis=1))[:, None]
            _store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask, STREAM)
    else:  # one row in BLOCK_N chunks: pass 1 online max and sum, pass 2 normalises
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            x_row = x_ptr + rows * x_stride
            m = tl.zeros((BLOCK_R, 1), dtype=tl.float32) + float("-inf")
            d = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            if PREFETCH:  # CUDA only: the next chunk, as stored, is in flight while this one is reduced
                x_next = tl.load(x_row + col_ids, mask=row_ok & (col_ids < n_cols), other=float("-inf"))
            for c in tl.range(0, n_cols, BLOCK_N):
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    ahead = c + BLOCK_N + col_ids
                    x_next = tl.load(x_row + ahead, mask=row_ok & (ahead < n_cols), other=float("-inf"))
                else:
                    cols = c + col_ids
                    x = tl.load(x_row + cols, mask=row_ok & (cols < n_cols), other=float("-inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=1)[:, None])
                # m == m_new also when both are -inf (nothing seen yet) or +inf: no inf - inf in the rescale
                rescale = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
                # while every value so far is -inf, the chunk's exps are exp(-inf) = 0, not exp(-inf + inf)
                shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                d = d * rescale + tl.sum(tl.exp(x - shift), axis=1)[:, None]
                m = m_new
            inv_d = 1.0 / d
            n_chunks, first, step = chunk_walk(n_cols, BLOCK_N, REVERSE)
            if PREFETCH:
                x_next = tl.load(x_row + first + col_ids, mask=row_ok & (first + col_ids < n_cols),
                                 other=float("-inf"))
            for i in tl.range(0, n_chunks):
                cols = first + i * step + col_ids
                mask = row_ok & (cols < n_cols)
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    ahead = cols + step
                    x_next = tl.load(x_row + ahead, mask=row_ok & (ahead >= 0) & (ahead < n_cols),
                                     other=float("-inf"))
                else:
                    x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
                y = tl.exp(x - m) * inv_d
                _store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask, STREAM)


@launched_kernel(do_not_specialize=["n_rows"])
def _softmax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, dy_stride, y_stride, WHOLE_ROW: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr = False,
                        REVERSE: tl.constexpr = False, STREAM: tl.constexpr = False):
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:
        col_mask = col_ids < n_cols
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            y = tl.load(y_ptr + rows * y_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + rows * dy_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
            _store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask, STREAM)
    else:  # one row in chunks: pass 1 sum(dy * y), pass 2 dx
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            y_row = y_ptr + rows * y_stride
            dy_row = dy_ptr + rows * dy_stride
            acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            if PREFETCH:  # CUDA only: the next chunks, as stored, are in flight while this one is summed
                first_mask = row_ok & (col_ids < n_cols)
                y_next = tl.load(y_row + col_ids, mask=first_mask, other=0.0)
                dy_next = tl.load(dy_row + col_ids, mask=first_mask, other=0.0)
            for c in tl.range(0, n_cols, BLOCK_N):
                if PREFETCH:
                    y = y_next.to(tl.float32)
                    dy = dy_next.to(tl.float32)
                    ahead = c + BLOCK_N + col_ids
                    ahead_mask = row_ok & (ahead < n_cols)
                    y_next = tl.load(y_row + ahead, mask=ahead_mask, other=0.0)
                    dy_next = tl.load(dy_row + ahead, mask=ahead_mask, other=0.0)
                else:
                    cols = c + col_ids
                    mask = row_ok & (cols < n_cols)
                    y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
                acc += dy * y
            dot = tl.sum(acc, axis=1)[:, None]
            n_chunks, first, step = chunk_walk(n_cols, BLOCK_N, REVERSE)
            if PREFETCH:
                first_mask = row_ok & (first + col_ids < n_cols)
                y_next = tl.load(y_row + first + col_ids, mask=first_mask, other=0.0)
                dy_next = tl.load(dy_row + first + col_ids, mask=first_mask, other=0.0)
            for i in tl.range(0, n_chunks):
                cols = first + i * step + col_ids
                mask = row_ok & (cols < n_cols)
                if PREFETCH:
                    y = y_next.to(tl.float32)
                    dy = dy_next.to(tl.float32)
                    ahead = cols + step
                    ahead_mask = row_ok & (ahead >= 0) & (ahead < n_cols)
                    y_next = tl.load(y_row + ahead, mask=ahead_mask, other=0.0)
                    dy_next = tl.load(dy_row + ahead, mask=ahead_mask, other=0.0)
                else:
                    y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
                _store(dx_ptr + rows * n_cols + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask, STREAM)


def _last_dim(t: torch.Tensor) -> int:
    """The softmax dim's size; a 0-d tensor is one row of one element (``torch.softmax`` of a scalar is 1)."""
    return t.shape[-1] if t.dim() else 1


def _plan(device_type: str, n_rows: int, n_cols: int, direction: str):
    """(tiles, constexpr switches) of one direction: ``plan_rows`` as it is on the NPU and CPU, the CUDA policy of
    the module docstring on CUDA (the CUDA knobs are read on every call, so a probe may change them)."""
    backward = direction == "backward"
    multiplier = BACKWARD_MEMORY_MULTIPLIER if backward else FORWARD_MEMORY_MULTIPLIER
    wide = CUDA_BACKWARD_WIDE_ROWS if backward else CUDA_FORWARD_WIDE_ROWS
    tiles = plan_rows(device_type, n_rows, n_cols, multiplier, persistent=False, cuda_wide_rows=wide)
    cuda = device_type == "cuda"
    if cuda and not tiles.whole_row:
        block, warps = CUDA_LOOPED[direction]
        tiles = tiles._replace(block_cols=block, options={"num_warps": warps})
    switches = dict(PREFETCH=cuda and CUDA_PREFETCH and not tiles.whole_row,
                    REVERSE=REVERSE_SECOND_PASS and not tiles.whole_row,
                    STREAM=cuda and n_cols >= CUDA_STREAM_MIN_COLS)
    return tiles, switches


def check_softmax_input(x: torch.Tensor) -> None:
    check_float_tensor("x", x)


def check_softmax_backward_inputs(grad_out: torch.Tensor, y: torch.Tensor) -> None:
    check_float_tensor("y", y)
    check_grad("grad_out", grad_out, y.shape, y.dtype, y.device)


def softmax_forward(x: torch.Tensor) -> torch.Tensor:
    check_softmax_input(x)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    n_cols = _last_dim(x)
    x2 = as_rows(x, n_cols)
    n_rows = x2.shape[0]
    tiles, switches = _plan(x.device.type, n_rows, n_cols, "forward")
    _softmax_fwd_kernel[(tiles.grid,)](x2, y, n_rows, n_cols, x2.stride(0), WHOLE_ROW=tiles.whole_row,
                                       BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols, **switches,
                                       **tiles.options)
    return y


def softmax_backward(grad_out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """grad_x from the incoming gradient and the forward's output y."""
    check_softmax_backward_inputs(grad_out, y)
    dx = new_like(y)
    if y.numel() == 0:
        return dx
    require_launchable(y.device)
    n_cols = _last_dim(y)
    y2, dy2 = as_rows(y, n_cols), as_rows(grad_out, n_cols)
    n_rows = y2.shape[0]
    tiles, switches = _plan(y.device.type, n_rows, n_cols, "backward")
    _softmax_bwd_kernel[(tiles.grid,)](dy2, y2, dx, n_rows, n_cols, dy2.stride(0), y2.stride(0),
                                       WHOLE_ROW=tiles.whole_row, BLOCK_R=tiles.block_rows,
                                       BLOCK_N=tiles.block_cols, **switches, **tiles.options)
    return dx
