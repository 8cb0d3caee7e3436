"""RMSNorm over the last dim, and its fused residual-add form.

    rms_norm:            y = x * rsqrt(mean(x^2) + eps) * (offset + weight)
    fused_add_rms_norm:  s = x + residual (rounded to x's dtype, as a decoder layer's ``residual + hidden``);
                         (rms_norm(s), s)

The weight is optional (``elementwise_affine=False`` modules, Llama-4's weightless qk norm, Liger's ``W=None``):
without one, y = x * rsqrt(mean(x^2) + eps), in x's dtype in every casting mode; ``offset`` belongs to the weight
and is unused then (as in Liger-Kernel), and the backward computes no weight gradient (the ``HAS_WEIGHT`` switch).

Casting modes reproduce where Hugging Face's modules round (statistics always in fp32):
- ``llama`` (LlamaRMSNorm, Qwen2/3, Mistral, Llama-4): the normalised x is rounded to x's dtype, then multiplied
  by ``offset + weight``; the result has ``promote_types(x, weight)``'s dtype, as ``weight * h.to(dtype)`` has
  (x's dtype without a weight: the rounded normalised x is the result);
- ``gemma`` (GemmaRMSNorm, Gemma2/3, offset 1): everything in fp32, one rounding to x's dtype at the end;
- ``none``: no upcast of the result: rstd is taken in x's dtype (as arithmetic in x's dtype gives it), the
  product ``x * rstd * (offset + weight)`` is rounded once, to x's dtype. (Rounding every intermediate as a
  torch computation in x's dtype would only add error; the kernel's arithmetic is fp32 in every mode.)

Backward, with n = x * rstd and g = dy * (offset + weight) (g = dy without a weight):
    dx = rstd * (g - n * mean(g * n))   (+ the sum output's own gradient for fused_add_rms_norm)
    dW = sum over rows of dy * n        (n rounded as the forward rounded it before the weight multiply; none
                                         without a weight)
rstd is recomputed from x rather than saved: the backward reads x anyway, and a whole-row tile gets it for one
reduction. dW goes through per-program fp32 partials (see ``_norm.py``); dy and x are only read.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile; the weight row is shared by the tile's rows):
- forward: x as loaded, x in fp32, x^2, y before the cast -> 4.0; with a residual add: residual and s -> 6.0
  (Ascend910B3: 192 KiB * 0.8 / (4 * 4 B) = 9830 -> 8192 columns; 6.0 -> 4096);
- backward: x, dy, n, g, dx, the dW accumulator, + the weight row -> 7.0; with the sum's gradient -> 8.0
  (5617 / 4915 -> 4096 columns). Wider rows loop (``_norm.plan_rows``). Without a weight the kernels hold
  fewer values (no weight row, no g, no dW accumulator) and keep the same plans (the multipliers above bound
  them). The CUDA-only backward prefetch
  (``PREFETCH``) holds two more tiles as stored; the NPU never prefetches, so its UB analysis is the above.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._norm import (CudaWideRows, as_rows, check_eps, check_grad, check_norm_input, check_norm_param, load_tile,
                    param_row, plan_rows, sum_partials)
from ._triton import check_same_layout, grid_stride, launched_kernel, new_like, program_start, require_launchable

LLAMA: tl.constexpr = tl.constexpr(0)
GEMMA: tl.constexpr = tl.constexpr(1)
NONE: tl.constexpr = tl.constexpr(2)
CASTING_MODES = {"llama": LLAMA.value, "gemma": GEMMA.value, "none": NONE.value}  # casting_mode -> CASTING

FORWARD_MEMORY_MULTIPLIER = 4.0
FUSED_FORWARD_MEMORY_MULTIPLIER = 6.0
BACKWARD_MEMORY_MULTIPLIER = 7.0
FUSED_BACKWARD_MEMORY_MULTIPLIER = 8.0
# CUDA forward at 8192+ columns: one row on 8 warps (H200, bf16, weight per tile, 16384x8192: 132 us plain,
# 134 us with Gemma's offset, 261 us fused: 0.95-0.98 of copy; 16 warps took 161 us with the offset).
CUDA_FORWARD_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=8),)


@triton.jit
def _round_to(x, like_ptr):
    """x (fp32) rounded to the element type of ``like_ptr`` and back to fp32."""
    return x.to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _rms_scale(x, rstd, w, x_ptr, CASTING: tl.constexpr):
    """y in fp32 (before the store's cast) from x, rstd (per row) and w = offset + weight, all fp32, rounded
    where the casting mode rounds (module docstring)."""
    if CASTING == LLAMA:
        y = _round_to(x * rstd, x_ptr) * w
    elif CASTING == GEMMA:
        y = x * rstd * w
    else:  # NONE
        y = x * _round_to(rstd, x_ptr) * w
    return y


@triton.jit
def _rms_weight_factor(n, x_ptr, CASTING: tl.constexpr):
    """What multiplies the weight in the forward (dW = sum dy * this): n as the casting mode rounded it."""
    if CASTING == LLAMA:
        f = _round_to(n, x_ptr)
    else:
        f = n
    return f


@triton.jit
def _scaled(x, rstd, w_ptr, cols, col_mask, offset, x_ptr, CASTING: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """y in fp32 for a chunk of a looped row, its weight chunk loaded here: ``offset + weight``, or no scale
    without a weight."""
    if HAS_WEIGHT:
        y = _rms_scale(x, rstd, tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset, x_ptr,
                       CASTING)
    else:
        y = _rms_scale(x, rstd, 1.0, x_ptr, CASTING)
    return y


@triton.jit
def _load_input(x_ptr, r_ptr, s_ptr, rows, cols, mask, x_stride, r_stride, n_cols, HAS_RESIDUAL: tl.constexpr):
    """x's tile in fp32; with a residual, s = x + residual rounded to x's dtype (stored to s_ptr) instead."""
    x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + rows * n_cols + cols, s, mask=mask)
        x = s.to(tl.float32)
    return x


@launched_kernel(do_not_specialize=["n_rows"])
def _rms_norm_fwd_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, n_rows, n_cols, x_stride, r_stride, eps, offset,
                         CASTING: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                         HAS_OFFSET: tl.constexpr, WHOLE_ROW: tl.constexpr, PARAMS_PER_TILE: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """y (and s, HAS_RESIDUAL); without a weight (HAS_WEIGHT off) w_ptr is never read."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    offset = tl.cast(offset, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:  # BLOCK_R whole rows per tile: x read once
        col_mask = col_ids < n_cols
        if HAS_WEIGHT and not PARAMS_PER_TILE:
            w = tl.load(w_ptr + col_ids, mask=col_mask, other=0.0).to(tl.float32)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            if HAS_WEIGHT and PARAMS_PER_TILE:  # see _norm.CUDA_PARAMS_PER_TILE
                w = tl.load(w_ptr + col_ids, mask=col_mask, other=0.0).to(tl.float32)
            x = _load_input(x_ptr, r_ptr, s_ptr, rows, col_ids, mask, x_stride, r_stride, n_cols, HAS_RESIDUAL)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
            # The offset is added per tile, and only when there is one (no fp32 ``w + offset`` row live across
            # the loop: _norm.CUDA_PARAMS_PER_TILE). No weight: no scale.
            if not HAS_WEIGHT:
                y = _rms_scale(x, rstd[:, None], 1.0, x_ptr, CASTING)
            elif HAS_OFFSET:
                y = _rms_scale(x, rstd[:, None], w + offset, x_ptr, CASTING)
            else:
                y = _rms_scale(x, rstd[:, None], w, x_ptr, CASTING)
            tl.store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # one row (BLOCK_R == 1) in BLOCK_N chunks: pass 1 sums squares (and writes s), pass 2 normalises
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = _load_input(x_ptr, r_ptr, s_ptr, rows, cols, mask, x_stride, r_stride, n_cols, HAS_RESIDUAL)
                acc += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1)[:, None] / n_cols + eps)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                if HAS_RESIDUAL:  # s, as pass 1 rounded and stored it
                    x = tl.load(s_ptr + rows * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                else:
                    x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                y = _scaled(x, rstd, w_ptr, cols, cols < n_cols, offset, x_ptr, CASTING, HAS_WEIGHT)
                tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _times_weight(dy, w_ptr, cols, offset, n_cols, HAS_WEIGHT: tl.constexpr):
    """g = dy * (offset + weight) for a chunk of columns (the looped backward), or dy without a weight."""
    if HAS_WEIGHT:
        g = dy * (tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32) + offset)
    else:
        g = dy
    return g


