"""npu_liger::geglu and npu_liger::geglu_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

import torch

from ..npu_ops.geglu import check_geglu_inputs, geglu_backward, geglu_forward
from ._op import define_autograd, define_op, forbid_double_backward

__all__ = ["geglu"]


def _geglu_fake(a, b):
    check_geglu_inputs(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


def _geglu_backward_fake(grad_c, a, b):
    check_geglu_inputs(a, b)
    return (torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(a.shape, dtype=a.dtype, device=a.device))


geglu_op = define_op("geglu(Tensor a, Tensor b) -> Tensor", kernel=geglu_forward, fake=_geglu_fake)
geglu_backward_op = define_op(
    "geglu_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)",
    kernel=geglu_backward,
    fake=_geglu_backward_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    return geglu_backward_op(grad_c, a, b)


_geglu_entry = define_autograd(geglu_op, backward=_backward, setup_context=_setup_context, kernel=geglu_forward)
forbid_double_backward(geglu_backward_op, "geglu")


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(a, approximate="tanh") * b``: ``torch.ops.npu_liger.geglu`` (eager calls skip the dispatcher)."""
    return _geglu_entry(a, b)
