"""TVD: total variation distance between two (BT, V) distributions, ``0.5 * |p - q|`` per element.

    none      -> (BT, V) elementwise 0.5|p - q|, rows whose label == ignore_index set to 0
    sum       -> sum over valid rows
    mean      -> sum / (valid rows * V)     (0 when no row is valid)
    batchmean -> sum / valid rows           (0 when no row is valid)

Scalar reductions accumulate in fp32 and return a 0-d tensor in p's dtype (what the loss is in elsewhere in a
half-precision model; the fp32 accumulation keeps the sum itself accurate).

Two passes and no host synchronisation: a Triton row kernel writes either the elementwise output or one fp32
partial sum per row; the scalar is then ``row_sums.sum() / divisor`` in torch, the divisor counted on the
device from the labels. The backward kernel gets ``grad_out / divisor`` as a device scalar (or grad_out itself,
(BT, V), for ``none``) and writes ``grad_p = 0.5 * sign(p - q) * g`` and ``grad_q = -grad_p``; sign(0) = 0, so the
gradients are exactly 0 where p == q, as autograd of ``torch.abs`` gives. Ignored rows are never read (their
loads are masked off) and get zero gradients.

Both kernels run a persistent grid-stride loop over rows (row offsets in int64) and tile V with the UB
manager's block; all four 2-D tensors are addressed through (row, column) strides, so views need no copy.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, plan_launch
from ._triton import check_float_tensor, check_same_layout, grid_stride, program_start, require_launchable

REDUCTIONS = ("none", "sum", "mean", "batchmean")
LABEL_DTYPES = (torch.int32, torch.int64)

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4). One row is
# processed at a time, V tiled by BLOCK_V.
# Forward, per element of the V tile: p, q (upcast), |p - q| / 2, and the fp32 row accumulator (scalar
#   reductions) or the value before the cast (none): ~4 live fp32 values -> memory_multiplier 4.0
#   (Ascend910B3: 192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> BLOCK_V 8192).
# Backward: p, q, p - q, sign, the incoming gradient (elementwise for none), grad_p and its negation:
#   ~6 live fp32 values -> memory_multiplier 6.0 (6553 -> BLOCK_V 4096).
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims, unit_param = 1.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 6.0
COMPUTE_DTYPE_SIZE = 4


@triton.jit
def _tvd_fwd_kernel(p_ptr, q_ptr, labels_ptr, out_ptr, row_sums_ptr, n_rows, n_cols,
                    p_stride_row, p_stride_col, q_stride_row, q_stride_col, labels_stride, out_stride_row,
                    ignore_index, HAS_LABELS: tl.constexpr, ELEMENTWISE: tl.constexpr, BLOCK_V: tl.constexpr):
    # int64 rows from the start (program_start/grid_stride with a block of 1): the interpreter's loop variable
    # is a Python int, which has no .to(), so the row cannot be widened inside the loop.
    for row64 in tl.range(program_start(1), n_rows, grid_stride(1)):
        p_row = p_ptr + row64 * p_stride_row
        q_row = q_ptr + row64 * q_stride_row
        read_cols = n_cols
        if HAS_LABELS:  # an ignored row reads nothing (its loads are masked off) and yields zeros
            read_cols = tl.where(tl.load(labels_ptr + row64 * labels_stride) != ignore_index, n_cols, 0)
        acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            load_mask = cols < read_cols
            cols64 = cols.to(tl.int64)
            p = tl.load(p_row + cols64 * p_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            q = tl.load(q_row + cols64 * q_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            tv = tl.abs(p - q) * 0.5
            if ELEMENTWISE:
                tl.store(out_ptr + row64 * out_stride_row + cols64, tv.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                acc += tv
        if not ELEMENTWISE:
            tl.store(row_sums_ptr + row64, tl.sum(acc, axis=0))


@triton.jit
def _tvd_bwd_kernel(grad_ptr, p_ptr, q_ptr, labels_ptr, grad_p_ptr, grad_q_ptr, n_rows, n_cols,
                    grad_stride_row, grad_stride_col, p_stride_row, p_stride_col, q_stride_row, q_stride_col,
                    labels_stride, ignore_index, HAS_LABELS: tl.constexpr, ELEMENTWISE_GRAD: tl.constexpr,
                    BLOCK_V: tl.constexpr):
    if not ELEMENTWISE_GRAD:
        half_scale = tl.load(grad_ptr).to(tl.float32) * 0.5  # grad_out / divisor, computed on the device
    # int64 rows from the start (program_start/grid_stride with a block of 1): the interpreter's loop variable
    # is a Python int, which has no .to(), so the row cannot be widened inside the loop.
    for row64 in tl.range(program_start(1), n_rows, grid_stride(1)):
        p_row = p_ptr + row64 * p_stride_row
        q_row = q_ptr + row64 * q_stride_row
        read_cols = n_cols
        if HAS_LABELS:  # an ignored row reads nothing (its loads are masked off) and yields zeros
            read_cols = tl.where(tl.load(labels_ptr + row64 * labels_stride) != ignore_index, n_cols, 0)
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            load_mask = cols < read_cols
            cols64 = cols.to(tl.int64)
            p = tl.load(p_row + cols64 * p_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            q = tl.load(q_row + cols64 * q_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            diff = p - q
            sign = tl.where(diff > 0.0, 1.0, 0.0) - tl.where(diff < 0.0, 1.0, 0.0)
            if ELEMENTWISE_GRAD:
                g = tl.load(grad_ptr + row64 * grad_stride_row + cols64 * grad_stride_col, mask=load_mask,
                            other=0.0).to(tl.float32)
                grad_p = sign * g * 0.5
            else:
                grad_p = sign * half_scale
            if HAS_LABELS:
                grad_p = tl.where(load_mask, grad_p, 0.0)  # exact zeros for ignored rows, even for a non-finite grad
            offsets = row64 * n_cols + cols64
            tl.store(grad_p_ptr + offsets, grad_p.to(grad_p_ptr.dtype.element_ty), mask=mask)
            tl.store(grad_q_ptr + offsets, (-grad_p).to(grad_q_ptr.dtype.element_ty), mask=mask)


def check_tvd_inputs(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor], reduction: str,
                     ignore_index: int) -> None:
    check_float_tensor("p", p)
    check_float_tensor("q", q)
    if p.dim() != 2:
        raise ValueError(f"p must be 2-D (BT, V), got shape {tuple(p.shape)}")
    check_same_layout("q", q, "p", p)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, torch.SymInt)):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if shift_labels is None:
        return
    if not isinstance(shift_labels, torch.Tensor):
        raise TypeError(f"shift_labels must be a torch.Tensor or None, got {type(shift_labels).__name__}")
    if shift_labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"shift_labels must be int32 or int64, got {shift_labels.dtype}")
    if shift_labels.dim() != 1 or shift_labels.shape[0] != p.shape[0]:
        raise ValueError(f"shift_labels must have shape (BT,) = ({p.shape[0]},) to match p, "
                         f"got {tuple(shift_labels.shape)}")
    if shift_labels.device != p.device:
        raise RuntimeError(f"shift_labels must be on the device of p ({p.device}), got {shift_labels.device}")


def check_tvd_grad(grad_out: torch.Tensor, p: torch.Tensor, reduction: str) -> None:
    check_float_tensor("grad_out", grad_out)
    if reduction == "none":
        check_same_layout("grad_out", grad_out, "p", p)
        return
    if grad_out.dim() != 0:
        raise ValueError(
            f"grad_out must be a 0-d tensor for reduction={reduction!r}, got shape {tuple(grad_out.shape)}"
        )
    if grad_out.dtype != p.dtype:
        raise TypeError(f"grad_out must have the dtype of p ({p.dtype}), got {grad_out.dtype}")
    if grad_out.device != p.device:
        raise RuntimeError(f"grad_out must be on the device of p ({p.device}), got {grad_out.device}")


def _request(n_cols: int, memory_multiplier: float) -> TileRequest:
    return TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE)


def _divisor(shift_labels: Optional[torch.Tensor], reduction: str, ignore_index: int, n_rows: int,
             n_cols: int) -> Union[int, torch.Tensor]:
    """What the summed loss is divided by: a Python int without labels, else a device tensor (no sync).
    Clamped to >= 1: with no valid element the sum is 0, and 0 / 1 gives the documented 0."""
    if reduction == "sum":
        return 1
    per_row = n_cols if reduction == "mean" else 1
    if shift_labels is None:
        return max(n_rows * per_row, 1)
    return ((shift_labels != ignore_index).sum() * per_row).clamp_min(1)


def _labels_args(shift_labels: Optional[torch.Tensor], dummy: torch.Tensor) -> Tuple[torch.Tensor, int]:
    if shift_labels is None:
        return dummy, 0  # never read: HAS_LABELS is off
    return shift_labels, shift_labels.stride(0)


def tvd_forward(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
                reduction: str = "batchmean", ignore_index: int = -100) -> torch.Tensor:
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    n_rows, n_cols = p.shape
    elementwise = reduction == "none"
    if elementwise:
        out = torch.empty((n_rows, n_cols), dtype=p.dtype, device=p.device)
        row_sums = out  # never written: ELEMENTWISE is on
    else:
        alloc = torch.empty if p.numel() > 0 else torch.zeros  # V == 0: the kernel is skipped, rows sum to 0
        row_sums = alloc((n_rows,), dtype=torch.float32, device=p.device)
        out = row_sums  # never written: ELEMENTWISE is off
    if p.numel() > 0:
        require_launchable(p.device)
        plan = plan_launch(p.device.type, _request(n_cols, FORWARD_MEMORY_MULTIPLIER))
        labels, labels_stride = _labels_args(shift_labels, p)
        _tvd_fwd_kernel[(plan.grid(n_rows),)](
            p, q, labels, out, row_sums, n_rows, n_cols, p.stride(0), p.stride(1), q.stride(0), q.stride(1),
            labels_stride, out.stride(0), ignore_index, HAS_LABELS=shift_labels is not None,
            ELEMENTWISE=elementwise, BLOCK_V=plan.block, **plan.launch_options()
        )
    if elementwise:
        return out
    return (row_sums.sum() / _divisor(shift_labels, reduction, ignore_index, n_rows, n_cols)).to(p.dtype)


def tvd_backward(grad_out: torch.Tensor, p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor],
                 reduction: str, ignore_index: int) -> Tuple[torch.Tensor, torch.Tensor]:
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    check_tvd_grad(grad_out, p, reduction)
    n_rows, n_cols = p.shape
    grad_p = torch.empty((n_rows, n_cols), dtype=p.dtype, device=p.device)
    grad_q = torch.empty((n_rows, n_cols), dtype=p.dtype, device=p.device)
    if p.numel() == 0:
        return grad_p, grad_q
    require_launchable(p.device)
    elementwise = reduction == "none"
    if elementwise:
        grad, grad_strides = grad_out, (grad_out.stride(0), grad_out.stride(1))
    else:
        grad = grad_out.to(torch.float32) / _divisor(shift_labels, reduction, ignore_index, n_rows, n_cols)
        grad_strides = (0, 0)
    plan = plan_launch(p.device.type, _request(n_cols, BACKWARD_MEMORY_MULTIPLIER))
    labels, labels_stride = _labels_args(shift_labels, p)
    _tvd_bwd_kernel[(plan.grid(n_rows),)](
        grad, p, q, labels, grad_p, grad_q, n_rows, n_cols, *grad_strides, p.stride(0), p.stride(1),
        q.stride(0), q.stride(1), labels_stride, ignore_index, HAS_LABELS=shift_labels is not None,
        ELEMENTWISE_GRAD=elementwise, BLOCK_V=plan.block, **plan.launch_options()
    )
    return grad_p, grad_q
