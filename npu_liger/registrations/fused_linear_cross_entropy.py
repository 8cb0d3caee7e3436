"""npu_liger::fused_linear_cross_entropy (public, returns the loss) on top of the internal ops
npu_liger::fused_linear_cross_entropy_with_grad (the loss and, when asked, grad_x / grad_weight / grad_bias from
the same chunked pass) and npu_liger::fused_linear_cross_entropy_backward (``reduction="none"``: the gradients
recomputed chunk by chunk with per-row incoming gradients): schema -> fake -> device kernels -> autograd.
See ``_loss.py`` for how the gradients travel from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_cross_entropy import (check_flce_inputs, fused_linear_cross_entropy_backward,
                                                   fused_linear_cross_entropy_forward)
from ._loss import check_computed, scale_in_place, scaled, sharded_rows_result, take_grads, wants_grad
from ._op import EagerPath, define_autograd, define_composite, define_entry, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["fused_linear_cross_entropy"]

_NAME = "fused_linear_cross_entropy"


def _grad_shapes(x, weight, bias, reduction, grad_x, grad_weight, grad_bias, in_forward=True):
    computes = not in_forward or reduction != "none"
    return (tuple(x.shape) if computes and grad_x else (0,),
            tuple(weight.shape) if computes and grad_weight else (0,),
            (weight.shape[0],) if computes and grad_bias and bias is not None else (0,))


def _with_grad_fake(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
                    grad_x, grad_weight, grad_bias):
    check_flce_inputs(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
    loss = torch.empty((x.shape[0],) if reduction == "none" else (), dtype=torch.float32, device=x.device)
    shapes = _grad_shapes(x, weight, bias, reduction, grad_x, grad_weight, grad_bias)
    return (loss, *(torch.empty(shape, dtype=x.dtype, device=x.device) for shape in shapes))


def _backward_fake(grad_loss, x, weight, target, bias, ignore_index, label_smoothing, softcap, lse_square_scale,
                   grad_x, grad_weight, grad_bias):
    check_flce_inputs(x, weight, target, bias, ignore_index, "none", label_smoothing, softcap, lse_square_scale)
    shapes = _grad_shapes(x, weight, bias, "none", grad_x, grad_weight, grad_bias, in_forward=False)
    return tuple(torch.empty(shape, dtype=x.dtype, device=x.device) for shape in shapes)


_ARGS = ("Tensor x, Tensor weight, Tensor target, Tensor? bias, int ignore_index, {reduction}float label_smoothing, "
         "float? softcap, float lse_square_scale, bool grad_x, bool grad_weight, bool grad_bias")
with_grad_op = define_op(
    f"{_NAME}_with_grad({_ARGS.format(reduction='str reduction, ')}) -> (Tensor, Tensor, Tensor, Tensor)",
    kernel=fused_linear_cross_entropy_forward,
    fake=_with_grad_fake,
)
backward_op = define_op(
    f"{_NAME}_backward(Tensor grad_loss, {_ARGS.format(reduction='')}) -> (Tensor, Tensor, Tensor)",
    kernel=fused_linear_cross_entropy_backward,
    fake=_backward_fake,
)
forbid_double_backward(backward_op, _NAME)


def _setup_context(ctx, inputs, output):
    x, weight, target, bias, ignore_index, reduction, smoothing, softcap, z_scale, *flags = inputs
    ctx.reduction, ctx.flags = reduction, flags
    ctx.mark_non_differentiable(*output[1:])
    if reduction == "none":  # the backward recomputes the chunks with per-row scales
        ctx.args = (ignore_index, smoothing, softcap, z_scale)
        ctx.save_for_backward(x, weight, target, bias)
    else:
        ctx.save_for_backward(*output[1:])


def _backward(ctx, grad_loss, *_):
    x_flag, w_flag, b_flag = ctx.flags
    check_computed(ctx, (x_flag, w_flag, False, b_flag), _NAME, grad_loss)
    needs = ctx.needs_input_grad
    if ctx.reduction == "none":
        x, weight, target, bias = ctx.saved_tensors
        grads = backward_op(grad_loss, x, weight, target, bias, *ctx.args, needs[0], needs[1], needs[3])
    else:
        grads = [scaled(g, grad_loss, ctx.reduction) for g in ctx.saved_tensors]
    grad_x, grad_weight, grad_bias = (g if need else None for g, need in zip(grads, (needs[0], needs[1], needs[3])))
    return grad_x, grad_weight, None, grad_bias, None, None, None, None, None, None, None, None


define_autograd(with_grad_op, backward=_backward, setup_context=_setup_context)


def _composite(x, weight, target, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
               lse_square_scale=0.0):
    return with_grad_op(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
                        wants_grad(x), wants_grad(weight), wants_grad(bias))[0]


fused_linear_cross_entropy_op = define_composite(
    f'{_NAME}(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, int ignore_index=-100, '
    'str reduction="mean", float label_smoothing=0.0, float? softcap=None, float lse_square_scale=0.0) -> Tensor',
    _composite,
)


@sharding_rule(fused_linear_cross_entropy_op)
def _flce_sharding(pl, *args):
    """See ``_loss.sharded_rows_result``: x and target S(0), weight and bias R."""
    rows = sharded_rows_result(pl, pl.arg("reduction"))
    return [pl.case(pl.R)] + ([] if rows is None else [pl.case(rows, x=pl.S(0), target=pl.S(0))])


@sharding_rule(with_grad_op)
def _flce_with_grad_sharding(pl, *args):
    """(loss, grad_x, grad_weight, grad_bias): grad_x follows the rows, the parameter gradients are P."""
    rows = sharded_rows_result(pl, pl.arg("reduction"))
    cases = [pl.case([pl.R] * 4)]
    if rows is not None:
        cases.append(pl.case([rows, pl.S(0), pl.P, pl.P], x=pl.S(0), target=pl.S(0)))
    return cases


@sharding_rule(backward_op)
def _flce_backward_sharding(pl, *args):
    """``none``'s recomputing backward: rows independent, per-row incoming gradients."""
    return [pl.case([pl.R] * 3), pl.case([pl.S(0), pl.P, pl.P], grad_loss=pl.S(0), x=pl.S(0), target=pl.S(0))]


