"""npu_liger::sparsemax and npu_liger::sparsemax_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

import torch

from ..npu_ops.sparsemax import (check_sparsemax_backward_inputs, check_sparsemax_inputs, sparsemax_backward,
                                 sparsemax_forward)
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["sparsemax"]


def _sparsemax_fake(x, dim=-1):
    check_sparsemax_inputs(x, dim)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _sparsemax_backward_fake(grad_out, y, dim):
    check_sparsemax_backward_inputs(grad_out, y, dim)
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


sparsemax_op = define_op("sparsemax(Tensor x, int dim=-1) -> Tensor", kernel=sparsemax_forward, fake=_sparsemax_fake)
sparsemax_backward_op = define_op("sparsemax_backward(Tensor grad_out, Tensor y, int dim) -> Tensor",
                                  kernel=sparsemax_backward, fake=_sparsemax_backward_fake)


def _row_dims(x, dim):
    """Every dim of x but the reduced one (``dim``, negative counting from the end)."""
    return [d for d in range(x.ndim) if d != dim % max(x.ndim, 1)]


@sharding_rule(sparsemax_op)
def _sparsemax_sharding(p, x, dim=-1):
    """x S(d) on any dim but the reduced one -> S(d); R -> R."""
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in _row_dims(x, dim)]


@sharding_rule(sparsemax_backward_op)
def _sparsemax_backward_sharding(p, grad_out, y, dim):
    """grad_out and y S(d) on a dim that is not reduced -> S(d); R -> R; grad_out P with y R -> P (linear in the
    incoming gradient)."""
    return ([p.case(p.R), p.case(p.P, grad_out=p.P)]
            + [p.case(p.S(d), grad_out=p.S(d), y=p.S(d)) for d in _row_dims(y, dim)])


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)  # the support is where the output is positive
    ctx.dim = inputs[1]


def _backward(ctx, grad_out):
    (y,) = ctx.saved_tensors
    return call_op(sparsemax_backward_op, grad_out, y, ctx.dim), None


_sparsemax_entry = define_autograd(sparsemax_op, backward=_backward, setup_context=_setup_context,
                                   kernel=sparsemax_forward)
forbid_double_backward(sparsemax_backward_op, "sparsemax")


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax along ``dim`` (any dim, negative counts from the end): the Euclidean projection of each slice onto
    the probability simplex, ``max(x - tau, 0)`` with tau such that the slice sums to 1 (Martins & Astudillo,
    2016): ``torch.ops.npu_liger.sparsemax``. fp32 math, the result in x's dtype; tau is found by bisection and an
    exact step, without a sort (``npu_ops/sparsemax.py``). A NaN or +inf in a slice gives a NaN slice; -inf
    entries get 0. The gradient is ``dy - mean(dy)`` over the support (outputs > 0), 0 elsewhere."""
    return _sparsemax_entry(x, dim)
