"""npu_liger::kl_div and npu_liger::kl_div_backward: schema -> fake -> device kernels -> autograd -> sharding."""

from __future__ import annotations

import torch

from ..npu_ops.kl_div import (check_kl_div_grad, check_kl_div_inputs, kl_div_backward, kl_div_forward, loss_dtype,
                              trusted_kl_div_backward)
from ._loss import saveable
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["kl_div"]


def _kl_div_fake(y_pred, y_true, reduction="batchmean", log_target=False, eps=1e-10):
    check_kl_div_inputs(y_pred, y_true, reduction, log_target, eps)
    shape = y_pred.shape if reduction == "none" else ()
    return torch.empty(shape, dtype=loss_dtype(y_pred, y_true), device=y_pred.device)


def _kl_div_backward_fake(grad_out, y_pred, y_true, reduction, log_target, eps, grad_pred, grad_true):
    check_kl_div_inputs(y_pred, y_true, reduction, log_target, eps)
    check_kl_div_grad(grad_out, y_pred, y_true, reduction)
    return (torch.empty(y_pred.shape if grad_pred else (0,), dtype=y_pred.dtype, device=y_pred.device),
            torch.empty(y_true.shape if grad_true else (0,), dtype=y_true.dtype, device=y_pred.device))


kl_div_op = define_op(
    'kl_div(Tensor y_pred, Tensor y_true, str reduction="batchmean", bool log_target=False, float eps=1e-10)'
    " -> Tensor",
    kernel=kl_div_forward,
    fake=_kl_div_fake,
)
kl_div_backward_op = define_op(
    "kl_div_backward(Tensor grad_out, Tensor y_pred, Tensor y_true, str reduction, bool log_target, float eps, "
    "bool grad_pred, bool grad_true) -> (Tensor, Tensor)",
    kernel=kl_div_backward,
    fake=_kl_div_backward_fake,
    trusted_kernel=trusted_kl_div_backward,
)


def _setup_context(ctx, inputs, output):
    y_pred, y_true, reduction, log_target, eps = inputs
    ctx.save_for_backward(saveable(y_pred), saveable(y_true))
    ctx.args = (reduction, log_target, eps)


def _backward(ctx, grad_out):
    y_pred, y_true = ctx.saved_tensors
    need_pred, need_true = ctx.needs_input_grad[:2]
    grad_pred, grad_true = call_op(kl_div_backward_op, grad_out, y_pred, y_true, *ctx.args, need_pred, need_true)
    return grad_pred if need_pred else None, grad_true if need_true else None, None, None, None


_kl_div_entry = define_autograd(kl_div_op, backward=_backward, setup_context=_setup_context, kernel=kl_div_forward)
forbid_double_backward(kl_div_backward_op, "kl_div")


def _exact_layouts(pl, reduction):
    """(input placement, loss placement) pairs exact for this reduction, as tvd's without labels: elementwise
    terms, so rows S(0) or vocab S(1) for ``none``; either -> P for ``sum``; ``batchmean`` divides by the GLOBAL
    row count, which every rank sees only with vocab sharding; ``mean`` (rows x V) neither."""
    rows, vocab = pl.S(0), pl.S(1)
    return {"none": [(rows, rows), (vocab, vocab)], "sum": [(rows, pl.P), (vocab, pl.P)],
            "batchmean": [(vocab, pl.P)]}.get(reduction, [])


@sharding_rule(kl_div_op)
def _kl_div_sharding(pl, *args):
    return [pl.case(pl.R)] + [pl.case(out, y_pred=pt, y_true=pt) for pt, out in _exact_layouts(pl, pl.arg("reduction"))]


@sharding_rule(kl_div_backward_op)
def _kl_div_backward_sharding(pl, *args):
    """Mirrors the forward (grad_out R for the scalar reductions), or grad_out P with the inputs R (linear in it);
    a gradient not asked for is an empty (0,) tensor, replicated."""
    reduction = pl.arg("reduction")

    def grads(placement):
        return [placement if pl.arg("grad_pred") else pl.R, placement if pl.arg("grad_true") else pl.R]

    cases = [pl.case(grads(pl.R)), pl.case(grads(pl.P), grad_out=pl.P)]
    for pt, _ in _exact_layouts(pl, reduction):
        cases.append(pl.case(grads(pt), grad_out=pt if reduction == "none" else pl.R, y_pred=pt, y_true=pt))
    return cases


def kl_div(y_pred: torch.Tensor, y_true: torch.Tensor, reduction: str = "batchmean", log_target: bool = False,
           eps: float = 1e-10) -> torch.Tensor:
    """``F.kl_div(y_pred, y_true, reduction=reduction, log_target=log_target)`` for (BT, V) log-probability
    predictions: ``torch.ops.npu_liger.kl_div``.

    ``reduction``: ``"batchmean"`` (sum / BT), ``"sum"``, ``"mean"`` (sum / (BT * V)) or ``"none"`` (BT, V).
    ``eps`` only guards ``log(y_true)`` where y_true is 0, whose term is 0 as in torch. y_pred and y_true may differ
    in dtype (the loss is in their promoted dtype, math in fp32); gradients for both, as torch gives them, each in
    its input's dtype; y_true may be an inference-mode tensor (a teacher's output).
    """
    return _kl_div_entry(y_pred, y_true, reduction, log_target, eps)
