"""npu_liger::swiglu and npu_liger::swiglu_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

import torch

from ..npu_ops.swiglu import check_swiglu_inputs, swiglu_backward, swiglu_forward
from ._op import define_autograd, define_op, forbid_double_backward

__all__ = ["swiglu"]


def _swiglu_fake(a, b):
    check_swiglu_inputs(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


def _swiglu_backward_fake(grad_c, a, b):
    check_swiglu_inputs(a, b)
    return (torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(a.shape, dtype=a.dtype, device=a.device))


swiglu_op = define_op("swiglu(Tensor a, Tensor b) -> Tensor", kernel=swiglu_forward, fake=_swiglu_fake)
swiglu_backward_op = define_op(
    "swiglu_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)",
    kernel=swiglu_backward,
    fake=_swiglu_backward_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    return swiglu_backward_op(grad_c, a, b)


_swiglu_entry = define_autograd(swiglu_op, backward=_backward, setup_context=_setup_context, kernel=swiglu_forward)
forbid_double_backward(swiglu_backward_op, "swiglu")


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b``: ``torch.ops.npu_liger.swiglu`` (eager calls skip the dispatcher)."""
    return _swiglu_entry(a, b)
