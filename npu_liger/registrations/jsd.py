"""npu_liger::jsd (public, returns the loss) on top of npu_liger::jsd_with_grad (internal: the loss and, when
asked, the gradient w.r.t. input from the same pass): schema -> fake -> device kernels -> autograd -> sharding.
See ``_loss.py`` for how the gradient travels from the forward to the backward."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.jsd import check_jsd_inputs, jsd_forward
from ._loss import check_computed, scale_in_place, scaled, take_grads, wants_grad
from ._op import EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule

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


@sharding_rule(jsd_op)
def _jsd_sharding(pl, *args):
    """The divisor counts the GLOBAL valid rows, so rows may not be sharded; the terms are elementwise over
    log-probabilities, so the vocabulary may: input and target S(1), labels R -> the loss P."""
    return [pl.case(pl.R), pl.case(pl.P, input=pl.S(1), target=pl.S(1))]


@sharding_rule(jsd_with_grad_op)
def _jsd_with_grad_sharding(pl, *args):
    """(loss, grad): the gradient follows the vocabulary (an empty (0,) one, not asked for, is replicated)."""
    grad = pl.S(1) if pl.arg("compute_grad") else pl.R
    return [pl.case([pl.R, pl.R]), pl.case([pl.P, grad], input=pl.S(1), target=pl.S(1))]


def _loss_only(input, target, shift_labels, beta, ignore_index):
    return jsd_forward(input, target, shift_labels, beta, ignore_index, False)[0]


def _eager_forward(ctx, input, target, shift_labels, beta, ignore_index):
    """Eager training calls: the forward keeps its gradient for the backward to scale in place (``_loss.py``)."""
    loss, grad = jsd_forward(input, target, shift_labels, beta, ignore_index, True)
    ctx.grads = [grad]
    return loss


def _eager_backward(ctx, grad_loss):
    (grad,) = take_grads(ctx, "jsd")
    return scale_in_place(grad, grad_loss), None, None, None, None


def _student_needs_grad(input, *args) -> bool:
    return input.requires_grad  # a teacher (target) needing a gradient gets none: the op, which gives None


_jsd_entry = define_entry(jsd_op, kernel=_loss_only,
                          eager=EagerPath(_eager_forward, _eager_backward, applies=_student_needs_grad))


def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor] = None, beta: float = 0.5,
        ignore_index: int = -100) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence of (BT, V) log-probabilities: ``torch.ops.npu_liger.jsd``.

    ``input`` is the student's log Q, ``target`` the teacher's log P. Per row: ``beta`` 0 gives KL(P || Q), 1 gives
    KL(Q || P), otherwise ``beta * KL(P || M) + (1 - beta) * KL(Q || M)`` with ``M = beta * P + (1 - beta) * Q``
    (Liger-Kernel's LigerJSD). Summed over V and rows, divided by the number of rows whose ``shift_labels`` entry
    is not ``ignore_index`` (all rows without labels; 0 when none is valid). The loss is float32; the gradient
    (input only, in its dtype; the target gets none) is computed in the forward pass when input needs it.
    """
    return _jsd_entry(input, target, shift_labels, beta, ignore_index)
