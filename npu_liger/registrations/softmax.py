"""npu_liger::softmax and npu_liger::softmax_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

import torch

from ..npu_ops.softmax import check_softmax_backward_inputs, check_softmax_input, softmax_backward, softmax_forward
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["softmax"]


def _softmax_fake(x):
    check_softmax_input(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _softmax_backward_fake(grad_out, y):
    check_softmax_backward_inputs(grad_out, y)
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


softmax_op = define_op("softmax(Tensor x) -> Tensor", kernel=softmax_forward, fake=_softmax_fake)
softmax_backward_op = define_op("softmax_backward(Tensor grad_out, Tensor y) -> Tensor", kernel=softmax_backward,
                                fake=_softmax_backward_fake)


@sharding_rule(softmax_op)
def _softmax_sharding(p, x):
    """Rows may be sharded, the reduced (last) dim may not: x S(d) for d < ndim - 1 -> S(d); R -> R."""
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in range(x.ndim - 1)]


@sharding_rule(softmax_backward_op)
def _softmax_backward_sharding(p, grad_out, y):
    """grad_out and y S(d) on a row dim -> S(d); R -> R; grad_out P with y R -> P (linear in the incoming
    gradient)."""
    return ([p.case(p.R), p.case(p.P, grad_out=p.P)]
            + [p.case(p.S(d), grad_out=p.S(d), y=p.S(d)) for d in range(y.ndim - 1)])


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)  # the backward needs y only, as torch's softmax saves it


def _backward(ctx, grad_out):
    (y,) = ctx.saved_tensors
    return call_op(softmax_backward_op, grad_out, y)


_softmax_entry = define_autograd(softmax_op, backward=_backward, setup_context=_setup_context, kernel=softmax_forward)
forbid_double_backward(softmax_backward_op, "softmax")


def softmax(x: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(x, -1)`` with fp32 math, the result in x's dtype: ``torch.ops.npu_liger.softmax``. Rows
    that fit one tile are read once; wider rows are walked twice (an online max and sum, then the output). A NaN
    in a row gives a NaN row, as torch does. The gradient comes from the saved output."""
    return _softmax_entry(x)