def _loss_only(x, weight, target, bias, *options):
    return fused_linear_cross_entropy_forward(x, weight, target, bias, *options)[0]


def _eager_forward(ctx, x, weight, target, bias, *options):
    """Eager training calls (sum and mean): the forward keeps the gradients it computed for the backward to scale
    in place (``_loss.py``)."""
    ctx.flags = (x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
    loss, *ctx.grads = fused_linear_cross_entropy_forward(x, weight, target, bias, *options, *ctx.flags)
    return loss


def _eager_backward(ctx, grad_loss):
    grads = take_grads(ctx, _NAME)
    gx, gw, gb = (scale_in_place(g, grad_loss) if flag else None for g, flag in zip(grads, ctx.flags))
    return gx, gw, None, gb, None, None, None, None, None


def _reduced(x, weight, target, bias, ignore_index, reduction, *options) -> bool:
    return reduction != "none"  # ``none`` scales each row before the weight gradient sums them: the op's backward


_flce_entry = define_entry(fused_linear_cross_entropy_op, kernel=_loss_only,
                           eager=EagerPath(_eager_forward, _eager_backward, applies=_reduced))


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                               label_smoothing: float = 0.0, softcap: Optional[float] = None,
                               lse_square_scale: float = 0.0) -> torch.Tensor:
    """``cross_entropy(x @ weight.T + bias, target, ...)`` for x (BT, H), weight (V, H), bias (V,) or None,
    computed in chunks of rows so the (BT, V) logits never exist: ``torch.ops.npu_liger.fused_linear_cross_entropy``.

    Arguments and semantics as ``npu_liger.cross_entropy`` (the loss is float32). Gradients for x, weight and
    bias, in their dtype, are computed chunk by chunk in the forward pass (those that are needed). For a sum
    divided by a count of your own (HF's ``num_items_in_batch`` under gradient accumulation) use
    ``reduction="sum"`` and divide the result.
    """
    return _flce_entry(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
