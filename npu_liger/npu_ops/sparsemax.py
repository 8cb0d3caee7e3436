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

Layout (``_sparsemax_layout.py``): x is viewed as (pre, n, post) around the reduced dim n, any dim, negative or
not; every tile's last axis has unit stride (triton-ascend gathers along a strided axis): (rows, n) tiles for the
last dim, small trailing dims and layouts with n innermost; (n, trailing positions) tiles otherwise. The output
and dx are contiguous tensors of x's shape. Rows that fit one tile do every pass in the UB (x read once, y written
once; several rows per tile); wider rows loop in chunks, one read of the row per pass: 1 (max, checks) +
``BISECTION_STEPS`` + ``EXACT_STEPS`` + 1 (the output) forward, 2 backward.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile, dtype_size 4):
- forward: x as loaded, u, and per step the comparison, u - t and the selected value, y before the cast -> 6.0
  (Ascend910B3: 192 KiB * 0.8 / (6 * 4 B) = 6553 -> 4096 columns whole; wider rows loop);
- backward: y and dy (as loaded and in fp32), the support mask, the selected dy, dx -> 6.0 (4096 columns).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._norm import check_grad
from ._sparsemax_layout import (kernel_view, plan_sparsemax, row_zeros, strides, tile_mask, tile_offsets, tile_zeros,
                                uses_rows)
from ._triton import check_float_tensor, grid_stride, launched_kernel, new_like, program_start, require_launchable

FORWARD_MEMORY_MULTIPLIER = 6.0
BACKWARD_MEMORY_MULTIPLIER = 6.0
BISECTION_STEPS: tl.constexpr = tl.constexpr(24)
EXACT_STEPS: tl.constexpr = tl.constexpr(2)



@triton.jit
def _not_finite_below_inf(x):
    """1.0 where x is NaN or +inf (the comparison is false for both), 0.0 elsewhere (-inf and masked lanes)."""
    return tl.where(x < float("inf"), 0.0, 1.0)


@triton.jit
def _project(u, tau, ok):
    """max(u - tau, 0) without a maximum (it would drop NaN), NaN for the rows that have no sparsemax."""
    d = u - tau
    return tl.where(ok, tl.where(d > 0.0, d, 0.0), float("nan"))


