"""LayerNorm over the last dim: ``F.layer_norm(x, x.shape[-1:], weight, bias, eps)``, statistics in fp32.

    mean = sum(x) / N,  var = sum((x - mean)^2) / N  (centred: no cancellation when |mean| >> std),
    xhat = (x - mean) * rsqrt(var + eps),  y = xhat * weight + bias   (weight 1 / bias 0 when absent),
    rounded once, to x's dtype.

Backward, with g = dy * weight:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dW = sum over rows of dy * xhat,  dB = sum of dy
mean and rstd are recomputed from x (the backward reads x anyway); dW and dB go through per-program fp32
partials (see ``_norm.py``); dy and x are only read.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile; weight and bias rows are shared by the tile's rows):
- forward: x as loaded, x in fp32, x - mean, its square, y before the cast -> 5.0
  (Ascend910B3: 192 KiB * 0.8 / (5 * 4 B) = 7864 -> 4096 columns);
- backward: x, dy, xhat, g, dx, the dW and dB accumulators, + weight -> 8.0 (4915 -> 4096 columns).
Wider rows loop (``_norm.plan_rows``): 3 passes forward (mean, variance, normalise), 4 backward. The CUDA-only
backward prefetch (``PREFETCH``) holds two more tiles as stored; the NPU never prefetches.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._norm import (CudaWideRows, as_rows, check_eps, check_grad, check_norm_input, check_norm_param, load_param,
                    load_tile, param_row, plan_rows, sum_partials)
from ._triton import grid_stride, launched_kernel, new_like, program_start, require_launchable

FORWARD_MEMORY_MULTIPLIER = 5.0
BACKWARD_MEMORY_MULTIPLIER = 8.0
# CUDA forward at 4096+ columns: two rows per program on 4 warps (H200, bf16, weight and bias per tile: 135 us
# at 16384x8192 = 0.94 of copy and 35 us at 8192x4096, against 185 us / 42 us for one row on 16 / 8 warps).
CUDA_FORWARD_WIDE_ROWS = (CudaWideRows(min_cols=4096, rows=2, warps=4),)


@triton.jit
def _row_mean(x_ptr, rows, row_ok, col_ids, x_stride, n_cols, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_R, 1) mean of each row, walking it in BLOCK_N chunks."""
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for c in tl.range(0, n_cols, BLOCK_N):
        cols = c + col_ids
        acc += tl.load(x_ptr + rows * x_stride + cols, mask=row_ok & (cols < n_cols), other=0.0).to(tl.float32)
    return tl.sum(acc, axis=1)[:, None] / n_cols


@triton.jit
def _row_rstd(x_ptr, mean, rows, row_ok, col_ids, x_stride, n_cols, eps, BLOCK_R: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """(BLOCK_R, 1) rsqrt(variance + eps) of each row about ``mean``, walking it in BLOCK_N chunks."""
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for c in tl.range(0, n_cols, BLOCK_N):
        cols = c + col_ids
        mask = row_ok & (cols < n_cols)
        x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        xc = tl.where(mask, x - mean, 0.0)
        acc += xc * xc
    return 1.0 / tl.sqrt(tl.sum(acc, axis=1)[:, None] / n_cols + eps)


@launched_kernel(do_not_specialize=["n_rows"])
def _layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, x_stride, eps, HAS_WEIGHT: tl.constexpr,
                           HAS_BIAS: tl.constexpr, WHOLE_ROW: tl.constexpr, PARAMS_PER_TILE: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:  # BLOCK_R whole rows per tile: x read once
        col_mask = col_ids < n_cols
        if not PARAMS_PER_TILE:
            w = load_param(w_ptr, col_ids, col_mask, 1.0, HAS_WEIGHT)
            b = load_param(b_ptr, col_ids, col_mask, 0.0, HAS_BIAS)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            if PARAMS_PER_TILE:  # see _norm.CUDA_PARAMS_PER_TILE
                w = load_param(w_ptr, col_ids, col_mask, 1.0, HAS_WEIGHT)
                b = load_param(b_ptr, col_ids, col_mask, 0.0, HAS_BIAS)
            x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            mean = tl.sum(x, axis=1)[:, None] / n_cols
            xc = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1)[:, None] / n_cols + eps)
            y = xc * rstd * w + b
            tl.store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # one row (BLOCK_R == 1) in chunks: mean, variance, then normalise
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            mean = _row_mean(x_ptr, rows, row_ok, col_ids, x_stride, n_cols, BLOCK_R, BLOCK_N)
            rstd = _row_rstd(x_ptr, mean, rows, row_ok, col_ids, x_stride, n_cols, eps, BLOCK_R, BLOCK_N)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                w = load_param(w_ptr, cols, cols < n_cols, 1.0, HAS_WEIGHT)
                b = load_param(b_ptr, cols, cols < n_cols, 0.0, HAS_BIAS)
                y = (x - mean) * rstd * w + b
                tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows"])
