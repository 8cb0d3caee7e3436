"""npu_liger::fused_linear_orpo (public) on npu_liger::fused_linear_orpo_with_grad (internal), made by the preference
losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.fused_linear_orpo import check_orpo_inputs, fused_linear_orpo_forward
from ._preference import PAIR_OUTPUTS, define_preference_loss, pair_shapes

__all__ = ["fused_linear_orpo"]

_fused_linear_orpo_entry = define_preference_loss(
    "fused_linear_orpo",
    [("Tensor", "input", ""), ("Tensor", "weight", ""), ("Tensor", "target", ""), ("Tensor?", "bias", "None"),
     ("int", "ignore_index", "-100"), ("float", "beta", "0.1"), ("bool", "compute_nll_loss", "True")],
    PAIR_OUTPUTS + ("log_odds_ratio", "log_odds_chosen"), fused_linear_orpo_forward, check_orpo_inputs,
    lambda input: pair_shapes(input, 2))


def fused_linear_orpo(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                      bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                      compute_nll_loss: bool = True):
    """ORPO's odds-ratio loss (plus the chosen sequences' NLL with ``compute_nll_loss``) of the policy's hidden
    states input (N, T, H), chosen sequences first then rejected, projected chunk by chunk:
    ``torch.ops.npu_liger.fused_linear_orpo``. Log-probabilities are means over the valid tokens (Liger's).

    Returns the outputs of ``fused_linear_dpo`` (rewards beta * log-probabilities) and ``log_odds_ratio``,
    ``log_odds_chosen``; only the loss has a gradient.
    """
    return _fused_linear_orpo_entry(input, weight, target, bias, ignore_index, beta, compute_nll_loss)
