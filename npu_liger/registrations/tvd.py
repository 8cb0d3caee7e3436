"""npu_liger::tvd and npu_liger::tvd_backward: schema -> fake -> device kernels -> autograd.

Two autograd paths with bitwise-identical results:
- the op's registered formula (torch.compile, DTensor, dispatch modes, functorch, and double backward): the
  backward op recomputes sign(p - q) from the saved p and q;
- eager training calls of ``tvd`` (inputs needing grad, plain tensors, nothing tracing): ``TvdCodesEager``, whose
  forward also stores the sign of p - q as 2-bit codes (1/16 of p's bytes in fp32), so the backward reads
  those instead of p and q: forward + backward moves 4 (BT x V) tensors instead of 6. (The op's schema returns
  the loss only, so the compiled path cannot carry the codes.)
"""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._triton import serialized
from ..npu_ops.tvd import (check_tvd_grad, check_tvd_inputs, loss_dtype, tvd_backward, tvd_backward_from_codes,
                           tvd_forward)
from ._loss import saveable as _saveable
from ._op import call_op, define_autograd, define_op, eager_call_allowed, forbid_double_backward

__all__ = ["tvd"]


def _tvd_fake(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    shape = p.shape if reduction == "none" else ()
    return torch.empty(shape, dtype=loss_dtype(p, q), device=p.device)


def _tvd_backward_fake(grad_out, p, q, shift_labels, reduction, ignore_index):
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    check_tvd_grad(grad_out, p.shape, p.device, reduction, loss_dtype(p, q))
    return (torch.empty(p.shape, dtype=p.dtype, device=p.device), torch.empty(p.shape, dtype=q.dtype, device=p.device))


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
    ctx.save_for_backward(_saveable(p), _saveable(q), _saveable(shift_labels))
    ctx.reduction = reduction
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_out):
    p, q, shift_labels = ctx.saved_tensors
    grad_p, grad_q = call_op(tvd_backward_op, grad_out, p, q, shift_labels, ctx.reduction, ctx.ignore_index)
    return grad_p, grad_q, None, None, None


_forward_with_codes = serialized(tvd_forward)
_backward_from_codes = serialized(tvd_backward_from_codes)
_tvd_entry = define_autograd(tvd_op, backward=_backward, setup_context=_setup_context, kernel=tvd_forward)
forbid_double_backward(tvd_backward_op, "tvd")


class TvdCodesEager(torch.autograd.Function):
    """Eager training path: the forward saves 2-bit sign codes, the backward reads only those."""

    @staticmethod
    def forward(ctx, p, q, shift_labels, reduction, ignore_index):
        loss, saved = _forward_with_codes(p, q, shift_labels, reduction, ignore_index, save_codes=True)
        # p, q and the labels are kept (references, no copy) only for a create_graph backward, which goes through
        # the op; autograd cannot keep inference-mode tensors, and those are not copied for so rare a case
        # (the backward then computes from the codes, which gives the same gradients without a graph).
        keep = not any(t is not None and t.is_inference() for t in (p, q, shift_labels))
        inputs = (p, q, shift_labels) if keep else (None, None, None)
        ctx.save_for_backward(*inputs, saved.codes)  # the codes go as a saved tensor (freed after use)
        ctx.saved, ctx.reduction, ctx.ignore_index = saved._replace(codes=None), reduction, ignore_index
        ctx.shape, ctx.device, ctx.p_dtype, ctx.q_dtype = p.shape, p.device, p.dtype, q.dtype
        ctx.loss_dtype = loss.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        p, q, shift_labels, codes = ctx.saved_tensors
        if torch.is_grad_enabled() and p is not None:  # create_graph=True: the op, which forbids double backward
            grad_p, grad_q = tvd_backward_op(grad_out, p, q, shift_labels, ctx.reduction, ctx.ignore_index)
        else:
            check_tvd_grad(grad_out, ctx.shape, ctx.device, ctx.reduction, ctx.loss_dtype)
            saved = ctx.saved._replace(codes=codes)
            grad_p, grad_q = _backward_from_codes(grad_out, saved, *ctx.shape, ctx.p_dtype, ctx.q_dtype,
                                                  ctx.reduction)
        return grad_p, grad_q, None, None, None


def _codes_path(p, q, shift_labels) -> bool:
    """Whether an eager call may take ``TvdCodesEager``: the eager bypass's rule plus a gradient to compute."""
    return (p.requires_grad or q.requires_grad) and torch.is_grad_enabled() and eager_call_allowed(p, q, shift_labels)


def tvd(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None, reduction: str = "batchmean",
        ignore_index: int = -100) -> torch.Tensor:
    """Total variation distance ``0.5 * |p - q|`` over (BT, V) rows: ``torch.ops.npu_liger.tvd`` (eager calls skip
    the dispatcher; eager training calls save 2-bit sign codes for the backward instead of recomputing).

    Rows whose ``shift_labels`` entry equals ``ignore_index`` count for nothing. ``reduction``: ``"none"`` (BT, V),
    ``"sum"``, ``"mean"`` (over valid elements) or ``"batchmean"`` (over valid rows); scalar results are
    accumulated in fp32; no valid row gives 0. p and q may differ in dtype (any of fp32, fp16, bf16: a bf16
    student and an fp32 teacher, say): the math is fp32, the loss is in their promoted dtype, each gradient in
    its input's dtype. Either may be an inference-mode tensor (e.g. a teacher's output).
    """
    if _codes_path(p, q, shift_labels):
        return TvdCodesEager.apply(p, q, shift_labels, reduction, ignore_index)
    return _tvd_entry(p, q, shift_labels, reduction, ignore_index)
