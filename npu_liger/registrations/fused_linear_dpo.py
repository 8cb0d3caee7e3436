"""npu_liger::fused_linear_dpo (public) on npu_liger::fused_linear_dpo_with_grad (internal), made by the preference
losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_dpo import check_dpo_inputs, fused_linear_dpo_forward
from ._preference import PAIR_OUTPUTS, define_preference_loss, pair_shapes

__all__ = ["fused_linear_dpo"]

_fused_linear_dpo_entry = define_preference_loss(
    "fused_linear_dpo",
    [("Tensor", "input", ""), ("Tensor", "weight", ""), ("Tensor", "target", ""), ("Tensor?", "bias", "None"),
     ("Tensor?", "ref_input", "None"), ("Tensor?", "ref_weight", "None"), ("Tensor?", "ref_bias", "None"),
     ("Tensor?", "ref_chosen_logps", "None"), ("Tensor?", "ref_rejected_logps", "None"),
     ("int", "ignore_index", "-100"), ("float", "beta", "0.1"), ("float", "label_smoothing", "0.0"),
     ("bool", "compute_nll_loss", "False"), ("float", "alpha", "1.0"), ("bool", "average_log_prob", "False")],
    PAIR_OUTPUTS, fused_linear_dpo_forward, check_dpo_inputs, pair_shapes)


def fused_linear_dpo(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                     ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None,
                     ref_chosen_logps: Optional[torch.Tensor] = None, ref_rejected_logps: Optional[torch.Tensor] = None,
                     ignore_index: int = -100, beta: float = 0.1, label_smoothing: float = 0.0,
                     compute_nll_loss: bool = False, alpha: float = 1.0, average_log_prob: bool = False):
    """DPO's sigmoid loss (label smoothing: cDPO, as TRL's) of the policy's hidden states input (N, T, H), chosen
    sequences first then rejected, projected by weight (V, H) and bias (V,) chunk by chunk, so no (N * T, V)
    logits exist: ``torch.ops.npu_liger.fused_linear_dpo``. The reference is ref_input (N, T, H') with ref_weight
    (V, H') and ref_bias (no gradient), or precomputed ref_chosen_logps / ref_rejected_logps (N / 2,), or absent
    (0). Tokens whose target is ignore_index count for nothing; ``average_log_prob`` averages the log-probabilities
    over the valid tokens instead of summing them; ``compute_nll_loss`` adds alpha times the chosen sequences' NLL.

    Returns ``(loss, chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss,
    chosen_rewards, rejected_rewards)``, all fp32; only the loss has a gradient (for input, weight and bias,
    computed in the forward pass).
    """
    return _fused_linear_dpo_entry(input, weight, target, bias, ref_input, ref_weight, ref_bias, ref_chosen_logps,
                                   ref_rejected_logps, ignore_index, beta, label_smoothing, compute_nll_loss, alpha,
                                   average_log_prob)
