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
  normalise; the backward walks it twice, for sum(dy * y) and then for dx.

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
"""

from __future__ import annotations

import torch
import triton.language as tl

from ._norm import CudaWideRows, as_rows, check_grad, plan_rows
from ._triton import check_float_tensor, grid_stride, launched_kernel, new_like, program_start, require_launchable

FORWARD_MEMORY_MULTIPLIER = 2.5
BACKWARD_MEMORY_MULTIPLIER = 2.5
# CUDA tiles for whole rows of 8192+ columns: one row per program on 8 warps, the tile rms_norm's forward measured
# best at 16384x8192 (H200, bf16, 0.95 of copy); not yet measured for softmax itself.
CUDA_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=8),)


@launched_kernel(do_not_specialize=["n_rows"])
def _softmax_fwd_kernel(x_ptr, y_ptr, n_rows, n_cols, x_stride, WHOLE_ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                        BLOCK_N: tl.constexpr):
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
            tl.store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # one row in BLOCK_N chunks: pass 1 online max and sum, pass 2 normalises
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            m = tl.zeros((BLOCK_R, 1), dtype=tl.float32) + float("-inf")
            d = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                x = tl.load(x_ptr + rows * x_stride + cols, mask=row_ok & (cols < n_cols),
                            other=float("-inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=1)[:, None])
                # m == m_new also when both are -inf (nothing seen yet) or +inf: no inf - inf in the rescale
                rescale = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
                # while every value so far is -inf, the chunk's exps are exp(-inf) = 0, not exp(-inf + inf)
                shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                d = d * rescale + tl.sum(tl.exp(x - shift), axis=1)[:, None]
                m = m_new
            inv_d = 1.0 / d
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
                y = tl.exp(x - m) * inv_d
                tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows"])
def _softmax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, dy_stride, y_stride, WHOLE_ROW: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
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
            tl.store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:  # one row in chunks: pass 1 sum(dy * y), pass 2 dx
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                y = tl.load(y_ptr + rows * y_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                acc += dy * y
            dot = tl.sum(acc, axis=1)[:, None]
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                y = tl.load(y_ptr + rows * y_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + rows * n_cols + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def _last_dim(t: torch.Tensor) -> int:
    """The softmax dim's size; a 0-d tensor is one row of one element (``torch.softmax`` of a scalar is 1)."""
    return t.shape[-1] if t.dim() else 1


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
    tiles = plan_rows(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_WIDE_ROWS)
    _softmax_fwd_kernel[(tiles.grid,)](x2, y, n_rows, n_cols, x2.stride(0), WHOLE_ROW=tiles.whole_row,
                                       BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols, **tiles.options)
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
    tiles = plan_rows(y.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_WIDE_ROWS)
    _softmax_bwd_kernel[(tiles.grid,)](dy2, y2, dx, n_rows, n_cols, dy2.stride(0), y2.stride(0),
                                       WHOLE_ROW=tiles.whole_row, BLOCK_R=tiles.block_rows,
                                       BLOCK_N=tiles.block_cols, **tiles.options)
    return dx