def _layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, n_cols, dy_stride, x_stride, eps,
                           HAS_WEIGHT: tl.constexpr, WHOLE_ROW: tl.constexpr, PREFETCH: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx (module docstring), and this program's shares of dW and dB into row ``program_id`` of dw_ptr and
    db_ptr (programs, n_cols), fp32."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    p_cols = tl.arange(0, BLOCK_N)
    dw_row = dw_ptr + tl.program_id(0).to(tl.int64) * n_cols
    db_row = db_ptr + tl.program_id(0).to(tl.int64) * n_cols
    if WHOLE_ROW:
        col_mask = col_ids < n_cols
        w = load_param(w_ptr, col_ids, col_mask, 1.0, HAS_WEIGHT)
        dw_acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
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
            mean = tl.sum(x, axis=1)[:, None] / n_cols
            xc = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1)[:, None] / n_cols + eps)
            xhat = xc * rstd
            g = dy * w
            mean_g = tl.sum(g, axis=1)[:, None] / n_cols
            mean_gx = tl.sum(g * xhat, axis=1)[:, None] / n_cols
            dx = (g - mean_g - xhat * mean_gx) * rstd
            tl.store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += tl.where(mask, dy * xhat, 0.0)  # a padded row's xhat is 0 * inf = NaN when eps is 0
            db_acc += dy
        tl.store(dw_row + p_cols, tl.sum(dw_acc, axis=0), mask=p_cols < n_cols)
        tl.store(db_row + p_cols, tl.sum(db_acc, axis=0), mask=p_cols < n_cols)
    else:  # one row in chunks: mean, rstd, the two means of g, then dx, dW, dB (partials zero-initialised)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            mean = _row_mean(x_ptr, rows, row_ok, col_ids, x_stride, n_cols, BLOCK_R, BLOCK_N)
            rstd = _row_rstd(x_ptr, mean, rows, row_ok, col_ids, x_stride, n_cols, eps, BLOCK_R, BLOCK_N)
            g_acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            gx_acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                g = dy * load_param(w_ptr, cols, cols < n_cols, 1.0, HAS_WEIGHT)
                g_acc += g
                gx_acc += g * tl.where(mask, x - mean, 0.0) * rstd
            mean_g = tl.sum(g_acc, axis=1)[:, None] / n_cols
            mean_gx = tl.sum(gx_acc, axis=1)[:, None] / n_cols
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                xhat = tl.where(mask, x - mean, 0.0) * rstd
                g = dy * load_param(w_ptr, cols, cols < n_cols, 1.0, HAS_WEIGHT)
                dx = (g - mean_g - xhat * mean_gx) * rstd
                tl.store(dx_ptr + rows * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                p_mask = c + p_cols < n_cols
                dw = tl.load(dw_row + c + p_cols, mask=p_mask, other=0.0) + tl.sum(dy * xhat, axis=0)
                tl.store(dw_row + c + p_cols, dw, mask=p_mask)
                db = tl.load(db_row + c + p_cols, mask=p_mask, other=0.0) + tl.sum(dy, axis=0)
                tl.store(db_row + c + p_cols, db, mask=p_mask)


def check_layer_norm_inputs(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                            eps) -> None:
    check_norm_input("x", x)
    if weight is not None:
        check_norm_param("weight", weight, x)
    if bias is not None:
        check_norm_param("bias", bias, x)
    check_eps(eps)


def layer_norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                       eps: float = 1e-5) -> torch.Tensor:
    check_layer_norm_inputs(x, weight, bias, eps)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    n_cols = x.shape[-1]
    x2, weight, bias = as_rows(x, n_cols), param_row(weight), param_row(bias)
    n_rows = x2.shape[0]
    tiles = plan_rows(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_FORWARD_WIDE_ROWS)
    _layer_norm_fwd_kernel[(tiles.grid,)](
        x2, weight if weight is not None else x2, bias if bias is not None else x2, y, n_rows, n_cols,
        x2.stride(0), float(eps), HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        WHOLE_ROW=tiles.whole_row, PARAMS_PER_TILE=tiles.params_per_tile, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, **tiles.options
    )
    return y


def layer_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                        bias: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight, grad_bias); the parameter gradients are computed even for an absent parameter
    (the autograd formula drops them), in the parameter's dtype, or x's when it is absent."""
    check_layer_norm_inputs(x, weight, bias, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    return launch_layer_norm_backward(grad_out, x, weight, bias, eps)


def launch_layer_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                               bias: Optional[torch.Tensor], eps: float
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm_backward`` without its input checks, for the autograd formula's plain eager calls (the forward
    checked x and the parameters, autograd made grad_out to the output's shape, dtype and device)."""
    n_cols = x.shape[-1]
    dx = new_like(x)
    w_dtype = weight.dtype if weight is not None else x.dtype
    b_dtype = bias.dtype if bias is not None else x.dtype
    if x.numel() == 0:  # no rows: parameter gradients are sums over nothing
        return (dx, torch.zeros(n_cols, dtype=w_dtype, device=x.device),
                torch.zeros(n_cols, dtype=b_dtype, device=x.device))
    require_launchable(x.device)
    x2, dy2, weight = as_rows(x, n_cols), as_rows(grad_out, n_cols), param_row(weight)
    n_rows = x2.shape[0]
    tiles = plan_rows(x.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    alloc = torch.empty if tiles.whole_row else torch.zeros  # the looped path accumulates into its row
    partials = alloc((2, tiles.grid, n_cols), dtype=torch.float32, device=x.device)
    _layer_norm_bwd_kernel[(tiles.grid,)](
        dy2, x2, weight if weight is not None else x2, dx, partials[0], partials[1], n_rows, n_cols, dy2.stride(0),
        x2.stride(0), float(eps), HAS_WEIGHT=weight is not None, WHOLE_ROW=tiles.whole_row, PREFETCH=tiles.prefetch,
        BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols, **tiles.options
    )
    return (dx, *sum_partials(partials, (w_dtype, b_dtype)))
