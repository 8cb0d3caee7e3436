"""npu_liger::grpo_loss (public: the loss and the statistics TRL logs) on top of npu_liger::grpo_loss_with_grad
(internal: the same and, when asked, the gradient w.r.t. logits from the same pass): schema -> fake -> device
kernels -> autograd -> sharding. See ``_loss.py`` for how the gradient travels from the forward to the backward."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..npu_ops.grpo_loss import check_grpo_inputs, grpo_loss_forward
from ._loss import check_computed, scale_in_place, scaled, take_grads, wants_grad
from ._op import EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule

__all__ = ["grpo_loss"]

_ARGS = ("Tensor logits, Tensor completion_ids, Tensor advantages, Tensor? completion_mask{d0}, Tensor? old_logp{d0}, "
         "Tensor? ref_logp{d0}, float temperature{d1}, float beta{d2}, float eps_low{d3}, float eps_high{d3}, "
         "str loss_type{d4}, int? max_completion_length{d0}, Tensor? num_items_in_batch{d0}")
_DEFAULTS = dict(d0="=None", d1="=1.0", d2="=0.0", d3="=0.2", d4='="dapo"')
_OUTPUTS = "(Tensor loss, Tensor per_token_kl, Tensor is_clipped, Tensor clip_ratio"


def _with_grad_fake(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature, beta,
                    eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch, compute_grad):
    check_grpo_inputs(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature, beta,
                      eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch)
    device, per_token = logits.device, tuple(completion_ids.shape)
    return (torch.empty((), dtype=torch.float32, device=device),
            torch.empty(per_token, dtype=torch.float32, device=device),
            torch.empty(per_token, dtype=torch.float32, device=device),
            torch.empty((), dtype=torch.float32, device=device),
            torch.empty(tuple(logits.shape) if compute_grad else (0,), dtype=logits.dtype, device=device))


with_grad_op = define_op(
    f"grpo_loss_with_grad({_ARGS.format(**dict.fromkeys(_DEFAULTS, ''))}, bool compute_grad) -> "
    f"{_OUTPUTS}, Tensor grad_logits)",
    kernel=grpo_loss_forward,
    fake=_with_grad_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.computed = inputs[13]
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(output[4])


def _backward(ctx, grad_loss, *_):
    check_computed(ctx, (ctx.computed,), "grpo_loss", grad_loss)
    (grad,) = ctx.saved_tensors
    grad_logits = scaled(grad, grad_loss, "mean") if ctx.needs_input_grad[0] else None
    return (grad_logits,) + (None,) * 13


define_autograd(with_grad_op, backward=_backward, setup_context=_setup_context)


def _composite(logits, completion_ids, advantages, completion_mask=None, old_logp=None, ref_logp=None,
               temperature=1.0, beta=0.0, eps_low=0.2, eps_high=0.2, loss_type="dapo", max_completion_length=None,
               num_items_in_batch=None):
    return with_grad_op(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature, beta,
                        eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch,
                        wants_grad(logits))[:4]


grpo_loss_op = define_composite(f"grpo_loss({_ARGS.format(**_DEFAULTS)}) -> {_OUTPUTS})", _composite)


@sharding_rule(grpo_loss_op)
def _grpo_loss_sharding(pl, *args):
    """Replicated only: every loss type's divisor and clip_ratio count the whole batch (sequences, tokens or B);
    sharded inputs are gathered first."""
    return [pl.case([pl.R] * 4)]


@sharding_rule(with_grad_op)
def _grpo_loss_with_grad_sharding(pl, *args):
    return [pl.case([pl.R] * 5)]


def _statistics(*args):
    return grpo_loss_forward(*args)[:4]


def _eager_forward(ctx, *args):
    """Eager training calls: the forward keeps its gradient for the backward to scale in place (``_loss.py``)."""
    loss, kl, clipped, clip_ratio, grad = grpo_loss_forward(*args, True)
    ctx.grads = [grad]
    ctx.mark_non_differentiable(kl, clipped, clip_ratio)
    return loss, kl, clipped, clip_ratio


def _eager_backward(ctx, grad_loss, *_):
    (grad,) = take_grads(ctx, "grpo_loss")
    return (scale_in_place(grad, grad_loss),) + (None,) * 12


def _logits_need_grad(logits, *args) -> bool:
    return logits.requires_grad  # the other inputs are constants (TRL detaches them): the op, which gives None


_grpo_loss_entry = define_entry(grpo_loss_op, kernel=_statistics,
                                eager=EagerPath(_eager_forward, _eager_backward, applies=_logits_need_grad))


def grpo_loss(logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor,
              completion_mask: Optional[torch.Tensor] = None, old_logp: Optional[torch.Tensor] = None,
              ref_logp: Optional[torch.Tensor] = None, temperature: float = 1.0, beta: float = 0.0,
              eps_low: float = 0.2, eps_high: float = 0.2, loss_type: str = "dapo",
              max_completion_length: Optional[int] = None,
              num_items_in_batch: Union[torch.Tensor, int, float, None] = None
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's GRPO policy loss from logits (B, L + 1, V) or (B, L, V) and completion ids (B, L):
    ``torch.ops.npu_liger.grpo_loss``. Returns ``(loss, per_token_kl, is_clipped, clip_ratio)``.

    Per token: the importance ratio ``exp(logp - old_logp)`` (1 without old_logp), clipped to ``[1 - eps_low,
    1 + eps_high]`` PPO-style against the sequence's advantage, plus ``beta`` times the k3 KL estimate to
    ``ref_logp`` (required when beta != 0; beta defaults to TRL's 0.0, ``npu_liger.nn.GRPOLoss``'s to Liger's
    0.04); logp is the log-softmax of ``logits / temperature`` at the completion id. ``loss_type``: ``"grpo"``
    (per-sequence token mean, then the batch mean), ``"bnpo"`` (token mean over the batch), ``"dr_grpo"`` (sum /
    (B * max_completion_length), default L) or ``"dapo"`` (sum / num_items_in_batch: TRL's global token count
    divided by the number of processes; the batch's token count without it). Tokens
    whose ``completion_mask`` is 0 count for nothing. The loss (fp32) is differentiable w.r.t. logits (the gradient
    is computed in the forward pass when logits need it); per_token_kl (B, L), is_clipped (B, L, 0./1.) and
    clip_ratio (their masked mean) are statistics to log, without gradient. Nothing synchronises the host.
    """
    if num_items_in_batch is not None and not isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = torch.tensor(float(num_items_in_batch), device=logits.device)
    return _grpo_loss_entry(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature,
                            beta, eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch)
