"""npu_liger::tvd and npu_liger::tvd_backward: schema -> fake -> device kernels -> autograd.

Two autograd paths with bitwise-identical results:
- the op's registered formula (torch.compile, DTensor, dispatch modes, functorch, and double backward): the
  backward op recomputes sign(p - q) from the saved p and q;
- eager training calls of ``tvd`` (inputs needing grad, plain tensors, nothing tracing): the eager path (``_codes``),
  whose forward also stores the sign of p - q as 2-bit codes (1/16 of p's bytes in fp32), so the backward reads
  those instead of p and q: forward + backward moves 4 (BT x V) tensors instead of 6. (The op's schema returns
  the loss only, so the compiled path cannot carry the codes.)
"""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.tvd import (check_tvd_grad, check_tvd_inputs, loss_dtype, tvd_backward, tvd_backward_from_codes,
                           tvd_forward)
from ._op import EagerPath, call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

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


def _exact_layouts(pl, reduction):
    """(p/q placement, label placement, output placement) under which the local result is exact: rows S(0)
    (labels follow) or vocab S(1) (labels R). ``none``: either -> the same; ``sum``: either -> P; ``batchmean``
    divides by the GLOBAL number of valid rows: exact only with S(1) (every rank sees every row) -> P; row-sharded
    inputs are gathered first. ``mean`` divides by valid rows * V: R only (for a row-sharded mean, call
    ``reduction="sum"`` and divide by the all-reduced count yourself)."""
    S, R, P = pl.S, pl.R, pl.P
    rows, vocab = (S(0), S(0)), (S(1), R)
    return {"none": [rows + (S(0),), vocab + (S(1),)], "sum": [rows + (P,), vocab + (P,)],
            "batchmean": [vocab + (P,)]}.get(reduction, [])


@sharding_rule(tvd_op)
def _tvd_sharding(pl, *args):
    return [pl.case(pl.R)] + [pl.case(out, p=pq, q=pq, shift_labels=lab)
                              for pq, lab, out in _exact_layouts(pl, pl.arg("reduction"))]


@sharding_rule(tvd_backward_op)
def _tvd_backward_sharding(pl, *args):
    """Mirrors the forward per reduction (grad_out R for the scalar reductions), or grad_out P with every other
    input R (linear in it)."""
    reduction = pl.arg("reduction")
    cases = [pl.case([pl.R, pl.R]), pl.case([pl.P, pl.P], grad_out=pl.P)]
    for pq, lab, _ in _exact_layouts(pl, reduction):
        cases.append(pl.case([pq, pq], grad_out=pq if reduction == "none" else pl.R, p=pq, q=pq, shift_labels=lab))
    return cases


def _saveable(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Autograd refuses to save inference-mode tensors (a teacher's q made under ``torch.inference_mode()``, say).
    The backward needs their values, not their identity, so those are saved as a plain copy; torch's own
    ``(p - q).abs()`` saves a new tensor (p - q) the same way."""
    return tensor.clone() if tensor is not None and tensor.is_inference() else tensor


def _setup_context(ctx, inputs, output):
    p, q, shift_labels, reduction, ignore_index = inputs
    ctx.save_for_backward(_saveable(p), _saveable(q), _saveable(shift_labels))
    ctx.reduction = reduction
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_out):
    p, q, shift_labels = ctx.saved_tensors
    grad_p, grad_q = call_op(tvd_backward_op, grad_out, p, q, shift_labels, ctx.reduction, ctx.ignore_index)
    return grad_p, grad_q, None, None, None


def _codes_forward(ctx, p, q, shift_labels, reduction, ignore_index):
    """The eager path's forward: the loss, and 2-bit sign codes for the backward."""
    loss, saved = tvd_forward(p, q, shift_labels, reduction, ignore_index, save_codes=True)
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


def _codes_backward(ctx, grad_out):
    p, q, shift_labels, codes = ctx.saved_tensors
    if torch.is_grad_enabled() and p is not None:  # create_graph=True: the op, which forbids double backward
        grad_p, grad_q = tvd_backward_op(grad_out, p, q, shift_labels, ctx.reduction, ctx.ignore_index)
    else:
        check_tvd_grad(grad_out, ctx.shape, ctx.device, ctx.reduction, ctx.loss_dtype)
        saved = ctx.saved._replace(codes=codes)
        need_p, need_q = ctx.needs_input_grad[:2]
        grad_p, grad_q = tvd_backward_from_codes(grad_out, saved, *ctx.shape, ctx.p_dtype, ctx.q_dtype,
                                                 ctx.reduction, need_p, need_q)
    return grad_p, grad_q, None, None, None


_tvd_entry = define_autograd(tvd_op, backward=_backward, setup_context=_setup_context, kernel=tvd_forward,
                             eager=EagerPath(_codes_forward, _codes_backward))
forbid_double_backward(tvd_backward_op, "tvd")


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
    return _tvd_entry(p, q, shift_labels, reduction, ignore_index)
