"""npu_liger::fused_linear_cross_entropy (public, returns the loss) and npu_liger::fused_linear_cross_entropy_with_stats
(public, with the statistics users log) on top of the internal ops npu_liger::fused_linear_cross_entropy_with_grad
(the loss and, when asked, grad_x / grad_weight / grad_bias and the statistics from the same chunked pass) and
npu_liger::fused_linear_cross_entropy_backward (``reduction="none"``: the gradients recomputed chunk by chunk with
per-row incoming gradients): schema -> fake -> device kernels -> autograd. See ``_loss.py`` for how the gradients
travel from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._loss import LossOptions
from ..npu_ops.fused_linear_cross_entropy import (check_flce_inputs, fused_linear_cross_entropy_backward,
                                                   fused_linear_cross_entropy_forward)
from ._loss import (N_OPTIONS, OPTIONS_ARGS, OPTIONS_SCHEMA, check_computed, fake_stats, scale_in_place, scaled,
                    sharded_rows_result, stats_output, take_grads, wants_grad, wants_stats)
from ._op import (CHUNKED_LOSS, EagerPath, define_autograd, define_composite, define_entry, define_op,
                  forbid_double_backward)
from ._sharding import sharding_rule

__all__ = ["fused_linear_cross_entropy"]

_NAME = "fused_linear_cross_entropy"
_TENSORS = "Tensor x, Tensor weight, Tensor target, Tensor? bias, Tensor? ce_weight"
_FLAGS = "bool grad_x, bool grad_weight, bool grad_bias"


def _grad_shapes(x, weight, bias, flags, computes=True):
    grad_x, grad_weight, grad_bias = flags
    return (tuple(x.shape) if computes and grad_x else (0,),
            tuple(weight.shape) if computes and grad_weight else (0,),
            (weight.shape[0],) if computes and grad_bias and bias is not None else (0,))


def _with_grad_fake(x, weight, target, bias, ce_weight, *args):
    *options, accum_dtype, grad_x, grad_weight, grad_bias, stats = args
    options = LossOptions(*options)
    check_flce_inputs(x, weight, target, bias, ce_weight, options, accum_dtype)
    n_rows = x.shape[0]
    loss = x.new_empty((n_rows,) if options.reduction == "none" else (), dtype=torch.float32)
    shapes = _grad_shapes(x, weight, bias, (grad_x, grad_weight, grad_bias), options.reduction != "none")
    return (loss, *(x.new_empty(shape) for shape in shapes),
            *fake_stats(x, n_rows, options.reduction, stats, torch.float32))


def _backward_fake(grad_loss, x, weight, target, bias, ce_weight, *args):
    *options, accum_dtype, grad_x, grad_weight, grad_bias = args
    check_flce_inputs(x, weight, target, bias, ce_weight, LossOptions(options[0], "none", *options[1:]), accum_dtype)
    return tuple(x.new_empty(shape) for shape in _grad_shapes(x, weight, bias, (grad_x, grad_weight, grad_bias)))


with_grad_op = define_op(
    f"{_NAME}_with_grad({_TENSORS}, {OPTIONS_ARGS}, ScalarType? accum_dtype, {_FLAGS}, bool stats)"
    " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    kernel=fused_linear_cross_entropy_forward, fake=_with_grad_fake, opaque_in_graphs=CHUNKED_LOSS)
backward_op = define_op(
    f"{_NAME}_backward(Tensor grad_loss, {_TENSORS}, {OPTIONS_ARGS.replace('str reduction, ', '')},"
    f" ScalarType? accum_dtype, {_FLAGS}) -> (Tensor, Tensor, Tensor)",
    kernel=fused_linear_cross_entropy_backward, fake=_backward_fake, opaque_in_graphs=CHUNKED_LOSS)
forbid_double_backward(backward_op, _NAME)


def _setup_context(ctx, inputs, output):
    x, weight, target, bias, ce_weight, *options, accum_dtype, grad_x, grad_weight, grad_bias, _ = inputs
    options = LossOptions(*options)
    ctx.reduction, ctx.flags = options.reduction, (grad_x, grad_weight, grad_bias)
    ctx.mark_non_differentiable(*output[1:])
    if options.reduction == "none":  # the backward recomputes the chunks with per-row scales
        ctx.args = (*options._replace(reduction=None), accum_dtype)
        ctx.save_for_backward(x, weight, target, bias, ce_weight)
    else:
        ctx.save_for_backward(*output[1:4])


def _backward(ctx, grad_loss, *_):
    x_flag, w_flag, b_flag = ctx.flags
    check_computed(ctx, (x_flag, w_flag, False, b_flag), _NAME, grad_loss)
    need_x, need_weight, _, need_bias = ctx.needs_input_grad[:4]
    if ctx.reduction == "none":
        x, weight, target, bias, ce_weight = ctx.saved_tensors
        ignore_index, _, *rest = ctx.args
        grads = backward_op(grad_loss, x, weight, target, bias, ce_weight, ignore_index, *rest, need_x, need_weight,
                            need_bias)
    else:
        grads = [scaled(g, grad_loss, ctx.reduction) for g in ctx.saved_tensors]
    grad_x, grad_weight, grad_bias = (g if need else None for g, need in zip(grads, (need_x, need_weight, need_bias)))
    return (grad_x, grad_weight, None, grad_bias, *([None] * (6 + N_OPTIONS)))


define_autograd(with_grad_op, backward=_backward, setup_context=_setup_context)


def _all_arguments(x, weight, target, bias=None, ce_weight=None, *options_and_accum) -> tuple:
    """Every argument of the with-gradients op but its flags: the dispatcher leaves out trailing arguments equal to
    their defaults."""
    options, accum_dtype = options_and_accum[:N_OPTIONS], options_and_accum[N_OPTIONS:] or (None,)
    return (x, weight, target, bias, ce_weight, *LossOptions(*options), *accum_dtype,
            wants_grad(x), wants_grad(weight), wants_grad(bias))


def _composite(*args):
    return with_grad_op(*_all_arguments(*args), False)[0]


def _stats_composite(*args):
    loss, _, _, _, *stats = with_grad_op(*_all_arguments(*args), True)
    return (loss, *stats)


_PUBLIC = (f"Tensor x, Tensor weight, Tensor target, Tensor? bias=None, Tensor? ce_weight=None, {OPTIONS_SCHEMA}, "
           "ScalarType? accum_dtype=None")
fused_linear_cross_entropy_op = define_composite(f"{_NAME}({_PUBLIC}) -> Tensor", _composite)
fused_linear_cross_entropy_with_stats_op = define_composite(
    f"{_NAME}_with_stats({_PUBLIC}) -> (Tensor, Tensor, Tensor, Tensor)", _stats_composite)


@sharding_rule(fused_linear_cross_entropy_op, fused_linear_cross_entropy_with_stats_op, with_grad_op)
def _flce_sharding(pl, *args):
    """See ``_loss.sharded_rows_result``: x and target S(0), weight, bias and the class weights R; grad_x, the
    z-loss and the predicted tokens follow the rows, the parameter gradients are P."""
    n_outputs = {_NAME: 1, f"{_NAME}_with_stats": 4, f"{_NAME}_with_grad": 7}[pl.op_name]
    stats = n_outputs == 4 or (n_outputs == 7 and pl.arg("stats"))
    rows = sharded_rows_result(pl, pl.arg("reduction"), stats)
    cases = [pl.case([pl.R] * n_outputs)]
    if rows is not None:
        outputs = {1: [rows], 4: [rows, rows, rows, pl.S(0)],
                   7: [rows, pl.S(0), pl.P, pl.P, rows, rows, pl.S(0)]}[n_outputs]
        cases.append(pl.case(outputs, x=pl.S(0), target=pl.S(0)))
    return cases


@sharding_rule(backward_op)
def _flce_backward_sharding(pl, *args):
    """``none``'s recomputing backward: rows independent, per-row incoming gradients."""
    return [pl.case([pl.R] * 3), pl.case([pl.S(0), pl.P, pl.P], grad_loss=pl.S(0), x=pl.S(0), target=pl.S(0))]


