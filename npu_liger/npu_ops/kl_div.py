"""KL divergence as ``F.kl_div(y_pred, y_true, reduction, log_target)`` for (BT, V) rows.

Per element, with x = y_pred (log-probabilities) and t = y_true:

    log_target=False   term = t * log(t) - t * x      (0 where t == 0, as torch's xlogy gives)
    log_target=True    term = e^t * (t - x)

    none      -> (BT, V) terms
    sum       -> sum of the terms
    mean      -> sum / (BT * V)          (torch's 0 / 0 = NaN for an empty input, as F.kl_div)
    batchmean -> sum / BT

``eps`` only guards the logarithm where t == 0 (``log(eps)`` is taken there and multiplied by t = 0, so the term
is exactly 0, as in torch); every other t, however small, uses its own logarithm (Liger-Kernel clamps t to eps
first, which changes the terms of t < eps). y_pred and y_true may differ in dtype; the math is fp32, the loss is
in ``torch.promote_types(y_pred.dtype, y_true.dtype)`` (torch's result dtype), scalar reductions accumulate in fp32.

Gradients (g = grad_out / divisor, or the elementwise grad_out for ``none``), each in its input's dtype, for
whichever of the two require grad (y_true's is what torch gives, for a target that is trained too):

    d/dx = -t * g                                  (log_target: -e^t * g)
    d/dt = (log(t) + t / t - x) * g                (log_target: e^t * (t - x + 1) * g)

d/dt uses torch's own form: the logarithm taken as 0 where t == 0, and t / t, which is NaN there (the derivative
of t log t is unbounded at 0: torch reports NaN, and so does this op).

Two passes and no host synchronisation, as ``tvd``: a row kernel (persistent grid-stride loop over rows, V tiled
by the UB manager's block, inputs read through (row, column) strides) writes the elementwise terms or one fp32
partial sum per row; the scalar is ``row_sums.sum() / divisor`` in torch. The backward kernel reads y_true (and
y_pred when y_true's gradient is wanted) and the incoming gradient: the gradient w.r.t. y_pred does not depend on
y_pred, so it is not computed in the forward (that would keep a (BT, V) buffer from the forward to the backward
for no saved read).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton.language as tl

from ..tiling import TileRequest, plan_launch
from ._triton import (COMPUTE_DTYPE_SIZE, check_float_tensor, grid_stride, launched_kernel, new_like, program_start,
                      require_launchable)

REDUCTIONS = ("none", "sum", "mean", "batchmean")

# Memory analysis (fp32 arithmetic: tiles sized in fp32 elements). One row at a time, V tiled by BLOCK_V.
# Forward, per element of the V tile: x, t (upcast), the guarded t and its logarithm (or e^t), the term, and the
#   fp32 row accumulator (scalar reductions) or the value before the cast (none): ~6 live -> memory_multiplier
#   8.0, leaving room for the mask and select temporaries (Ascend910B3: 192 KiB * 0.8 / (8.0 * 4 B) = 4915 ->
#   BLOCK_V 4096). Liger-Kernel's Ascend kl_div overflowed the UB at its first tile sizes; these are proven by the
#   Ascend compile check (docs/ASCEND_CHECK.md).
# Backward, per element: x, t, the incoming gradient (elementwise for none), the logarithm (or e^t), t / t, and the
#   two gradients before their casts: ~8 live -> memory_multiplier 10.0 (3932 -> BLOCK_V 2048).
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims.
FORWARD_MEMORY_MULTIPLIER = 8.0
BACKWARD_MEMORY_MULTIPLIER = 10.0
# CUDA tiles (columns, warps), or None for the 64 KiB budget's (1024 columns on 4 warps at either multiplier).
# The forward at 8192x128256 bf16 ran 0.73 of copy (H200) on the budget's tile, Liger-Kernel's 16384-wide chunks on
# 16 warps 0.80. Round 19's probe (H100, benchmarks/results/round19/kl_div_probe.py, whole forward call): the
# budget's tile 1.431 ms, 2048 columns on 8 warps 1.412 (0.99 of copy), 4096 on 16 warps 1.419, wider chunks
# slower (8192 on 16 warps 1.673, 16384 on 16 warps 2.373), Liger-Kernel 1.389. The row sum stays a per-lane fp32
# accumulator reduced once per row. The backward (forward+backward ahead of every peer) keeps the budget's tile.
CUDA_FORWARD_TILE = (2048, 8)
CUDA_BACKWARD_TILE = None


def _row_plan(device_type: str, n_cols: int, memory_multiplier: float, cuda_tile):
    """The plan of a row kernel tiling V: the UB manager's on the NPU and CPU; on CUDA the 64 KiB budget's, or
    ``cuda_tile`` = (columns, warps) when given (columns lifted to at most next_pow2(V))."""
    extra = {} if cuda_tile is None else dict(cuda_max_block=cuda_tile[0], cuda_num_warps=cuda_tile[1])
    return plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE, **extra))


@launched_kernel(do_not_specialize=["n_rows"])
def _kl_div_fwd_kernel(x_ptr, t_ptr, out_ptr, row_sums_ptr, n_rows, n_cols, x_stride_row, x_stride_col,
                       t_stride_row, t_stride_col, out_stride_row, eps, LOG_TARGET: tl.constexpr,
                       ELEMENTWISE: tl.constexpr, BLOCK_V: tl.constexpr):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride_row
        t_row = t_ptr + row * t_stride_row
        acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            cols64 = cols.to(tl.int64)
            x = tl.load(x_row + cols64 * x_stride_col, mask=mask, other=0.0).to(tl.float32)
            t = tl.load(t_row + cols64 * t_stride_col, mask=mask, other=0.0).to(tl.float32)
            if LOG_TARGET:
                term = tl.exp(t) * (t - x)
            else:  # t * log(t) with log(eps) where t == 0 (times 0: the term is 0, or NaN for x = -inf, as torch)
                term = t * tl.log(tl.where(t == 0.0, eps, t)) - t * x
            if ELEMENTWISE:
                tl.store(out_ptr + row * out_stride_row + cols64, term.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                acc += tl.where(mask, term, 0.0)
        if not ELEMENTWISE:
            tl.store(row_sums_ptr + row, tl.sum(acc, axis=0))


@launched_kernel(do_not_specialize=["n_rows"])
def _kl_div_bwd_kernel(grad_ptr, x_ptr, t_ptr, grad_x_ptr, grad_t_ptr, n_rows, n_cols, grad_stride_row,
                       grad_stride_col, x_stride_row, x_stride_col, t_stride_row, t_stride_col,
                       LOG_TARGET: tl.constexpr, ELEMENTWISE_GRAD: tl.constexpr, GRAD_X: tl.constexpr,
                       GRAD_T: tl.constexpr, BLOCK_V: tl.constexpr):
    if not ELEMENTWISE_GRAD:
        g_scalar = tl.load(grad_ptr).to(tl.float32)  # grad_out / divisor, computed on the device
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            cols64 = cols.to(tl.int64)
            t = tl.load(t_ptr + row * t_stride_row + cols64 * t_stride_col, mask=mask, other=0.0).to(tl.float32)
            if ELEMENTWISE_GRAD:
                g = tl.load(grad_ptr + row * grad_stride_row + cols64 * grad_stride_col, mask=mask,
                            other=0.0).to(tl.float32)
            else:
                g = g_scalar
            offsets = row * n_cols + cols64
            if LOG_TARGET:
                p = tl.exp(t)
            else:
                p = t
            if GRAD_X:
                tl.store(grad_x_ptr + offsets, (-p * g).to(grad_x_ptr.dtype.element_ty), mask=mask)
            if GRAD_T:
                x = tl.load(x_ptr + row * x_stride_row + cols64 * x_stride_col, mask=mask, other=0.0).to(tl.float32)
                if LOG_TARGET:
                    dt = p * (t - x + 1.0)
                else:  # torch's form: xlogy's log(t) (0 where t == 0) plus t / t (NaN there)
                    dt = tl.where(t == 0.0, 0.0, tl.log(t)) + t / t - x
                tl.store(grad_t_ptr + offsets, (dt * g).to(grad_t_ptr.dtype.element_ty), mask=mask)


def loss_dtype(y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.dtype:
    return torch.promote_types(y_pred.dtype, y_true.dtype)


def check_kl_div_options(reduction: str, log_target: bool, eps: float) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    if not isinstance(log_target, bool):
        raise TypeError(f"log_target must be a bool, got {type(log_target).__name__}")
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0 (it guards log(y_true) where y_true is 0), got {eps}")


def check_kl_div_inputs(y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str, log_target: bool,
                        eps: float) -> None:
    check_float_tensor("y_pred", y_pred)
    check_float_tensor("y_true", y_true)  # any supported dtype: it need not be y_pred's
    if y_pred.dim() != 2:
        raise ValueError(f"y_pred must be 2-D (BT, V), got shape {tuple(y_pred.shape)}")
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true must have the shape of y_pred {tuple(y_pred.shape)}, got {tuple(y_true.shape)}")
    if y_true.device != y_pred.device:
        raise RuntimeError(f"y_true must be on the device of y_pred ({y_pred.device}), got {y_true.device}")
    check_kl_div_options(reduction, log_target, eps)


def check_kl_div_grad(grad_out: torch.Tensor, y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str) -> None:
    check_float_tensor("grad_out", grad_out)
    if reduction == "none" and grad_out.shape != y_pred.shape:
        raise ValueError(f"grad_out must have the shape of y_pred {tuple(y_pred.shape)}, got {tuple(grad_out.shape)}")
    if reduction != "none" and grad_out.dim() != 0:
        raise ValueError(f"grad_out must be a 0-d tensor for reduction={reduction!r}, got shape "
                         f"{tuple(grad_out.shape)}")
    if grad_out.dtype != loss_dtype(y_pred, y_true):
        raise TypeError(f"grad_out must have the dtype of the loss ({loss_dtype(y_pred, y_true)}), "
                        f"got {grad_out.dtype}")
    if grad_out.device != y_pred.device:
        raise RuntimeError(f"grad_out must be on the device of y_pred ({y_pred.device}), got {grad_out.device}")


def _divisor(reduction: str, n_rows: int, n_cols: int) -> int:
    """torch's: the batch size, every element, or 1 (0 for an empty batch: 0 / 0 = NaN, as F.kl_div)."""
    return {"batchmean": n_rows, "mean": n_rows * n_cols}.get(reduction, 1)


