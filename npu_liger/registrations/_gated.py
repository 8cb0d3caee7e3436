"""Registration shared by the gated elementwise ops (GEGLU, SwiGLU): ``<op>(Tensor a, Tensor b) -> Tensor``
and the functional ``<op>_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)``."""

from __future__ import annotations

from typing import Callable, Tuple

import torch

from ..npu_ops._gated import check_gated_inputs
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule


def _forward_fake(a, b):
    check_gated_inputs(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


def _backward_fake(grad_c, a, b):
    check_gated_inputs(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(a.shape, dtype=a.dtype, device=a.device)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def define_gated_op(name: str, forward: Callable, backward: Callable) -> Tuple[object, object, Callable]:
    """Define ``npu_liger::<name>`` and ``npu_liger::<name>_backward`` with their fakes and autograd formula.

    Returns (op, backward op, eager entry point); the public function calls the entry point."""
    op = define_op(f"{name}(Tensor a, Tensor b) -> Tensor", kernel=forward, fake=_forward_fake)
    backward_op = define_op(f"{name}_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)",
                            kernel=backward, fake=_backward_fake)

    def _backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        return call_op(backward_op, grad_c, a, b)

    entry = define_autograd(op, backward=_backward, setup_context=_setup_context, kernel=forward)
    forbid_double_backward(backward_op, name)
    sharding_rule(op)(_gated_sharding)
    sharding_rule(backward_op)(_gated_backward_sharding)
    return op, backward_op, entry


def _gated_sharding(p, a, b):
    """a and b both S(d) for any d -> S(d); both R -> R. Never P: the ops are nonlinear."""
    return [p.case(p.R)] + [p.case(p.S(d), a=p.S(d), b=p.S(d)) for d in range(a.ndim)]


def _gated_backward_sharding(p, grad_c, a, b):
    """All S(d) -> S(d); all R -> R; grad_c P with a, b R -> P (the gradients are linear in grad_c)."""
    S = p.S
    return ([p.case([p.R, p.R]), p.case([p.P, p.P], grad_c=p.P)]
            + [p.case([S(d), S(d)], grad_c=S(d), a=S(d), b=S(d)) for d in range(a.ndim)])