@launched_kernel(do_not_specialize=["n_rows"])
def _rms_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, ds_ptr, dx_ptr, dw_ptr, n_rows, n_cols, dy_stride, x_stride,
                         ds_stride, eps, offset, CASTING: tl.constexpr, HAS_GRAD_SUM: tl.constexpr,
                         HAS_WEIGHT: tl.constexpr, WHOLE_ROW: tl.constexpr, PREFETCH: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx (module docstring) and this program's share of dW into row ``program_id`` of dw_ptr (programs, n_cols),
    fp32. ds_ptr: the fused op's gradient of s, added to dx (HAS_GRAD_SUM). Without a weight (HAS_WEIGHT off)
    g = dy, and w_ptr and dw_ptr are never touched."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    offset = tl.cast(offset, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    dw_cols = tl.arange(0, BLOCK_N)
    dw_row = dw_ptr + tl.program_id(0).to(tl.int64) * n_cols
    if WHOLE_ROW:
        col_mask = col_ids < n_cols
        if HAS_WEIGHT:
            w = tl.load(w_ptr + col_ids, mask=col_mask, other=0.0).to(tl.float32) + offset
            dw_acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
        if PREFETCH:  # the first tile's loads (see _norm.CUDA_PREFETCH)
            x_next = load_tile(x_ptr, program_start(BLOCK_R) + row_ids, col_ids, n_rows, x_stride, col_mask)
            dy_next = load_tile(dy_ptr, program_start(BLOCK_R) + row_ids, col_ids, n_rows, dy_stride, col_mask)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            if PREFETCH:  # this tile was loaded last iteration; start the next one's loads now
                x = x_next.to(tl.float32)
                dy = dy_next.to(tl.float32)
                x_next = load_tile(x_ptr, rows + grid_stride(BLOCK_R), col_ids, n_rows, x_stride, col_mask)
                dy_next = load_tile(dy_ptr, rows + grid_stride(BLOCK_R), col_ids, n_rows, dy_stride, col_mask)
            else:
                x = load_tile(x_ptr, rows, col_ids, n_rows, x_stride, col_mask).to(tl.float32)
                dy = load_tile(dy_ptr, rows, col_ids, n_rows, dy_stride, col_mask).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1)[:, None] / n_cols + eps)
            n = x * rstd
            if HAS_WEIGHT:
                g = dy * w
            else:
                g = dy
            dx = (g - n * (tl.sum(g * n, axis=1)[:, None] / n_cols)) * rstd
            if HAS_GRAD_SUM:
                dx += tl.load(ds_ptr + rows * ds_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                # masked rows and columns add 0: selected, since a padded row's n is 0 * inf = NaN when eps is 0
                dw_acc += tl.where(mask, dy * _rms_weight_factor(n, x_ptr, CASTING), 0.0)
        if HAS_WEIGHT:
            tl.store(dw_row + dw_cols, tl.sum(dw_acc, axis=0), mask=dw_cols < n_cols)
    else:  # one row in chunks: pass 1 rstd, pass 2 sum(g * x), pass 3 dx and dW (dw_ptr zero-initialised)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            sq = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            gx = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                sq += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=1)[:, None] / n_cols + eps)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                gx += _times_weight(dy, w_ptr, cols, offset, n_cols, HAS_WEIGHT) * x
            mean_gn = tl.sum(gx, axis=1)[:, None] * rstd / n_cols  # mean(g * n) = rstd * sum(g * x) / n_cols
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                n = x * rstd
                dx = (_times_weight(dy, w_ptr, cols, offset, n_cols, HAS_WEIGHT) - n * mean_gn) * rstd
                if HAS_GRAD_SUM:
                    dx += tl.load(ds_ptr + rows * ds_stride + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + rows * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                if HAS_WEIGHT:
                    dw_mask = c + dw_cols < n_cols
                    partial = tl.load(dw_row + c + dw_cols, mask=dw_mask, other=0.0)
                    partial += tl.sum(dy * _rms_weight_factor(n, x_ptr, CASTING), axis=0)
                    tl.store(dw_row + c + dw_cols, partial, mask=dw_mask)


def rms_norm_output_dtype(x_dtype: torch.dtype, w_dtype: Optional[torch.dtype], casting_mode: str) -> torch.dtype:
    """llama: ``weight * h.to(x.dtype)`` promotes (fp32 weight, bf16 x -> fp32); gemma, none, or no weight
    (``w_dtype`` None): x's dtype."""
    if casting_mode == "llama" and w_dtype is not None:
        return torch.promote_types(x_dtype, w_dtype)
    return x_dtype


def weight_dtype(weight: Optional[torch.Tensor]) -> Optional[torch.dtype]:
    return None if weight is None else weight.dtype


def check_rms_norm_inputs(x: torch.Tensor, weight: Optional[torch.Tensor], eps, offset, casting_mode: str,
                          residual: Optional[torch.Tensor] = None) -> None:
    check_norm_input("x", x)
    if residual is not None:
        check_same_layout("residual", residual, "x", x)
    if weight is not None:
        check_norm_param("weight", weight, x)
    check_eps(eps)
    if isinstance(offset, bool) or not isinstance(offset, (int, float, torch.SymFloat, torch.SymInt)):
        raise TypeError(f"offset must be a float, got {type(offset).__name__}")
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {', '.join(map(repr, CASTING_MODES))}, got {casting_mode!r}")


def _forward(x, residual, weight, eps, offset, casting_mode):
    y = new_like(x, rms_norm_output_dtype(x.dtype, weight_dtype(weight), casting_mode))
    s = new_like(x) if residual is not None else None
    if x.numel() == 0:
        return y, s
    require_launchable(x.device)
    n_cols = x.shape[-1]
    x2, weight = as_rows(x, n_cols), param_row(weight)
    r2 = as_rows(residual, n_cols) if residual is not None else x2
    n_rows = x2.shape[0]
    multiplier = FORWARD_MEMORY_MULTIPLIER if residual is None else FUSED_FORWARD_MEMORY_MULTIPLIER
    tiles = plan_rows(x.device.type, n_rows, n_cols, multiplier, persistent=False,
                      cuda_wide_rows=CUDA_FORWARD_WIDE_ROWS)
    _rms_norm_fwd_kernel[(tiles.grid,)](
        x2, r2, weight if weight is not None else x2, y, s if s is not None else y, n_rows, n_cols, x2.stride(0),
        r2.stride(0), float(eps), float(offset), CASTING=CASTING_MODES[casting_mode],
        HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_OFFSET=offset != 0,
        WHOLE_ROW=tiles.whole_row, PARAMS_PER_TILE=tiles.params_per_tile, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, **tiles.options
    )
    return y, s


def launch_rms_norm_backward(grad_out, x, weight, eps, offset, casting_mode):
    """``rms_norm_backward`` without its input checks, for the autograd formula's plain eager calls (the forward
    checked x and the weight, autograd made grad_out to the output's shape, dtype and device)."""
    return _backward(grad_out, x, weight, None, eps, offset, casting_mode)


def launch_fused_add_rms_norm_backward(grad_normed, grad_sum, s, weight, eps, offset, casting_mode):
    """``fused_add_rms_norm_backward`` without its input checks, likewise."""
    return _backward(grad_normed, s, weight, grad_sum, eps, offset, casting_mode)


def _backward(dy, x, weight, ds, eps, offset, casting_mode):
    """(dx, dW); dW is None without a weight."""
    dx = new_like(x)
    n_cols = x.shape[-1]
    if x.numel() == 0:  # no rows: the weight gradient is a sum over nothing
        return dx, None if weight is None else torch.zeros(weight.shape, dtype=weight.dtype, device=x.device)
    require_launchable(x.device)
    x2, dy2, weight = as_rows(x, n_cols), as_rows(dy, n_cols), param_row(weight)
    ds2 = as_rows(ds, n_cols) if ds is not None else x2
    n_rows = x2.shape[0]
    multiplier = BACKWARD_MEMORY_MULTIPLIER if ds is None else FUSED_BACKWARD_MEMORY_MULTIPLIER
    tiles = plan_rows(x.device.type, n_rows, n_cols, multiplier, persistent=True)
    if weight is not None:
        alloc = torch.empty if tiles.whole_row else torch.zeros  # the looped path accumulates into its row
        dw_partial = alloc((tiles.grid, n_cols), dtype=torch.float32, device=x.device)
    _rms_norm_bwd_kernel[(tiles.grid,)](
        dy2, x2, weight if weight is not None else x2, ds2, dx, dw_partial if weight is not None else dx, n_rows,
        n_cols, dy2.stride(0), x2.stride(0), ds2.stride(0), float(eps), float(offset),
        CASTING=CASTING_MODES[casting_mode], HAS_GRAD_SUM=ds is not None, HAS_WEIGHT=weight is not None,
        WHOLE_ROW=tiles.whole_row, PREFETCH=tiles.prefetch, BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols,
        **tiles.options
    )
    return dx, None if weight is None else sum_partials(dw_partial[None], (weight.dtype,))[0]


def rms_norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-6, offset: float = 0.0,
                     casting_mode: str = "llama") -> torch.Tensor:
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode)
    return _forward(x, None, weight, eps, offset, casting_mode)[0]


