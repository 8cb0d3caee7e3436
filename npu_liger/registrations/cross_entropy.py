"""npu_liger::cross_entropy (public, returns the loss) on top of npu_liger::cross_entropy_with_grad (internal:
the loss and, when asked, the gradient w.r.t. logits from the same pass): schema -> fake -> device kernels ->
autograd. See ``_loss.py`` for how the gradient travels from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.cross_entropy import check_cross_entropy_inputs, cross_entropy_forward
from ._loss import check_computed, scale_in_place, scaled, sharded_rows_result, take_grads, wants_grad
from ._op import EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule


__all__ = ["cross_entropy"]


def _cross_entropy_with_grad_fake(logits, target, ignore_index, reduction, label_smoothing, softcap,
                                  lse_square_scale, compute_grad):
    check_cross_entropy_inputs(logits, target, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
    loss_shape = (logits.shape[0],) if reduction == "none" else ()
    grad_shape = tuple(logits.shape) if compute_grad else (0,)
    return (torch.empty(loss_shape, dtype=torch.float32, device=logits.device),
            torch.empty(grad_shape, dtype=logits.dtype, device=logits.device))


cross_entropy_with_grad_op = define_op(
    "cross_entropy_with_grad(Tensor logits, Tensor target, int ignore_index, str reduction, float label_smoothing,"
    " float? softcap, float lse_square_scale, bool compute_grad) -> (Tensor, Tensor)",
    kernel=cross_entropy_forward,
    fake=_cross_entropy_with_grad_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.reduction = inputs[3]
    ctx.computed = inputs[7]
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_loss, _):
    check_computed(ctx, (ctx.computed,), "cross_entropy", grad_loss)
    (grad,) = ctx.saved_tensors
    grad_logits = scaled(grad, grad_loss, ctx.reduction) if ctx.needs_input_grad[0] else None
    return grad_logits, None, None, None, None, None, None, None


define_autograd(cross_entropy_with_grad_op, backward=_backward, setup_context=_setup_context)


def _cross_entropy_composite(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
                             lse_square_scale=0.0):
    loss, _ = cross_entropy_with_grad_op(logits, target, ignore_index, reduction, label_smoothing, softcap,
                                         lse_square_scale, wants_grad(logits))
    return loss


cross_entropy_op = define_composite(
    'cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, str reduction="mean", '
    "float label_smoothing=0.0, float? softcap=None, float lse_square_scale=0.0) -> Tensor",
    _cross_entropy_composite,
)


@sharding_rule(cross_entropy_op)
def _cross_entropy_sharding(pl, *args):
    """See ``_loss.sharded_rows_result``."""
    rows = sharded_rows_result(pl, pl.arg("reduction"))
    return [pl.case(pl.R)] + ([] if rows is None else [pl.case(rows, logits=pl.S(0), target=pl.S(0))])


@sharding_rule(cross_entropy_with_grad_op)
def _cross_entropy_with_grad_sharding(pl, *args):
    """(loss, grad): the gradient follows the rows."""
    rows = sharded_rows_result(pl, pl.arg("reduction"))
    cases = [pl.case([pl.R, pl.R])]
    if rows is not None:
        cases.append(pl.case([rows, pl.S(0)], logits=pl.S(0), target=pl.S(0)))
    return cases


def _loss_only(logits, target, *options):
    return cross_entropy_forward(logits, target, *options, False)[0]


def _eager_forward(ctx, logits, target, *options):
    """Eager training calls: the forward keeps its gradient for the backward to scale in place (``_loss.py``)."""
    loss, grad = cross_entropy_forward(logits, target, *options, True)
    ctx.grads = [grad]
    return loss


def _eager_backward(ctx, grad_loss):
    (grad,) = take_grads(ctx, "cross_entropy")
    return scale_in_place(grad, grad_loss), None, None, None, None, None, None


_cross_entropy_entry = define_entry(cross_entropy_op, kernel=_loss_only, eager=EagerPath(_eager_forward,
                                                                                         _eager_backward))


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, softcap: Optional[float] = None,
                  lse_square_scale: float = 0.0) -> torch.Tensor:
    """Cross entropy of (BT, V) ``logits`` against (BT,) int ``target``: ``torch.ops.npu_liger.cross_entropy``.

    Per row: optional ``softcap * tanh(logits / softcap)`` (Gemma-2's final logit softcapping), then
    ``F.cross_entropy`` with ``label_smoothing``, plus ``lse_square_scale * logsumexp**2`` (z-loss). Rows whose
    target is ``ignore_index`` count for nothing; ``reduction`` is ``"mean"`` (over valid rows; 0 with zero
    gradients when there are none), ``"sum"`` or ``"none"`` ((BT,)). The loss is float32; the gradient is in
    logits' dtype and is computed in the forward pass (one pass over the logits) when logits need it. A target
    outside [0, V) other than ignore_index is an error.
    """
    return _cross_entropy_entry(logits, target, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
