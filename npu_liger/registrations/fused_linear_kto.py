"""npu_liger::fused_linear_kto (public) on npu_liger::fused_linear_kto_with_grad (internal), made by the preference
losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_kto import check_kto_inputs, fused_linear_kto_forward
from ._preference import define_preference_loss

__all__ = ["fused_linear_kto"]

_fused_linear_kto_entry = define_preference_loss(
    "fused_linear_kto",
    [("Tensor", "input", ""), ("Tensor", "weight", ""), ("Tensor", "target", ""), ("Tensor", "preference_labels", ""),
     ("Tensor?", "bias", "None"), ("Tensor?", "ref_input", "None"), ("Tensor?", "ref_weight", "None"),
     ("Tensor?", "ref_bias", "None"), ("Tensor?", "ref_logps", "None"), ("Tensor?", "kl", "None"),
     ("int", "ignore_index", "-100"), ("float", "beta", "0.1"), ("bool", "average_log_prob", "False")],
    ("loss", "chosen_logps_sum", "rejected_logps_sum", "chosen_logits_sum", "rejected_logits_sum",
     "chosen_rewards_sum", "rejected_rewards_sum"), fused_linear_kto_forward, check_kto_inputs,
    lambda input: [()] * 7)


def fused_linear_kto(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, preference_labels: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                     ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None,
                     ref_logps: Optional[torch.Tensor] = None, kl: Optional[torch.Tensor] = None,
                     ignore_index: int = -100, beta: float = 0.1, average_log_prob: bool = False):
    """KTO's loss ``mean(1 - sigmoid(beta * (logp - ref_logp - kl) * (+-1)))`` over unpaired sequences input
    (N, T, H), each desirable where ``preference_labels`` (N,) is True, projected chunk by chunk:
    ``torch.ops.npu_liger.fused_linear_kto``. The reference is ref_input / ref_weight / ref_bias (no gradient), or
    precomputed ``ref_logps`` (N,), or absent (0); ``kl`` is TRL's detached 0-d KL estimate (absent: 0).

    Returns ``(loss, chosen_logps_sum, rejected_logps_sum, chosen_logits_sum, rejected_logits_sum,
    chosen_rewards_sum, rejected_rewards_sum)`` (sums over the desirable and the undesirable sequences); only the
    loss has a gradient.
    """
    return _fused_linear_kto_entry(input, weight, target, preference_labels, bias, ref_input, ref_weight, ref_bias,
                                   ref_logps, kl, ignore_index, beta, average_log_prob)
