"""npu_liger::jsd (public, returns the loss) on top of npu_liger::jsd_with_grad (internal: the loss and, when
asked, the gradient w.r.t. input from the same pass): schema -> fake -> device kernels -> autograd. See
``_loss.py`` for how the gradient travels from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._triton import serialized
from ..npu_ops.jsd import check_jsd_inputs, jsd_forward
from ._loss import check_computed, eager_plain, scale_in_place, scaled, take_grads, wants_grad
from ._op import define_autograd, define_composite, define_op

jsd_forward = serialized(jsd_forward)  # called directly below: one CPU launch at a time

__all__ = ["jsd"]


def _jsd_with_grad_fake(input, target, shift_labels, beta, ignore_index, compute_grad):
    check_jsd_inputs(input, target, shift_labels, beta, ignore_index)
    grad_shape = tuple(input.shape) if compute_grad else (0,)
    return (torch.empty((), dtype=torch.float32, device=input.device),
            torch.empty(grad_shape, dtype=input.dtype, device=input.device))


jsd_with_grad_op = define_op(
    "jsd_with_grad(Tensor input, Tensor target, Tensor? shift_labels, float beta, int ignore_index, "
    "bool compute_grad) -> (Tensor, Tensor)",
    kernel=jsd_forward,
    fake=_jsd_with_grad_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.computed = inputs[5]
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_loss, _):
    check_computed(ctx, (ctx.computed,), "jsd", grad_loss)
    (grad,) = ctx.saved_tensors
    grad_input = scaled(grad, grad_loss, "mean") if ctx.needs_input_grad[0] else None
    return grad_input, None, None, None, None, None


define_autograd(jsd_with_grad_op, backward=_backward, setup_context=_setup_context)


def _jsd_composite(input, target, shift_labels=None, beta=0.5, ignore_index=-100):
    return jsd_with_grad_op(input, target, shift_labels, beta, ignore_index, wants_grad(input))[0]


jsd_op = define_composite(
    "jsd(Tensor input, Tensor target, Tensor? shift_labels=None, float beta=0.5, int ignore_index=-100) -> Tensor",
    _jsd_composite,
)


class JsdEager(torch.autograd.Function):
    """Eager training calls: the forward's gradient is scaled in place by the backward (see ``_loss.py``)."""

    @staticmethod
    def forward(ctx, input, target, shift_labels, beta, ignore_index):
        loss, grad = jsd_forward(input, target, shift_labels, beta, ignore_index, True)
        ctx.grads = [grad]
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = take_grads(ctx, "jsd")
        return scale_in_place(grad, grad_loss, "mean"), None, None, None, None


def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor] = None, beta: float = 0.5,
        ignore_index: int = -100) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence of (BT, V) log-probabilities: ``torch.ops.npu_liger.jsd``.

    ``input`` is the student's log Q, ``target`` the teacher's log P. Per row: ``beta`` 0 gives KL(P || Q), 1 gives
    KL(Q || P), otherwise ``beta * KL(P || M) + (1 - beta) * KL(Q || M)`` with ``M = beta * P + (1 - beta) * Q``
    (Liger-Kernel's LigerJSD). Summed over V and rows, divided by the number of rows whose ``shift_labels`` entry
    is not ``ignore_index`` (all rows without labels; 0 when none is valid). The loss is float32; the gradient
    (input only, in its dtype) is computed in the forward pass when input needs it.
    """
    if eager_plain(input, target, shift_labels):
        if wants_grad(input):
            return JsdEager.apply(input, target, shift_labels, beta, ignore_index)
        return jsd_forward(input, target, shift_labels, beta, ignore_index, False)[0]
    return jsd_op(input, target, shift_labels, beta, ignore_index)
