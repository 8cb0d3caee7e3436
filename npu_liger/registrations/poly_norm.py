"""npu_liger::poly_norm and npu_liger::poly_norm_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

import torch

from ..npu_ops._norm import check_grad
from ..npu_ops.poly_norm import check_poly_norm_inputs, launch_poly_norm_backward, poly_norm_backward, poly_norm_forward
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["poly_norm"]


def _poly_norm_fake(x, weight, bias, eps=1e-6):
    check_poly_norm_inputs(x, weight, bias, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _poly_norm_backward_fake(grad_out, x, weight, bias, eps):
    check_poly_norm_inputs(x, weight, bias, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(3, dtype=weight.dtype, device=x.device),
            torch.empty(bias.shape, dtype=bias.dtype, device=x.device))


poly_norm_op = define_op("poly_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> Tensor",
                         kernel=poly_norm_forward, fake=_poly_norm_fake)
poly_norm_backward_op = define_op(
    "poly_norm_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)",
    kernel=poly_norm_backward, fake=_poly_norm_backward_fake, trusted_kernel=launch_poly_norm_backward)


@sharding_rule(poly_norm_op)
def _poly_norm_sharding(p, x, *params):
    """Rows may be sharded, the normalised (last) dim may not: x S(d) for d < ndim - 1 with weight and bias R ->
    S(d); all R -> R."""
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in range(x.ndim - 1)]


@sharding_rule(poly_norm_backward_op)
def _poly_norm_backward_sharding(p, grad_out, x, *params):
    """grad and x S(d) on a row dim -> grad_x S(d), the weight and bias gradients P; all R -> R; grad P with x R ->
    P throughout (linear in the incoming gradient)."""
    S, P = p.S, p.P
    return ([p.case([p.R] * 3), p.case([P] * 3, grad_out=P)]
            + [p.case([S(d), P, P], grad_out=S(d), x=S(d)) for d in range(x.ndim - 1)])


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)  # bias: only its shape and dtype are used (no copy is made)
    ctx.eps = eps


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    grad_x, grad_w, grad_b = call_op(poly_norm_backward_op, grad_out, x, weight, bias, ctx.eps)
    return grad_x, grad_w, grad_b, None


_poly_norm_entry = define_autograd(poly_norm_op, backward=_backward, setup_context=_setup_context,
                                   kernel=poly_norm_forward)
forbid_double_backward(poly_norm_backward_op, "poly_norm")


def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PolyNorm ``w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` over the last dim, ``norm(u) = u /
    sqrt(mean(u^2) + eps)``: ``torch.ops.npu_liger.poly_norm``. weight (3,) = (w0, w1, w2), bias one element ((1,)
    or (), as LigerPolyNorm holds it). Statistics in fp32, the result rounded once to x's dtype; weight and bias
    may differ from x in dtype, their gradients are in theirs."""
    return _poly_norm_entry(x, weight, bias, eps)
