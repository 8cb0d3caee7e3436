"""npu_liger::fused_linear_jsd (public, returns the loss) on top of npu_liger::fused_linear_jsd_with_grad (internal:
the loss and, when asked, the student's grad_input / grad_weight from the same chunked pass): schema -> fake ->
device kernels -> autograd -> sharding. See ``_loss.py`` for how the gradients travel from the forward to the
backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_jsd import check_fused_linear_jsd_inputs, fused_linear_jsd_forward
from ._loss import check_computed, scale_in_place, scaled, take_grads, wants_grad
from ._op import CHUNKED_LOSS, EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule

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
    opaque_in_graphs=CHUNKED_LOSS,
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


@sharding_rule(fused_linear_jsd_op)
def _fused_linear_jsd_sharding(pl, *args):
    """Replicated only: the log-softmax runs over the whole vocabulary (no vocabulary-parallel weights) and the
    divisor counts the GLOBAL valid rows (no row sharding); sharded inputs are gathered first."""
    return [pl.case(pl.R)]


@sharding_rule(with_grad_op)
def _fused_linear_jsd_with_grad_sharding(pl, *args):
    return [pl.case([pl.R] * 3)]


def _loss_only(*args):
    return fused_linear_jsd_forward(*args)[0]


def _eager_forward(ctx, student_input, student_weight, *args):
    """Eager training calls: the forward keeps the student's gradients for the backward to scale in place."""
    ctx.flags = (student_input.requires_grad, student_weight.requires_grad)
    loss, *ctx.grads = fused_linear_jsd_forward(student_input, student_weight, *args, *ctx.flags)
    return loss


def _eager_backward(ctx, grad_loss):
    grads = take_grads(ctx, _NAME)
    gx, gw = (scale_in_place(g, grad_loss) if flag else None for g, flag in zip(grads, ctx.flags))
    return gx, gw, None, None, None, None, None, None


def _student_needs_grad(student_input, student_weight, *args) -> bool:
    return student_input.requires_grad or student_weight.requires_grad  # else the op: the teacher gets None


_fused_linear_jsd_entry = define_entry(fused_linear_jsd_op, kernel=_loss_only,
                                       eager=EagerPath(_eager_forward, _eager_backward, applies=_student_needs_grad))


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
    return _fused_linear_jsd_entry(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                   jsd_beta, ignore_index, temperature)
