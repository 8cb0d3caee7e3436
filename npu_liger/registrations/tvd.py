"""npu_liger::tvd and npu_liger::tvd_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.tvd import check_tvd_grad, check_tvd_inputs, tvd_backward, tvd_forward
from ._op import define_autograd, define_op, forbid_double_backward

__all__ = ["tvd"]


def _tvd_fake(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    shape = p.shape if reduction == "none" else ()
    return torch.empty(shape, dtype=p.dtype, device=p.device)


def _tvd_backward_fake(grad_out, p, q, shift_labels, reduction, ignore_index):
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    check_tvd_grad(grad_out, p, reduction)
    return (torch.empty(p.shape, dtype=p.dtype, device=p.device), torch.empty(p.shape, dtype=p.dtype, device=p.device))


tvd_op = define_op(
    'tvd(Tensor p, Tensor q, Tensor? shift_labels=None, str reduction="batchmean", int ignore_index=-100) -> Tensor',
    kernel=tvd_forward,
    fake=_tvd_fake,
)
tvd_backward_op = define_op(
    "tvd_backward(Tensor grad_out, Tensor p, Tensor q, Tensor? shift_labels, str reduction, int ignore_index)"
    " -> (Tensor, Tensor)",
    kernel=tvd_backward,
    fake=_tvd_backward_fake,
)


def _setup_context(ctx, inputs, output):
    p, q, shift_labels, reduction, ignore_index = inputs
    ctx.save_for_backward(p, q, shift_labels)
    ctx.reduction = reduction
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_out):
    p, q, shift_labels = ctx.saved_tensors
    grad_p, grad_q = tvd_backward_op(grad_out, p, q, shift_labels, ctx.reduction, ctx.ignore_index)
    return grad_p, grad_q, None, None, None


_tvd_entry = define_autograd(tvd_op, backward=_backward, setup_context=_setup_context, kernel=tvd_forward)
forbid_double_backward(tvd_backward_op, "tvd")


def tvd(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None, reduction: str = "batchmean",
        ignore_index: int = -100) -> torch.Tensor:
    """Total variation distance ``0.5 * |p - q|`` over (BT, V) rows: ``torch.ops.npu_liger.tvd`` (eager calls skip
    the dispatcher).

    Rows whose ``shift_labels`` entry equals ``ignore_index`` count for nothing. ``reduction``: ``"none"`` (BT, V),
    ``"sum"``, ``"mean"`` (over valid elements) or ``"batchmean"`` (over valid rows); scalar results are
    accumulated in fp32 and returned in p's dtype; no valid row gives 0.
    """
    return _tvd_entry(p, q, shift_labels, reduction, ignore_index)
