"""npu_liger::fused_linear_jsd (public, returns the loss) on top of npu_liger::fused_linear_jsd_with_grad (internal:
the loss and, when asked, the student's grad_input / grad_weight from the same chunked pass): schema -> fake ->
device kernels -> autograd. See ``_loss.py`` for how the gradients travel from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._triton import serialized
from ..npu_ops.fused_linear_jsd import check_fused_linear_jsd_inputs, fused_linear_jsd_forward
from ._loss import check_computed, eager_plain, scale_in_place, scaled, take_grads, wants_grad
from ._op import define_autograd, define_composite, define_op

fused_linear_jsd_forward = serialized(fused_linear_jsd_forward)  # called directly below: one CPU launch at a time

__all__ = ["fused_linear_jsd"]

_NAME = "fused_linear_jsd"


def _with_grad_fake(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                    ignore_index, temperature, grad_input, grad_weight):
    check_fused_linear_jsd_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                  jsd_beta, ignore_index, temperature)
    device, dtype = student_input.device, student_input.dtype
    return (torch.empty((), dtype=torch.float32, device=device),
            torch.empty(tuple(student_input.shape) if grad_input else (0,), dtype=dtype, device=device),
            torch.empty(tuple(student_weight.shape) if grad_weight else (0,), dtype=dtype, device=device))


with_grad_op = define_op(
    f"{_NAME}_with_grad(Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight, "
    "Tensor? shift_labels, float jsd_beta, int ignore_index, float temperature, bool grad_input, bool grad_weight)"
    " -> (Tensor, Tensor, Tensor)",
    kernel=fused_linear_jsd_forward,
    fake=_with_grad_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.flags = inputs[8:10]
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*output[1:])


def _backward(ctx, grad_loss, *_):
    input_flag, weight_flag = ctx.flags
    check_computed(ctx, (input_flag, weight_flag), _NAME, grad_loss)
    needs = ctx.needs_input_grad
    grad_input, grad_weight = (scaled(g, grad_loss, "mean") if need else None
                               for g, need in zip(ctx.saved_tensors, needs[:2]))
    return grad_input, grad_weight, None, None, None, None, None, None, None, None


define_autograd(with_grad_op, backward=_backward, setup_context=_setup_context)


def _composite(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None, jsd_beta=0.5,
               ignore_index=-100, temperature=1.0):
    return with_grad_op(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                        ignore_index, temperature, wants_grad(student_input), wants_grad(student_weight))[0]


fused_linear_jsd_op = define_composite(
    f"{_NAME}(Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight, "
    "Tensor? shift_labels=None, float jsd_beta=0.5, int ignore_index=-100, float temperature=1.0) -> Tensor",
    _composite,
)


class FusedLinearJsdEager(torch.autograd.Function):
    """Eager training calls: the forward's gradients are scaled in place by the backward."""

    @staticmethod
    def forward(ctx, student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                ignore_index, temperature, grad_input, grad_weight):
        loss, *grads = fused_linear_jsd_forward(student_input, student_weight, teacher_input, teacher_weight,
                                                shift_labels, jsd_beta, ignore_index, temperature, grad_input,
                                                grad_weight)
        ctx.grads, ctx.flags = grads, (grad_input, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grads = take_grads(ctx, _NAME)
        gx, gw = (scale_in_place(g, grad_loss, "mean") if flag else None for g, flag in zip(grads, ctx.flags))
        return gx, gw, None, None, None, None, None, None, None, None


def fused_linear_jsd(student_input: torch.Tensor, student_weight: torch.Tensor, teacher_input: torch.Tensor,
                     teacher_weight: torch.Tensor, shift_labels: Optional[torch.Tensor] = None, jsd_beta: float = 0.5,
                     ignore_index: int = -100, temperature: float = 1.0) -> torch.Tensor:
    """``jsd(log_softmax(student_input @ student_weight.T / temperature), log_softmax(teacher_input @
    teacher_weight.T / temperature), shift_labels, jsd_beta, ignore_index)`` for inputs (BT, H) / (BT, H') and
    weights (V, H) / (V, H'), computed in chunks of rows so neither model's (BT, V) logits exist:
    ``torch.ops.npu_liger.fused_linear_jsd``.

    The loss is float32. Gradients for student_input and student_weight, in their dtype, are computed chunk by
    chunk in the forward pass (those that are needed); the teacher gets none.
    """
    if eager_plain(student_input, student_weight, teacher_input, teacher_weight, shift_labels):
        flags = (wants_grad(student_input), wants_grad(student_weight))
        if any(flags):
            return FusedLinearJsdEager.apply(student_input, student_weight, teacher_input, teacher_weight,
                                             shift_labels, jsd_beta, ignore_index, temperature, *flags)
        return fused_linear_jsd_forward(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                        jsd_beta, ignore_index, temperature)[0]
    return fused_linear_jsd_op(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                               ignore_index, temperature)