def kl_div_forward(y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str = "batchmean",
                   log_target: bool = False, eps: float = 1e-10) -> torch.Tensor:
    check_kl_div_inputs(y_pred, y_true, reduction, log_target, eps)
    n_rows, n_cols = y_pred.shape
    elementwise = reduction == "none"
    dtype = loss_dtype(y_pred, y_true)
    if elementwise:
        out = torch.empty((n_rows, n_cols), dtype=dtype, device=y_pred.device)
        row_sums = out  # never written: ELEMENTWISE is on
    else:
        alloc = torch.empty if y_pred.numel() > 0 else torch.zeros  # V == 0: the kernel is skipped, rows sum to 0
        row_sums = alloc((n_rows,), dtype=torch.float32, device=y_pred.device)
        out = row_sums  # never written: ELEMENTWISE is off
    if y_pred.numel() > 0:
        require_launchable(y_pred.device)
        plan = _row_plan(y_pred.device.type, n_cols, FORWARD_MEMORY_MULTIPLIER, CUDA_FORWARD_TILE)  # see above
        _kl_div_fwd_kernel[(plan.grid(n_rows),)](
            y_pred, y_true, out, row_sums, n_rows, n_cols, y_pred.stride(0), y_pred.stride(1), y_true.stride(0),
            y_true.stride(1), out.stride(0), float(eps), LOG_TARGET=log_target, ELEMENTWISE=elementwise,
            BLOCK_V=plan.block, **plan.launch_options()
        )
    if elementwise:
        return out
    total = row_sums.sum()
    if reduction != "sum":
        total = total / _divisor(reduction, n_rows, n_cols)
    return total.to(dtype)