@launched_kernel(do_not_specialize=["n_tasks", "tasks_per_outer", "n_rows", "x_outer_stride", "y_outer_stride"])
def _sparsemax_fwd_kernel(x_ptr, y_ptr, n_tasks, tasks_per_outer, n_rows, n_cols, x_outer_stride, x_row_stride,
                          x_col_stride, y_outer_stride, y_row_stride, y_col_stride, ROWS_LAST: tl.constexpr,
                          AXIS: tl.constexpr, WHOLE_ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """Task t: rows [b * BLOCK_R, (b + 1) * BLOCK_R) of outer slice o, with (o, b) = divmod(t, tasks_per_outer);
    ``AXIS``: the tile's column axis (the reductions')."""
    row_ids = tl.arange(0, BLOCK_R).to(tl.int64)
    col_ids = tl.arange(0, BLOCK_N).to(tl.int64)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        outer = task // tasks_per_outer
        rows = (task - outer * tasks_per_outer) * BLOCK_R + row_ids
        x_base = x_ptr + outer * x_outer_stride
        y_base = y_ptr + outer * y_outer_stride
        if WHOLE_ROW:  # every pass on the tile in the UB / registers: x read once, y written once
            mask = tile_mask(rows, col_ids, n_rows, n_cols, ROWS_LAST)
            x = tl.load(x_base + tile_offsets(rows, col_ids, x_row_stride, x_col_stride, ROWS_LAST), mask=mask,
                        other=float("-inf")).to(tl.float32)
            m = tl.max(x, axis=AXIS, keep_dims=True)
            ok = (tl.sum(_not_finite_below_inf(x), axis=AXIS, keep_dims=True) == 0.0) & (m > float("-inf"))
            u = x - m
            lo = row_zeros(BLOCK_R, ROWS_LAST) - 1.0
            width = 1.0  # every row's bracket is [lo, lo + width): the same width for all
            for _ in tl.range(0, BISECTION_STEPS):
                width = width * 0.5
                d = u - (lo + width)
                lo = tl.where(tl.sum(tl.where(d > 0.0, d, 0.0), axis=AXIS, keep_dims=True) >= 1.0, lo + width, lo)
            tau = lo
            for _ in tl.range(0, EXACT_STEPS):
                support = u > tau
                count = tl.sum(tl.where(support, 1.0, 0.0), axis=AXIS, keep_dims=True)
                tau = (tl.sum(tl.where(support, u, 0.0), axis=AXIS, keep_dims=True) - 1.0) / tl.maximum(count, 1.0)
            tl.store(y_base + tile_offsets(rows, col_ids, y_row_stride, y_col_stride, ROWS_LAST),
                     _project(u, tau, ok).to(y_ptr.dtype.element_ty), mask=mask)
        else:  # the row in BLOCK_N chunks, one read of it per pass (module docstring)
            m = row_zeros(BLOCK_R, ROWS_LAST) + float("-inf")
            n_bad = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                x = tl.load(x_base + tile_offsets(rows, cols, x_row_stride, x_col_stride, ROWS_LAST),
                            mask=tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST), other=float("-inf"))
                x = x.to(tl.float32)
                m = tl.maximum(m, tl.max(x, axis=AXIS, keep_dims=True))  # may drop a NaN on GPUs: n_bad counts it
                n_bad += _not_finite_below_inf(x)
            ok = (tl.sum(n_bad, axis=AXIS, keep_dims=True) == 0.0) & (m > float("-inf"))
            lo = row_zeros(BLOCK_R, ROWS_LAST) - 1.0
            width = 1.0
            for _ in tl.range(0, BISECTION_STEPS):
                width = width * 0.5
                mid = lo + width
                acc = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
                for c in tl.range(0, n_cols, BLOCK_N):
                    cols = c + col_ids
                    x = tl.load(x_base + tile_offsets(rows, cols, x_row_stride, x_col_stride, ROWS_LAST),
                                mask=tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST), other=float("-inf"))
                    d = x.to(tl.float32) - (m + mid)
                    acc += tl.where(d > 0.0, d, 0.0)
                lo = tl.where(tl.sum(acc, axis=AXIS, keep_dims=True) >= 1.0, mid, lo)
            tau = lo
            for _ in tl.range(0, EXACT_STEPS):
                count = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
                total = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
                for c in tl.range(0, n_cols, BLOCK_N):
                    cols = c + col_ids
                    x = tl.load(x_base + tile_offsets(rows, cols, x_row_stride, x_col_stride, ROWS_LAST),
                                mask=tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST), other=float("-inf"))
                    u = x.to(tl.float32) - m
                    support = u > tau
                    count += tl.where(support, 1.0, 0.0)
                    total += tl.where(support, u, 0.0)
                tau = ((tl.sum(total, axis=AXIS, keep_dims=True) - 1.0)
                       / tl.maximum(tl.sum(count, axis=AXIS, keep_dims=True), 1.0))
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST)
                x = tl.load(x_base + tile_offsets(rows, cols, x_row_stride, x_col_stride, ROWS_LAST), mask=mask,
                            other=float("-inf"))
                tl.store(y_base + tile_offsets(rows, cols, y_row_stride, y_col_stride, ROWS_LAST),
                         _project(x.to(tl.float32) - m, tau, ok).to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_tasks", "tasks_per_outer", "n_rows", "dy_outer_stride", "y_outer_stride",
                                    "dx_outer_stride"])