def fused_add_rms_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                               eps: float = 1e-6, offset: float = 0.0,
                               casting_mode: str = "llama") -> Tuple[torch.Tensor, torch.Tensor]:
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode, residual)
    return _forward(x, residual, weight, eps, offset, casting_mode)


def check_rms_norm_grad(name: str, grad: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                        casting_mode: str) -> None:
    check_grad(name, grad, x.shape, rms_norm_output_dtype(x.dtype, weight_dtype(weight), casting_mode), x.device)


def rms_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                      offset: float, casting_mode: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(grad_x, grad_weight); grad_weight is None without a weight."""
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode)
    check_rms_norm_grad("grad_out", grad_out, x, weight, casting_mode)
    return _backward(grad_out, x, weight, None, eps, offset, casting_mode)


def check_fused_add_rms_norm_backward_inputs(grad_normed, grad_sum, s, weight, eps, offset, casting_mode) -> None:
    check_rms_norm_inputs(s, weight, eps, offset, casting_mode)
    check_rms_norm_grad("grad_normed", grad_normed, s, weight, casting_mode)
    if grad_sum is not None:
        check_grad("grad_sum", grad_sum, s.shape, s.dtype, s.device)


def fused_add_rms_norm_backward(grad_normed: torch.Tensor, grad_sum: Optional[torch.Tensor], s: torch.Tensor,
                                weight: Optional[torch.Tensor], eps: float, offset: float,
                                casting_mode: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(gradient of s = the gradient of x and of residual, grad_weight); s is the forward's sum output;
    grad_weight is None without a weight."""
    check_fused_add_rms_norm_backward_inputs(grad_normed, grad_sum, s, weight, eps, offset, casting_mode)
    return _backward(grad_normed, s, weight, grad_sum, eps, offset, casting_mode)
