"""npu_liger::group_norm and npu_liger::group_norm_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._norm import check_grad
from ..npu_ops.group_norm import (check_group_norm_inputs, group_norm_backward, group_norm_forward,
                                  launch_group_norm_backward)
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["group_norm"]


def _group_norm_fake(x, weight, bias, num_groups, eps=1e-5):
    check_group_norm_inputs(x, weight, bias, num_groups, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _group_norm_backward_fake(grad_out, x, weight, bias, num_groups, eps):
    check_group_norm_inputs(x, weight, bias, num_groups, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    n_channels = x.shape[1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(n_channels, dtype=x.dtype if weight is None else weight.dtype, device=x.device),
            torch.empty(n_channels, dtype=x.dtype if bias is None else bias.dtype, device=x.device))


group_norm_op = define_op(
    "group_norm(Tensor x, Tensor? weight, Tensor? bias, int num_groups, float eps=1e-05) -> Tensor",
    kernel=group_norm_forward, fake=_group_norm_fake)
group_norm_backward_op = define_op(
    "group_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, int num_groups, float eps)"
    " -> (Tensor, Tensor, Tensor)",
    kernel=group_norm_backward, fake=_group_norm_backward_fake, trusted_kernel=launch_group_norm_backward)


@sharding_rule(group_norm_op)
def _group_norm_sharding(p, x, *args):
    """The batch may be sharded (a group spans channels and positions, so no other dim may): x S(0) with the
    parameters R -> S(0); all R -> R."""
    return [p.case(p.R), p.case(p.S(0), x=p.S(0))]


@sharding_rule(group_norm_backward_op)
def _group_norm_backward_sharding(p, grad_out, x, *args):
    """grad and x S(0) -> grad_x S(0), the parameter gradients P (each rank sums its own samples); all R -> R; grad P
    with x R -> P throughout (linear in the incoming gradient)."""
    S, P = p.S, p.P
    return [p.case([p.R] * 3), p.case([P] * 3, grad_out=P), p.case([S(0), P, P], grad_out=S(0), x=S(0))]


def _setup_context(ctx, inputs, output):
    x, weight, bias, num_groups, eps = inputs
    ctx.save_for_backward(x, weight, bias)  # bias: only its dtype is used (no copy is made)
    ctx.num_groups, ctx.eps = num_groups, eps


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    grad_x, grad_w, grad_b = call_op(group_norm_backward_op, grad_out, x, weight, bias, ctx.num_groups, ctx.eps)
    return grad_x, grad_w if weight is not None else None, grad_b if bias is not None else None, None, None


_group_norm_entry = define_autograd(group_norm_op, backward=_backward, setup_context=_setup_context,
                                    kernel=group_norm_forward)
forbid_double_backward(group_norm_backward_op, "group_norm")


def group_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], num_groups: int,
               eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm(x, num_groups, weight, bias, eps)`` for x (N, C, *) with statistics in fp32:
    ``torch.ops.npu_liger.group_norm`` (note the argument order: the schema's, tensors first). weight and bias
    (C,) are optional and may differ from x in dtype (the result is in x's dtype, their gradients in theirs)."""
    return _group_norm_entry(x, weight, bias, num_groups, eps)
