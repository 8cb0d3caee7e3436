"""npu_liger::cross_entropy (public, returns the loss) and npu_liger::cross_entropy_with_stats (public, the loss
and the statistics users log) on top of npu_liger::cross_entropy_with_grad (internal: the loss, the gradient w.r.t.
logits when asked, and the statistics when asked, from the same pass): schema -> fake -> device kernels ->
autograd. See ``_loss.py`` for how the gradient travels from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._loss import LossOptions
from ..npu_ops.cross_entropy import check_cross_entropy_inputs, cross_entropy_forward
from ._loss import (N_OPTIONS, OPTIONS_ARGS, OPTIONS_SCHEMA, check_computed, fake_stats,
                    scale_in_place, scaled, sharded_rows_result, stats_output, take_grads, wants_grad, wants_stats)
from ._op import EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule

__all__ = ["cross_entropy"]


def _with_grad_fake(logits, target, weight, *args):
    *options, compute_grad, stats = args
    options = LossOptions(*options)
    check_cross_entropy_inputs(logits, target, weight, options)
    n_rows = logits.shape[0]
    loss = logits.new_empty((n_rows,) if options.reduction == "none" else ())
    grad = logits.new_empty(tuple(logits.shape) if compute_grad else (0,))
    return (loss, grad, *fake_stats(logits, n_rows, options.reduction, stats, logits.dtype))


cross_entropy_with_grad_op = define_op(
    f"cross_entropy_with_grad(Tensor logits, Tensor target, Tensor? weight, {OPTIONS_ARGS}, bool compute_grad, "
    "bool stats) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    kernel=cross_entropy_forward, fake=_with_grad_fake)


def _setup_context(ctx, inputs, output):
    logits, target, weight, *options, ctx.computed, _ = inputs
    ctx.reduction = LossOptions(*options).reduction
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_loss, *_):
    check_computed(ctx, (ctx.computed,), "cross_entropy", grad_loss)
    (grad,) = ctx.saved_tensors
    grad_logits = scaled(grad, grad_loss, ctx.reduction) if ctx.needs_input_grad[0] else None
    return (grad_logits, *([None] * (4 + N_OPTIONS)))


define_autograd(cross_entropy_with_grad_op, backward=_backward, setup_context=_setup_context)


# The composites fill in every option: the dispatcher leaves out trailing arguments equal to their defaults.
def _composite(logits, target, weight=None, *options):
    return cross_entropy_with_grad_op(logits, target, weight, *LossOptions(*options), wants_grad(logits), False)[0]


def _stats_composite(logits, target, weight=None, *options):
    loss, _, *stats = cross_entropy_with_grad_op(logits, target, weight, *LossOptions(*options), wants_grad(logits),
                                                 True)
    return (loss, *stats)


_INPUTS = "Tensor logits, Tensor target, Tensor? weight=None"
cross_entropy_op = define_composite(f"cross_entropy({_INPUTS}, {OPTIONS_SCHEMA}) -> Tensor", _composite)
cross_entropy_with_stats_op = define_composite(
    f"cross_entropy_with_stats({_INPUTS}, {OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)", _stats_composite)


@sharding_rule(cross_entropy_op, cross_entropy_with_stats_op, cross_entropy_with_grad_op)
def _cross_entropy_sharding(pl, *args):
    """See ``_loss.sharded_rows_result``: the gradient, the z-loss and the predicted tokens follow the rows."""
    n_outputs = {"cross_entropy": 1, "cross_entropy_with_stats": 4, "cross_entropy_with_grad": 5}[pl.op_name]
    stats = pl.op_name == "cross_entropy_with_stats" or (n_outputs == 5 and pl.arg("stats"))
    rows = sharded_rows_result(pl, pl.arg("reduction"), stats)
    cases = [pl.case([pl.R] * n_outputs)]
    if rows is not None:
        outputs = {1: [rows], 4: [rows, rows, rows, pl.S(0)], 5: [rows, pl.S(0), rows, rows, pl.S(0)]}[n_outputs]
        cases.append(pl.case(outputs, logits=pl.S(0), target=pl.S(0)))
    return cases


def _make_entry(op, stats: bool):
    """The public entry of ``op``: loss (and statistics) only, or the eager path keeping its gradient for the
    backward to scale in place (``_loss.py``)."""

    def kernel(*args):
        loss, _, *extra = cross_entropy_forward(*args, False, stats)
        return (loss, *extra) if stats else loss

    def forward(ctx, *args):
        loss, grad, *extra = cross_entropy_forward(*args, True, stats)
        ctx.grads = [grad]
        if stats:
            ctx.mark_non_differentiable(*extra)
            return (loss, *extra)
        return loss

    def backward(ctx, grad_loss, *_):
        (grad,) = take_grads(ctx, "cross_entropy")
        return (scale_in_place(grad, grad_loss), *([None] * (2 + N_OPTIONS)))

    return define_entry(op, kernel=kernel, eager=EagerPath(forward, backward))


_cross_entropy_entry = _make_entry(cross_entropy_op, stats=False)
_cross_entropy_with_stats_entry = _make_entry(cross_entropy_with_stats_op, stats=True)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                  softcap: Optional[float] = None, lse_square_scale: float = 0.0, use_token_scaling: bool = False,
                  *, return_z_loss: bool = False, return_token_accuracy: bool = False,
                  return_predicted_tokens: bool = False):
    """Cross entropy of (BT, V) ``logits`` against (BT,) int ``target``: ``torch.ops.npu_liger.cross_entropy``.

    Per row: optional ``softcap * tanh(logits / softcap)`` (Gemma-2's final logit softcapping), then
    ``F.cross_entropy`` with class weights ``weight`` (V,) and ``label_smoothing``, plus ``lse_square_scale *
    logsumexp**2`` (z-loss, weighted by the target's class weight like the row). Rows whose target is
    ``ignore_index`` count for nothing; ``reduction`` is ``"mean"`` (over valid rows, weighted by their class
    weights as torch does; 0 with zero gradients when there are none), ``"sum"`` or ``"none"`` ((BT,)).
    ``use_token_scaling`` multiplies each row's loss and gradient by its target's (detached) probability (Liger's
    option). The loss is in logits' dtype (computed in fp32), as ``F.cross_entropy``; the gradient is in logits'
    dtype and is computed in the forward pass (one pass over the logits) when logits need it. A target outside
    [0, V) other than ignore_index is an error.

    With any ``return_*`` flag set, returns a ``CrossEntropyOutput(loss, z_loss, token_accuracy,
    predicted_tokens)`` (``torch.ops.npu_liger.cross_entropy_with_stats``; the fields not asked for are None): the
    z-loss term as it enters the loss, the accuracy (the mean over valid rows, per row for ``none``) and the
    argmax per row (-1 for ignored rows), none of them differentiable.
    """
    args = (logits, target, weight, ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
            use_token_scaling)
    flags = (return_z_loss, return_token_accuracy, return_predicted_tokens)
    if wants_stats(*flags):
        return stats_output(_cross_entropy_with_stats_entry(*args), *flags)
    return _cross_entropy_entry(*args)

