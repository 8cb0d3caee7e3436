"""npu_liger::fused_linear_grpo (public) on npu_liger::fused_linear_grpo_with_grad (internal), made by the
preference losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_grpo import check_grpo_linear_inputs, fused_linear_grpo_forward
from ._preference import define_preference_loss

__all__ = ["fused_linear_grpo"]

_fused_linear_grpo_entry = define_preference_loss(
    "fused_linear_grpo",
    [("Tensor", "input", ""), ("Tensor", "weight", ""), ("Tensor", "selected_token_ids", ""),
     ("Tensor", "attention_mask", ""), ("Tensor", "advantages", ""), ("Tensor?", "bias", "None"),
     ("Tensor?", "ref_input", "None"), ("Tensor?", "ref_weight", "None"), ("Tensor?", "ref_bias", "None"),
     ("Tensor?", "ref_per_token_logps", "None"), ("Tensor?", "old_per_token_logps", "None"),
     ("float", "beta", "0.04"), ("float", "epsilon_low", "0.2"), ("float", "epsilon_high", "0.2"),
     ("float", "temperature", "1.0"), ("str", "loss_type", '"dapo"'), ("int?", "max_completion_length", "None")],
    ("loss", "kl_mean", "clip_ratio"), fused_linear_grpo_forward, check_grpo_linear_inputs, lambda input: [()] * 3)


def fused_linear_grpo(input: torch.Tensor, weight: torch.Tensor, selected_token_ids: torch.Tensor,
                      attention_mask: torch.Tensor, advantages: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      ref_input: Optional[torch.Tensor] = None, ref_weight: Optional[torch.Tensor] = None,
                      ref_bias: Optional[torch.Tensor] = None, ref_per_token_logps: Optional[torch.Tensor] = None,
                      old_per_token_logps: Optional[torch.Tensor] = None, beta: float = 0.04,
                      epsilon_low: float = 0.2, epsilon_high: float = 0.2, temperature: float = 1.0,
                      loss_type: str = "dapo", max_completion_length: Optional[int] = None):
    """GRPO's per-token clipped policy loss with a k3 KL penalty (beta) to a reference, from (B, T, H) hidden
    states projected chunk by chunk: ``torch.ops.npu_liger.fused_linear_grpo``. The reference is ref_input /
    ref_weight / ref_bias (no gradient) or ref_per_token_logps (B, T); needed when beta != 0, unused when beta = 0.
    old_per_token_logps (B, T): the sampling policy's (absent: the ratio is 1). loss_type: "grpo", "bnpo",
    "dr_grpo" (with max_completion_length, default T) or "dapo" (grpo_loss's normalisations).

    Returns ``(loss, kl_mean, clip_ratio)``; only the loss has a gradient (w.r.t. input, weight, bias).
    """
    return _fused_linear_grpo_entry(input, weight, selected_token_ids, attention_mask, advantages, bias, ref_input,
                                    ref_weight, ref_bias, ref_per_token_logps, old_per_token_logps, beta,
                                    epsilon_low, epsilon_high, temperature, loss_type, max_completion_length)
