"""PolyNorm over the last dim (PolyCom, Zhuo et al.; Liger-Kernel's ``LigerPolyNorm``), statistics in fp32:

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,   norm(u) = u * r(u),  r(u) = rsqrt(mean(u^2) + eps)

with weight (3,) = (w0, w1, w2) and a one-element bias, rounded once, to x's dtype.

Backward, per row of n columns, with r_p = r(x^p) and S_p = sum(dy * x^p) (p = 1, 2, 3):
    dx = sum_p w_p * r_p * p * x^(p-1) * (dy - r_p^2 * S_p / n * x^p)
    dw_(3-p) = sum over rows of r_p * S_p,   db = sum of dy
The r_p are recomputed from x (the backward reads x anyway); dw and db go through per-program fp32 partials, one
(programs, 4) row each, summed on the host in a fixed order (deterministic, no atomics).

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile):
- forward: x as loaded, x in fp32 (x^2 and x^3 are formed from it one at a time: bishengir's UB plan for this
  kernel reuses their buffers; the Ascend check measured 12 bytes per element at fp32), y before the cast
  -> 4.0 (Ascend910B3: 192 KiB * 0.8 / (4 * 4 B) = 9830 -> 8192 columns, so hidden 8192 is read once);
- backward: x and dy in fp32, x^2, x^3, the products dy * x^p being summed, the terms of dx -> 8.0
  (4915 -> 4096 columns; 8192 fits only with multi-buffer off).
Wider rows loop (``_norm.plan_rows``): 2 passes forward (the three sums of squares, then y), 2 backward (the six
row sums, then dx); the row sums are reduced per chunk, so no tile-sized accumulator lives across a pass.
CUDA-only switches (``HORNER``, ``PREFETCH``; the NPU and the CPU emulation run with them off, so the analysis above
is theirs): the forward's y from x alone by Horner's rule, ((w0 r3 x + w1 r2) x + w2 r1) x + b, so only x
lives across the reduction (fewer values than above); the backward's prefetch of the next tile's x and dy (two
more tiles as stored, as rms_norm's).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ._norm import CudaWideRows, as_rows, check_eps, check_grad, check_norm_input, load_tile, plan_rows
from ._triton import check_float_tensor, grid_stride, launched_kernel, new_like, program_start, require_launchable

FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 8.0
N_PARTIALS = 4  # dw0, dw1, dw2, db per program
# CUDA forward, whole rows of 4096+ / 8192+ / 16384 columns: (rows per program, warps). 4096 and 16384 keep what
# the shared backward table gave the forward before (1 row; 4 and 16 warps). 8192: 16 warps held x, x^2 and x^3
# in fp32 across three separate row reductions (H200, bf16, 16384x8192: 0.41 of copy, Liger 0.62); 8 warps is
# rms_norm's measured best there (0.95-0.98 of copy). Round 19's probe (H100, this kernel with Horner's y): 8 and
# 16 warps equal (183 us, 1.00 of copy), 4 warps 208 us, 2 or 4 rows per program no better.
CUDA_FORWARD_WIDE_ROWS = (CudaWideRows(min_cols=4096, rows=1, warps=4), CudaWideRows(min_cols=8192, rows=1, warps=8),
                          CudaWideRows(min_cols=16384, rows=1, warps=16))
# CUDA-only kernel switch (module docstring): Horner's y in the forward. Measured on an H100 (round 19's probe,
# 16384x8192 bf16, 8 warps): forward kernel 183 us (1.00 of copy) with it, 198-203 us without. The row sums stay
# separate tl.sum calls: one multi-operand tl.reduce of them measured equal forward and slower backward (347 us
# against 314 us with the prefetch).
CUDA_HORNER = True


@triton.jit
def _rstd(sum_sq, n_cols, eps):
    return 1.0 / tl.sqrt(sum_sq / n_cols + eps)


@triton.jit
def _poly_dx(x, x2, x3, dy, c3, k3, c2, k2, c1, k1):
    """dx of the module docstring with c_p = p * w_p * r_p and k_p = r_p^2 * S_p / n."""
    return c3 * x2 * (dy - k3 * x3) + c2 * x * (dy - k2 * x2) + c1 * (dy - k1 * x)


@launched_kernel(do_not_specialize=["n_rows"])
def _poly_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, x_stride, eps, WHOLE_ROW: tl.constexpr,
                          HORNER: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    if WHOLE_ROW:  # BLOCK_R whole rows per tile: x read once
        col_mask = col_ids < n_cols
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            x3 = x2 * x
            q1 = tl.sum(x2, axis=1)
            q2 = tl.sum(x2 * x2, axis=1)
            q3 = tl.sum(x3 * x3, axis=1)
            s3 = w0 * _rstd(q3[:, None], n_cols, eps)
            s2 = w1 * _rstd(q2[:, None], n_cols, eps)
            s1 = w2 * _rstd(q1[:, None], n_cols, eps)
            if HORNER:  # from x alone: x^2 and x^3 need not live across the reduction
                y = ((s3 * x + s2) * x + s1) * x + b
            else:
                y = x3 * s3 + x2 * s2 + x * s1 + b
            tl.store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # one row (BLOCK_R == 1) in chunks: the sums of squares, then y
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            q1 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            q2 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            q3 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                x = tl.load(x_ptr + rows * x_stride + cols, mask=row_ok & (cols < n_cols), other=0.0).to(tl.float32)
                x2 = x * x
                x3 = x2 * x
                q1 += tl.sum(x2, axis=1)[:, None]
                q2 += tl.sum(x2 * x2, axis=1)[:, None]
                q3 += tl.sum(x3 * x3, axis=1)[:, None]
            s3 = w0 * _rstd(q3, n_cols, eps)
            s2 = w1 * _rstd(q2, n_cols, eps)
            s1 = w2 * _rstd(q1, n_cols, eps)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                x2 = x * x
                y = x2 * x * s3 + x2 * s2 + x * s1 + b
                tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows"])
def _poly_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, partial_ptr, n_rows, n_cols, dy_stride, x_stride, eps,
                          WHOLE_ROW: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """dx (module docstring), and this program's shares of dw0, dw1, dw2, db into row ``program_id`` of
    partial_ptr (programs, 4), fp32."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    dw0 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    dw1 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    dw2 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    db = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    col_mask = col_ids < n_cols
    if WHOLE_ROW and PREFETCH:  # the first tile's loads (see _norm.CUDA_PREFETCH)
        x_next = load_tile(x_ptr, program_start(BLOCK_R) + row_ids, col_ids, n_rows, x_stride, col_mask)
        dy_next = load_tile(dy_ptr, program_start(BLOCK_R) + row_ids, col_ids, n_rows, dy_stride, col_mask)
    for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
        rows = start + row_ids
        row_ok = rows < n_rows
        if WHOLE_ROW:
            mask = row_ok & col_mask
            if PREFETCH:  # this tile was loaded last iteration; start the next one's loads now
                x = x_next.to(tl.float32)
                dy = dy_next.to(tl.float32)
                x_next = load_tile(x_ptr, rows + grid_stride(BLOCK_R), col_ids, n_rows, x_stride, col_mask)
                dy_next = load_tile(dy_ptr, rows + grid_stride(BLOCK_R), col_ids, n_rows, dy_stride, col_mask)
            else:
                x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            x3 = x2 * x
            q1 = tl.sum(x2, axis=1)[:, None]
            q2 = tl.sum(x2 * x2, axis=1)[:, None]
            q3 = tl.sum(x3 * x3, axis=1)[:, None]
            t3 = tl.sum(dy * x3, axis=1)[:, None]
            t2 = tl.sum(dy * x2, axis=1)[:, None]
            t1 = tl.sum(dy * x, axis=1)[:, None]
            tb = tl.sum(dy, axis=1)[:, None]
            r3 = _rstd(q3, n_cols, eps)
            r2 = _rstd(q2, n_cols, eps)
            r1 = _rstd(q1, n_cols, eps)
            dx = _poly_dx(x, x2, x3, dy, w0 * r3 * 3.0, r3 * r3 * t3 / n_cols, w1 * r2 * 2.0, r2 * r2 * t2 / n_cols,
                          w2 * r1, r1 * r1 * t1 / n_cols)
            tl.store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        else:  # one row in chunks: the six row sums, then dx
            q1 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            q2 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            q3 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            t1 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            t2 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            t3 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            tb = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                x2 = x * x
                x3 = x2 * x
                q1 += tl.sum(x2, axis=1)[:, None]
                q2 += tl.sum(x2 * x2, axis=1)[:, None]
                q3 += tl.sum(x3 * x3, axis=1)[:, None]
                t1 += tl.sum(dy * x, axis=1)[:, None]
                t2 += tl.sum(dy * x2, axis=1)[:, None]
                t3 += tl.sum(dy * x3, axis=1)[:, None]
                tb += tl.sum(dy, axis=1)[:, None]
            r3 = _rstd(q3, n_cols, eps)
            r2 = _rstd(q2, n_cols, eps)
            r1 = _rstd(q1, n_cols, eps)
            c3, k3 = w0 * r3 * 3.0, r3 * r3 * t3 / n_cols
            c2, k2 = w1 * r2 * 2.0, r2 * r2 * t2 / n_cols
            c1, k1 = w2 * r1, r1 * r1 * t1 / n_cols
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
                x2 = x * x
                dx = _poly_dx(x, x2, x2 * x, dy, c3, k3, c2, k2, c1, k1)
                tl.store(dx_ptr + rows * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # rows past n_rows hold zeros; with eps == 0 their r_p is inf and r_p * S_p NaN, so they are masked out
        dw0 += tl.where(row_ok, r3 * t3, 0.0)
        dw1 += tl.where(row_ok, r2 * t2, 0.0)
        dw2 += tl.where(row_ok, r1 * t1, 0.0)
        db += tb
    row = partial_ptr + tl.program_id(0).to(tl.int64) * 4
    tl.store(row, tl.sum(tl.sum(dw0, axis=1), axis=0))
    tl.store(row + 1, tl.sum(tl.sum(dw1, axis=1), axis=0))
    tl.store(row + 2, tl.sum(tl.sum(dw2, axis=1), axis=0))
    tl.store(row + 3, tl.sum(tl.sum(db, axis=1), axis=0))


def check_poly_norm_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps) -> None:
    check_norm_input("x", x)
    check_float_tensor("weight", weight)
    if tuple(weight.shape) != (3,):
        raise ValueError(f"weight must have shape (3,) (w0, w1, w2 of x^3, x^2, x), got {tuple(weight.shape)}")
    check_float_tensor("bias", bias)
    if bias.dim() > 1 or bias.numel() != 1:
        raise ValueError(f"bias must be a one-element tensor of shape (1,) or (), got shape {tuple(bias.shape)}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param.device != x.device:
            raise RuntimeError(f"{name} must be on the device of x ({x.device}), got {param.device}")
    check_eps(eps)


def poly_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    check_poly_norm_inputs(x, weight, bias, eps)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    n_cols = x.shape[-1]
    x2 = as_rows(x, n_cols)
    n_rows = x2.shape[0]
    tiles = plan_rows(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_FORWARD_WIDE_ROWS)
    _poly_norm_fwd_kernel[(tiles.grid,)](
        x2, weight.contiguous(), bias.contiguous(), y, n_rows, n_cols, x2.stride(0), float(eps),
        WHOLE_ROW=tiles.whole_row, HORNER=x.device.type == "cuda" and CUDA_HORNER, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, **tiles.options
    )
    return y


def poly_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight, grad_bias), each in its input's dtype and shape."""
    check_poly_norm_inputs(x, weight, bias, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    return launch_poly_norm_backward(grad_out, x, weight, bias, eps)


def launch_poly_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                              eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``poly_norm_backward`` without its input checks, for the autograd formula's plain eager calls."""
    dx = new_like(x)
    if x.numel() == 0:  # sums over nothing
        return (dx, torch.zeros(3, dtype=weight.dtype, device=x.device),
                torch.zeros(bias.shape, dtype=bias.dtype, device=x.device))
    require_launchable(x.device)
    n_cols = x.shape[-1]
    x2, dy2 = as_rows(x, n_cols), as_rows(grad_out, n_cols)
    n_rows = x2.shape[0]
    tiles = plan_rows(x.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    partials = torch.empty((tiles.grid, N_PARTIALS), dtype=torch.float32, device=x.device)
    _poly_norm_bwd_kernel[(tiles.grid,)](
        dy2, x2, weight.contiguous(), dx, partials, n_rows, n_cols, dy2.stride(0), x2.stride(0), float(eps),
        WHOLE_ROW=tiles.whole_row, PREFETCH=tiles.prefetch, BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols,
        **tiles.options
    )
    grad_w = partials[:, :3].sum(0).to(weight.dtype)  # two reductions: two tensors, never views of one
    return dx, grad_w, partials[:, 3].sum().reshape(bias.shape).to(bias.dtype)
