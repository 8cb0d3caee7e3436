"""Sparsemax (Martins & Astudillo, 2016) along any dim: the Euclidean projection of each row onto the simplex,

    y = max(x - tau, 0)   with tau such that sum(y) = 1,

fp32 math, the output in x's dtype. Backward, from the saved output y (S = the support, y > 0):

    dx = dy - mean_S(dy) on S,   0 elsewhere.

How tau is found: without a sort. Sorting a row in Triton is not portable (triton-ascend has no general sort,
and a tile-wide sort would not serve rows wider than one UB tile), and sorting on the host as Liger-Kernel does
costs a full extra read and write of the input plus torch's sort. Instead, with u = x - max(x) (so u <= 0 and
tau_u = tau - max lies in [-1, 0): the largest element alone sums to 1 at tau = max - 1), every pass is a plain
row reduction:
1. bisection: f(t) = sum(max(u - t, 0)) is continuous and decreasing, f(-1) >= 1 > f(0) = 0; ``BISECTION_STEPS``
   halvings of [-1, 0] (24: 2^-24, the fp32 resolution of values of order 1) leave lo within 2^-24 of tau_u;
2. the exact threshold of the support that bound gives, tau_u = (sum_{u > lo} u - 1) / |{u > lo}|, taken
   ``EXACT_STEPS`` (2) times (each from the previous one: Michelot's fixed point, which is Newton's method on f).
   For ANY set of the k largest values, (sum - 1) / k <= tau (tau is the maximum of those over k), so the step
   never overshoots; it is exact once no value lies between its start and tau, which after the bisection can
   only be values within fp32 rounding of tau.
Working with u rather than x keeps the support sum well conditioned (its terms lie in [-1, 0]; summing x itself
would lose the digits of a row offset by a large constant).

Non-finite inputs: a NaN or +inf anywhere in a row makes the row NaN (the projection is undefined), as does a row
of -inf only (as softmax gives NaN for it); -inf entries of a row with a finite entry get 0 (outside every
support). Checked explicitly per row, never through a ``maximum`` clamp (a GPU's maximum drops NaN). In the
backward a NaN output is outside the support, so a NaN row's gradient is 0, as autograd of the sort-based formula
gives it; a NaN in dy reaches the support's gradient (through the mean), never the rest of the row.

Layout: x is addressed as (pre, n, post) with n the reduced dim (``x.reshape``: a view for every layout that
allows one, strided and transposed ones included), so any dim works without moving it to the end; rows are the
(pre, post) pairs, split from the row index inside the kernel only when post > 1 (``SPLIT_ROWS``). The output and
dx are contiguous tensors of x's shape. Kernel paths (``_norm.plan_rows``): whole rows, several narrow rows per
tile, every pass in the UB; rows wider than one tile loop in chunks, one read of the row per pass: 1 (max, checks)
+ ``BISECTION_STEPS`` + ``EXACT_STEPS`` + 1 (the output) forward, 2 backward.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile, dtype_size 4):
- forward: x as loaded, u, and per step the comparison, u - t and the selected value, y before the cast -> 6.0
  (Ascend910B3: 192 KiB * 0.8 / (6 * 4 B) = 6553 -> 4096 columns whole; wider rows loop);
- backward: y and dy (as loaded and in fp32), the support mask, the selected dy, dx -> 6.0 (4096 columns).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._norm import CudaWideRows, check_grad, plan_rows
from ._triton import check_float_tensor, grid_stride, launched_kernel, new_like, program_start, require_launchable

FORWARD_MEMORY_MULTIPLIER = 6.0
BACKWARD_MEMORY_MULTIPLIER = 6.0
BISECTION_STEPS: tl.constexpr = tl.constexpr(24)
EXACT_STEPS: tl.constexpr = tl.constexpr(2)
# CUDA whole rows of 8192+ columns: one row per program on 8 warps (softmax's choice; not measured for sparsemax).
CUDA_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=8),)



@triton.jit
def _row_offsets(rows, post, pre_stride, post_stride, SPLIT_ROWS: tl.constexpr):
    """Offsets of the first elements of ``rows`` (int64) in a (pre, n, post) tensor, row = p * post + q."""
    if SPLIT_ROWS:
        p = rows // post
        offsets = p * pre_stride + (rows - p * post) * post_stride
    else:
        offsets = rows * pre_stride
    return offsets


@triton.jit
def _finite_row(n_bad, m):
    """Rows with a sparsemax: no NaN or +inf (``n_bad`` counts them) and a value above -inf (m = the max)."""
    return (n_bad == 0.0) & (m > float("-inf"))


@triton.jit
def _not_finite_below_inf(x):
    """1.0 where x is NaN or +inf (the comparison is false for both), 0.0 elsewhere (-inf and masked lanes)."""
    return tl.where(x < float("inf"), 0.0, 1.0)


@triton.jit
def _project(u, tau, ok):
    """max(u - tau, 0) without a maximum (it would drop NaN), NaN for the rows that have no sparsemax."""
    d = u - tau
    return tl.where(ok, tl.where(d > 0.0, d, 0.0), float("nan"))


@launched_kernel(do_not_specialize=["n_rows", "post", "x_pre_stride", "x_post_stride", "y_pre_stride"])
def _sparsemax_fwd_kernel(x_ptr, y_ptr, n_rows, n_cols, post, x_pre_stride, x_col_stride, x_post_stride,
                          y_pre_stride, y_col_stride, SPLIT_ROWS: tl.constexpr, WHOLE_ROW: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """x and y are (pre, n, post) (y contiguous: its post stride is 1); rows are the (pre, post) pairs."""
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:  # every pass on the tile in the UB / registers: x read once, y written once
        col_mask = col_ids < n_cols
        x_cols = col_ids.to(tl.int64) * x_col_stride
        y_cols = col_ids.to(tl.int64) * y_col_stride
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + _row_offsets(rows, post, x_pre_stride, x_post_stride, SPLIT_ROWS) + x_cols,
                        mask=mask, other=float("-inf")).to(tl.float32)
            m = tl.max(x, axis=1)[:, None]
            ok = _finite_row(tl.sum(_not_finite_below_inf(x), axis=1)[:, None], m)
            u = x - m
            lo = tl.zeros((BLOCK_R, 1), dtype=tl.float32) - 1.0
            hi = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            for _ in tl.range(0, BISECTION_STEPS):
                mid = (lo + hi) * 0.5
                above = tl.sum(tl.where(u > mid, u - mid, 0.0), axis=1)[:, None] >= 1.0
                lo = tl.where(above, mid, lo)
                hi = tl.where(above, hi, mid)
            tau = lo
            for _ in tl.range(0, EXACT_STEPS):
                support = u > tau
                count = tl.sum(tl.where(support, 1.0, 0.0), axis=1)[:, None]
                tau = (tl.sum(tl.where(support, u, 0.0), axis=1)[:, None] - 1.0) / tl.maximum(count, 1.0)
            y = _project(u, tau, ok)
            tl.store(y_ptr + _row_offsets(rows, post, y_pre_stride, 1, SPLIT_ROWS) + y_cols,
                     y.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # one row in BLOCK_N chunks, one read of the row per pass (module docstring)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            x_row = x_ptr + _row_offsets(rows, post, x_pre_stride, x_post_stride, SPLIT_ROWS)
            m = tl.zeros((BLOCK_R, 1), dtype=tl.float32) + float("-inf")
            n_bad = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                x = tl.load(x_row + cols.to(tl.int64) * x_col_stride, mask=row_ok & (cols < n_cols),
                            other=float("-inf")).to(tl.float32)
                m = tl.maximum(m, tl.max(x, axis=1)[:, None])  # may drop a NaN on GPUs: n_bad counts it
                n_bad += _not_finite_below_inf(x)
            ok = _finite_row(tl.sum(n_bad, axis=1)[:, None], m)
            lo = tl.zeros((BLOCK_R, 1), dtype=tl.float32) - 1.0
            hi = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
            for _ in tl.range(0, BISECTION_STEPS):
                mid = (lo + hi) * 0.5
                acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
                for c in tl.range(0, n_cols, BLOCK_N):
                    cols = c + col_ids
                    u = tl.load(x_row + cols.to(tl.int64) * x_col_stride, mask=row_ok & (cols < n_cols),
                                other=float("-inf")).to(tl.float32) - m
                    acc += tl.where(u > mid, u - mid, 0.0)
                above = tl.sum(acc, axis=1)[:, None] >= 1.0
                lo = tl.where(above, mid, lo)
                hi = tl.where(above, hi, mid)
            tau = lo
            for _ in tl.range(0, EXACT_STEPS):
                count = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
                total = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
                for c in tl.range(0, n_cols, BLOCK_N):
                    cols = c + col_ids
                    u = tl.load(x_row + cols.to(tl.int64) * x_col_stride, mask=row_ok & (cols < n_cols),
                                other=float("-inf")).to(tl.float32) - m
                    support = u > tau
                    count += tl.where(support, 1.0, 0.0)
                    total += tl.where(support, u, 0.0)
                tau = (tl.sum(total, axis=1)[:, None] - 1.0) / tl.maximum(tl.sum(count, axis=1)[:, None], 1.0)
            y_row = y_ptr + _row_offsets(rows, post, y_pre_stride, 1, SPLIT_ROWS)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = row_ok & (cols < n_cols)
                u = tl.load(x_row + cols.to(tl.int64) * x_col_stride, mask=mask,
                            other=float("-inf")).to(tl.float32) - m
                tl.store(y_row + cols.to(tl.int64) * y_col_stride, _project(u, tau, ok).to(y_ptr.dtype.element_ty),
                         mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "post", "dy_pre_stride", "dy_post_stride", "y_pre_stride",
                                    "y_post_stride", "dx_pre_stride"])
def _sparsemax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, post, dy_pre_stride, dy_col_stride,
                          dy_post_stride, y_pre_stride, y_col_stride, y_post_stride, dx_pre_stride, dx_col_stride,
                          SPLIT_ROWS: tl.constexpr, WHOLE_ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """dx = dy - mean over the support of dy, on the support (y > 0); 0 elsewhere. dx is contiguous."""
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    if WHOLE_ROW:
        col_mask = col_ids < n_cols
        cols64 = col_ids.to(tl.int64)
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            y = tl.load(y_ptr + _row_offsets(rows, post, y_pre_stride, y_post_stride, SPLIT_ROWS)
                        + cols64 * y_col_stride, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + _row_offsets(rows, post, dy_pre_stride, dy_post_stride, SPLIT_ROWS)
                         + cols64 * dy_col_stride, mask=mask, other=0.0).to(tl.float32)
            support = y > 0.0
            count = tl.sum(tl.where(support, 1.0, 0.0), axis=1)[:, None]
            mean = tl.sum(tl.where(support, dy, 0.0), axis=1)[:, None] / tl.maximum(count, 1.0)
            dx = tl.where(support, dy - mean, 0.0)
            tl.store(dx_ptr + _row_offsets(rows, post, dx_pre_stride, 1, SPLIT_ROWS) + cols64 * dx_col_stride,
                     dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:  # one row in chunks: pass 1 the support's size and sum of dy, pass 2 dx
        for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
            rows = start + row_ids
            row_ok = rows < n_rows
            y_row = y_ptr + _row_offsets(rows, post, y_pre_stride, y_post_stride, SPLIT_ROWS)
            dy_row = dy_ptr + _row_offsets(rows, post, dy_pre_stride, dy_post_stride, SPLIT_ROWS)
            count = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            total = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = (c + col_ids).to(tl.int64)
                mask = row_ok & (cols < n_cols)
                support = tl.load(y_row + cols * y_col_stride, mask=mask, other=0.0).to(tl.float32) > 0.0
                dy = tl.load(dy_row + cols * dy_col_stride, mask=mask, other=0.0).to(tl.float32)
                count += tl.where(support, 1.0, 0.0)
                total += tl.where(support, dy, 0.0)
            mean = tl.sum(total, axis=1)[:, None] / tl.maximum(tl.sum(count, axis=1)[:, None], 1.0)
            dx_row = dx_ptr + _row_offsets(rows, post, dx_pre_stride, 1, SPLIT_ROWS)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = (c + col_ids).to(tl.int64)
                mask = row_ok & (cols < n_cols)
                support = tl.load(y_row + cols * y_col_stride, mask=mask, other=0.0).to(tl.float32) > 0.0
                dy = tl.load(dy_row + cols * dy_col_stride, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_row + cols * dx_col_stride, tl.where(support, dy - mean, 0.0).to(dx_ptr.dtype.element_ty),
                         mask=mask)


def normalize_dim(dim, ndim: int):
    """``dim`` in [0, ndim) (a 0-d tensor has one dim of size 1, as torch's reductions treat it); a symbolic int
    (torch.compile) is returned as it is, after the type check."""
    if isinstance(dim, bool) or not isinstance(dim, (int, torch.SymInt)):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not isinstance(dim, int):
        return dim
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise ValueError(f"dim must be in [{-rank}, {rank - 1}] for a {ndim}-d x, got {dim}")
    return dim % rank


def check_sparsemax_inputs(x: torch.Tensor, dim) -> None:
    check_float_tensor("x", x)
    normalize_dim(dim, x.dim())


def check_sparsemax_backward_inputs(grad_out: torch.Tensor, y: torch.Tensor, dim) -> None:
    check_float_tensor("y", y)
    normalize_dim(dim, y.dim())
    check_grad("grad_out", grad_out, y.shape, y.dtype, y.device)


def _as_3d(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as (pre, n, post) around ``dim`` (a view whenever the layout allows, else a copy)."""
    if t.dim() == 0:
        return t.reshape(1, 1, 1)
    return t.reshape(math.prod(t.shape[:dim]), t.shape[dim], math.prod(t.shape[dim + 1:]))


def sparsemax_forward(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    check_sparsemax_inputs(x, dim)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    x3 = _as_3d(x, normalize_dim(dim, x.dim()))
    pre, n_cols, post = x3.shape
    n_rows = pre * post
    tiles = plan_rows(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_WIDE_ROWS)
    _sparsemax_fwd_kernel[(tiles.grid,)](
        x3, y, n_rows, n_cols, post, x3.stride(0), x3.stride(1), x3.stride(2), n_cols * post, post,
        SPLIT_ROWS=post > 1, WHOLE_ROW=tiles.whole_row, BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols,
        **tiles.options)
    return y


def sparsemax_backward(grad_out: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """grad_x from the incoming gradient and the forward's output y (its support is y > 0)."""
    check_sparsemax_backward_inputs(grad_out, y, dim)
    dx = new_like(y)
    if y.numel() == 0:
        return dx
    require_launchable(y.device)
    dim = normalize_dim(dim, y.dim())
    y3, dy3 = _as_3d(y, dim), _as_3d(grad_out, dim)
    pre, n_cols, post = y3.shape
    n_rows = pre * post
    tiles = plan_rows(y.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, persistent=False,
                      cuda_wide_rows=CUDA_WIDE_ROWS)
    _sparsemax_bwd_kernel[(tiles.grid,)](
        dy3, y3, dx, n_rows, n_cols, post, dy3.stride(0), dy3.stride(1), dy3.stride(2), y3.stride(0), y3.stride(1),
        y3.stride(2), n_cols * post, post, SPLIT_ROWS=post > 1, WHOLE_ROW=tiles.whole_row,
        BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols, **tiles.options)
    return dx
