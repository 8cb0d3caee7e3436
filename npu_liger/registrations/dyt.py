"""npu_liger::dyt and npu_liger::dyt_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._norm import check_grad
from ..npu_ops.dyt import check_dyt_inputs, dyt_backward, dyt_forward, launch_dyt_backward
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["dyt"]


def _dyt_fake(x, alpha, gamma, beta=None):
    check_dyt_inputs(x, alpha, gamma, beta)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _dyt_backward_fake(grad_out, x, alpha, gamma, beta):
    check_dyt_inputs(x, alpha, gamma, beta)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    n_cols = x.shape[-1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(alpha.shape, dtype=alpha.dtype, device=x.device),
            torch.empty(n_cols, dtype=gamma.dtype, device=x.device),
            torch.empty(n_cols, dtype=gamma.dtype if beta is None else beta.dtype, device=x.device))


dyt_op = define_op("dyt(Tensor x, Tensor alpha, Tensor gamma, Tensor? beta=None) -> Tensor", kernel=dyt_forward,
                   fake=_dyt_fake)
dyt_backward_op = define_op(
    "dyt_backward(Tensor grad_out, Tensor x, Tensor alpha, Tensor gamma, Tensor? beta)"
    " -> (Tensor, Tensor, Tensor, Tensor)",
    kernel=dyt_backward, fake=_dyt_backward_fake, trusted_kernel=launch_dyt_backward)


@sharding_rule(dyt_op)
def _dyt_sharding(p, x, *params):
    """Rows may be sharded: x S(d) for d < ndim - 1 with the parameters R -> S(d); all R -> R. (Elementwise along
    the last dim too, but that would need gamma and beta sharded with it: not listed, DTensor gathers x.)"""
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in range(x.ndim - 1)]


@sharding_rule(dyt_backward_op)
def _dyt_backward_sharding(p, grad_out, x, *params):
    """grad and x S(d) on a row dim -> grad_x S(d), the parameter gradients P (each rank sums its own elements);
    all R -> R; grad P with x R -> P throughout (linear in the incoming gradient)."""
    S, P = p.S, p.P
    return ([p.case([p.R] * 4), p.case([P] * 4, grad_out=P)]
            + [p.case([S(d), P, P, P], grad_out=S(d), x=S(d)) for d in range(x.ndim - 1)])


def _setup_context(ctx, inputs, output):
    x, alpha, gamma, beta = inputs
    ctx.save_for_backward(x, alpha, gamma, beta)  # beta: only its dtype is used (no copy is made)


def _backward(ctx, grad_out):
    x, alpha, gamma, beta = ctx.saved_tensors
    grad_x, grad_alpha, grad_gamma, grad_beta = call_op(dyt_backward_op, grad_out, x, alpha, gamma, beta)
    return grad_x, grad_alpha, grad_gamma, grad_beta if beta is not None else None


_dyt_entry = define_autograd(dyt_op, backward=_backward, setup_context=_setup_context, kernel=dyt_forward)
forbid_double_backward(dyt_backward_op, "dyt")


def dyt(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dynamic Tanh ``gamma * tanh(alpha * x) + beta`` over the last dim of x (..., C): ``torch.ops.npu_liger.dyt``.
    alpha is a one-element tensor ((1,) or ()), gamma and beta (C,), beta optional. Computed in fp32 and rounded
    once to x's dtype; the parameters may differ from x in dtype (fp32 parameters with half-precision x give
    x's dtype, as Liger's LigerDyT does, where the eager formula would promote to fp32), their gradients are in
    theirs."""
    return _dyt_entry(x, alpha, gamma, beta)
