"""npu_liger::layer_norm and npu_liger::layer_norm_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._norm import check_grad
from ..npu_ops.layer_norm import (check_layer_norm_inputs, launch_layer_norm_backward, layer_norm_backward,
                                  layer_norm_forward)
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule


__all__ = ["layer_norm"]


def _layer_norm_fake(x, weight=None, bias=None, eps=1e-5):
    check_layer_norm_inputs(x, weight, bias, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _layer_norm_backward_fake(grad_out, x, weight, bias, eps):
    check_layer_norm_inputs(x, weight, bias, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    n_cols = x.shape[-1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(n_cols, dtype=x.dtype if weight is None else weight.dtype, device=x.device),
            torch.empty(n_cols, dtype=x.dtype if bias is None else bias.dtype, device=x.device))


layer_norm_op = define_op("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
                          kernel=layer_norm_forward, fake=_layer_norm_fake)
layer_norm_backward_op = define_op(
    "layer_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, float eps)"
    " -> (Tensor, Tensor, Tensor)",
    kernel=layer_norm_backward, fake=_layer_norm_backward_fake, trusted_kernel=launch_layer_norm_backward)


@sharding_rule(layer_norm_op)
def _layer_norm_sharding(p, x, *params):
    """Rows may be sharded, the normalised (last) dim may not: x S(d) for d < ndim - 1 with the parameters R ->
    S(d); all R -> R."""
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in range(x.ndim - 1)]


@sharding_rule(layer_norm_backward_op)
def _layer_norm_backward_sharding(p, grad_out, x, *params):
    """grad and x S(d) on a row dim -> grad_x S(d), the parameter gradients P (each rank sums its own rows); all R
    -> R; grad P with x R -> P throughout (linear in the incoming gradient)."""
    S, P = p.S, p.P
    return ([p.case([p.R] * 3), p.case([P] * 3, grad_out=P)]
            + [p.case([S(d), P, P], grad_out=S(d), x=S(d)) for d in range(x.ndim - 1)])


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)  # bias: only its dtype is used (no copy is made)
    ctx.eps = eps


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    grad_x, grad_w, grad_b = call_op(layer_norm_backward_op, grad_out, x, weight, bias, ctx.eps)
    return grad_x, grad_w if weight is not None else None, grad_b if bias is not None else None, None


_layer_norm_entry = define_autograd(layer_norm_op, backward=_backward, setup_context=_setup_context,
                                    kernel=layer_norm_forward)
forbid_double_backward(layer_norm_backward_op, "layer_norm")


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm(x, x.shape[-1:], weight, bias, eps)`` with statistics in fp32:
    ``torch.ops.npu_liger.layer_norm``. weight and bias are optional and may differ from x in dtype (the result
    is in x's dtype, their gradients in theirs)."""
    return _layer_norm_entry(x, weight, bias, eps)