def _sparsemax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, n_tasks, tasks_per_outer, n_rows, n_cols, dy_outer_stride,
                          dy_row_stride, dy_col_stride, y_outer_stride, y_row_stride, y_col_stride, dx_outer_stride,
                          dx_row_stride, dx_col_stride, ROWS_LAST: tl.constexpr, AXIS: tl.constexpr,
                          WHOLE_ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx = dy - mean over the support of dy, on the support (y > 0); 0 elsewhere. Tasks as in the forward."""
    row_ids = tl.arange(0, BLOCK_R).to(tl.int64)
    col_ids = tl.arange(0, BLOCK_N).to(tl.int64)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        outer = task // tasks_per_outer
        rows = (task - outer * tasks_per_outer) * BLOCK_R + row_ids
        dy_base = dy_ptr + outer * dy_outer_stride
        y_base = y_ptr + outer * y_outer_stride
        dx_base = dx_ptr + outer * dx_outer_stride
        if WHOLE_ROW:
            mask = tile_mask(rows, col_ids, n_rows, n_cols, ROWS_LAST)
            y = tl.load(y_base + tile_offsets(rows, col_ids, y_row_stride, y_col_stride, ROWS_LAST), mask=mask,
                        other=0.0).to(tl.float32)
            dy = tl.load(dy_base + tile_offsets(rows, col_ids, dy_row_stride, dy_col_stride, ROWS_LAST), mask=mask,
                         other=0.0).to(tl.float32)
            support = y > 0.0
            count = tl.sum(tl.where(support, 1.0, 0.0), axis=AXIS, keep_dims=True)
            mean = tl.sum(tl.where(support, dy, 0.0), axis=AXIS, keep_dims=True) / tl.maximum(count, 1.0)
            tl.store(dx_base + tile_offsets(rows, col_ids, dx_row_stride, dx_col_stride, ROWS_LAST),
                     tl.where(support, dy - mean, 0.0).to(dx_ptr.dtype.element_ty), mask=mask)
        else:  # the row in chunks: pass 1 the support's size and sum of dy, pass 2 dx
            count = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
            total = tile_zeros(BLOCK_R, BLOCK_N, ROWS_LAST)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST)
                y = tl.load(y_base + tile_offsets(rows, cols, y_row_stride, y_col_stride, ROWS_LAST), mask=mask,
                            other=0.0)
                dy = tl.load(dy_base + tile_offsets(rows, cols, dy_row_stride, dy_col_stride, ROWS_LAST), mask=mask,
                             other=0.0).to(tl.float32)
                support = y.to(tl.float32) > 0.0
                count += tl.where(support, 1.0, 0.0)
                total += tl.where(support, dy, 0.0)
            mean = tl.sum(total, axis=AXIS, keep_dims=True) / tl.maximum(tl.sum(count, axis=AXIS, keep_dims=True), 1.0)
            for c in tl.range(0, n_cols, BLOCK_N):
                cols = c + col_ids
                mask = tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST)
                y = tl.load(y_base + tile_offsets(rows, cols, y_row_stride, y_col_stride, ROWS_LAST), mask=mask,
                            other=0.0)
                dy = tl.load(dy_base + tile_offsets(rows, cols, dy_row_stride, dy_col_stride, ROWS_LAST), mask=mask,
                             other=0.0).to(tl.float32)
                tl.store(dx_base + tile_offsets(rows, cols, dx_row_stride, dx_col_stride, ROWS_LAST),
                         tl.where(y.to(tl.float32) > 0.0, dy - mean, 0.0).to(dx_ptr.dtype.element_ty), mask=mask)


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


def _launch(kernel, dim: int, as_rows: bool, memory_multiplier: float, out: torch.Tensor, *inputs):
    """Run ``kernel`` over the kernel views of ``inputs`` (``kernel_view``) into ``out``, a new contiguous tensor of
    their shape: directly, or (the rows layout of a dim that is not the last) through a (rows, n) buffer whose rows
    are then copied into out's layout."""
    views = [kernel_view(t, dim, as_rows) for t in inputs]
    pre, n_cols, post = views[0].shape
    out3 = kernel_view(out, dim, as_rows=False)
    copy_back = as_rows and out3.shape[2] > 1
    buffer = torch.empty(views[0].shape, dtype=out.dtype, device=out.device) if copy_back else out3
    tiles = plan_sparsemax(out.device.type, pre, n_cols, post, memory_multiplier)
    kernel[(tiles.grid,)](
        *views, buffer, tiles.n_tasks, tiles.tasks_per_outer, post if tiles.rows_last else pre, n_cols,
        *[s for v in (*views, buffer) for s in strides(v, tiles)], ROWS_LAST=tiles.rows_last,
        AXIS=0 if tiles.rows_last else 1, WHOLE_ROW=tiles.whole_row, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, **tiles.options)
    if copy_back:
        out3.copy_(buffer.view(out3.shape[0], out3.shape[2], n_cols).transpose(1, 2))
    return out


def sparsemax_forward(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    check_sparsemax_inputs(x, dim)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    dim = normalize_dim(dim, x.dim())
    return _launch(_sparsemax_fwd_kernel, dim, uses_rows(x, dim, by_layout=True), FORWARD_MEMORY_MULTIPLIER, y, x)


def sparsemax_backward(grad_out: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """grad_x from the incoming gradient and the forward's output y (its support is y > 0)."""
    check_sparsemax_backward_inputs(grad_out, y, dim)
    dx = new_like(y)
    if y.numel() == 0:
        return dx
    require_launchable(y.device)
    dim = normalize_dim(dim, y.dim())
    return _launch(_sparsemax_bwd_kernel, dim, uses_rows(y, dim, by_layout=False), BACKWARD_MEMORY_MULTIPLIER, dx,
                   grad_out, y)