def _reduced(x, weight, target, bias, ce_weight, ignore_index, reduction, *rest) -> bool:
    return reduction != "none"  # ``none`` scales each row before the weight gradient sums them: the op's backward


def _make_entry(op, stats: bool):
    """The public entry of ``op``: loss (and statistics) only, or (sum and mean) the eager path keeping the
    gradients its forward computed for the backward to scale in place (``_loss.py``)."""

    def kernel(*args):
        loss, _, _, _, *extra = fused_linear_cross_entropy_forward(*args, False, False, False, stats)
        return (loss, *extra) if stats else loss

    def forward(ctx, x, weight, target, bias, *rest):
        ctx.flags = (x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
        loss, *ctx.grads, z_loss, accuracy, predicted = fused_linear_cross_entropy_forward(
            x, weight, target, bias, *rest, *ctx.flags, stats)
        if stats:
            ctx.mark_non_differentiable(z_loss, accuracy, predicted)
            return loss, z_loss, accuracy, predicted
        return loss

    def backward(ctx, grad_loss, *_):
        grads = take_grads(ctx, _NAME)
        gx, gw, gb = (scale_in_place(g, grad_loss) if flag else None for g, flag in zip(grads, ctx.flags))
        return (gx, gw, None, gb, *([None] * (2 + N_OPTIONS)))

    return define_entry(op, kernel=kernel, eager=EagerPath(forward, backward, applies=_reduced))


_flce_entry = _make_entry(fused_linear_cross_entropy_op, stats=False)
_flce_with_stats_entry = _make_entry(fused_linear_cross_entropy_with_stats_op, stats=True)


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None, ce_weight: Optional[torch.Tensor] = None,
                               ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                               softcap: Optional[float] = None, lse_square_scale: float = 0.0,
                               use_token_scaling: bool = False, accum_dtype: Optional[torch.dtype] = None, *,
                               return_z_loss: bool = False, return_token_accuracy: bool = False,
                               return_predicted_tokens: bool = False):
    """``cross_entropy(x @ weight.T + bias, target, ce_weight, ...)`` for x (BT, H), weight (V, H), bias (V,) or
    None, computed in chunks of rows so the (BT, V) logits never exist:
    ``torch.ops.npu_liger.fused_linear_cross_entropy``.

    Arguments and semantics as ``npu_liger.cross_entropy`` (class weights are ``ce_weight``; the loss is float32,
    as Hugging Face's loss of upcast logits). Gradients for x, weight and bias, in their dtype, are computed chunk
    by chunk in the forward pass (those that are needed); ``accum_dtype`` (e.g. torch.float32) sums grad_weight
    and grad_bias across chunks in that dtype. For a sum divided by a count of your own (HF's
    ``num_items_in_batch`` under gradient accumulation) use ``reduction="sum"`` and divide the result. The
    ``return_*`` flags: see ``npu_liger.cross_entropy``.
    """
    args = (x, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
            use_token_scaling, accum_dtype)
    flags = (return_z_loss, return_token_accuracy, return_predicted_tokens)
    if wants_stats(*flags):
        return stats_output(_flce_with_stats_entry(*args), *flags)
    return _flce_entry(*args)