def kl_div_backward(grad_out: torch.Tensor, y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str,
                    log_target: bool, eps: float, grad_pred: bool = True, grad_true: bool = False
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(grad_y_pred, grad_y_true), each in its input's dtype; one not asked for is an empty (0,) tensor."""
    check_kl_div_inputs(y_pred, y_true, reduction, log_target, eps)
    check_kl_div_grad(grad_out, y_pred, y_true, reduction)
    return trusted_kl_div_backward(grad_out, y_pred, y_true, reduction, log_target, eps, grad_pred, grad_true)


def trusted_kl_div_backward(grad_out: torch.Tensor, y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str,
                            log_target: bool, eps: float, grad_pred: bool = True, grad_true: bool = False
                            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``kl_div_backward`` without its input checks: for arguments autograd made (the forward checked them)."""
    n_rows, n_cols = y_pred.shape
    gx = new_like(y_pred) if grad_pred else y_pred.new_empty((0,))
    gt = new_like(y_true) if grad_true else y_true.new_empty((0,))
    if y_pred.numel() == 0 or not (grad_pred or grad_true):
        return gx, gt
    require_launchable(y_pred.device)
    elementwise = reduction == "none"
    if elementwise:
        grad, grad_strides = grad_out, (grad_out.stride(0), grad_out.stride(1))
    else:
        grad, grad_strides = grad_out.to(torch.float32) / _divisor(reduction, n_rows, n_cols), (0, 0)
    plan = _row_plan(y_pred.device.type, n_cols, BACKWARD_MEMORY_MULTIPLIER, CUDA_BACKWARD_TILE)  # see above
    _kl_div_bwd_kernel[(plan.grid(n_rows),)](
        grad, y_pred, y_true, gx if grad_pred else grad, gt if grad_true else grad, n_rows, n_cols, *grad_strides,
        y_pred.stride(0), y_pred.stride(1), y_true.stride(0), y_true.stride(1), LOG_TARGET=log_target,
        ELEMENTWISE_GRAD=elementwise, GRAD_X=grad_pred, GRAD_T=grad_true, BLOCK_V=plan.block,
        **plan.launch_options()
    )
    return gx, gt
