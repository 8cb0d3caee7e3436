"""npu_liger::fused_linear_simpo (public) on npu_liger::fused_linear_simpo_with_grad (internal), made by the
preference losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._preference import check_margin_inputs
from ..npu_ops.fused_linear_simpo import fused_linear_simpo_forward
from ._preference import MARGIN_ARGUMENTS, PAIR_OUTPUTS, define_preference_loss, pair_shapes

__all__ = ["fused_linear_simpo"]

_fused_linear_simpo_entry = define_preference_loss(
    "fused_linear_simpo", MARGIN_ARGUMENTS + [("float", "gamma", "0.5")], PAIR_OUTPUTS, fused_linear_simpo_forward,
    lambda *args: check_margin_inputs(*args[:4], args[5], args[6], args[7], args[9]), pair_shapes)


def fused_linear_simpo(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                       bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                       alpha: float = 1.0, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                       gamma: float = 0.5):
    """SimPO's loss ``-logsigmoid(beta * (c - r) - gamma)`` (label smoothing as DPO's; plus alpha times the chosen
    sequences' NLL with ``compute_nll_loss``) of mean token log-probabilities c, r of the policy's hidden states
    input (N, T, H), chosen first then rejected, projected chunk by chunk: ``torch.ops.npu_liger.fused_linear_simpo``.
    Returns the outputs of ``fused_linear_dpo`` (rewards beta * log-probabilities); only the loss has a gradient.
    """
    return _fused_linear_simpo_entry(input, weight, target, bias, ignore_index, beta, alpha, label_smoothing,
                                     compute_nll_loss, gamma)
