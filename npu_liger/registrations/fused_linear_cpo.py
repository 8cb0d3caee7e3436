"""npu_liger::fused_linear_cpo (public) on npu_liger::fused_linear_cpo_with_grad (internal), made by the preference
losses' factory (``_preference.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops._preference import check_margin_inputs
from ..npu_ops.fused_linear_cpo import fused_linear_cpo_forward
from ._preference import MARGIN_ARGUMENTS, PAIR_OUTPUTS, define_preference_loss, pair_shapes

__all__ = ["fused_linear_cpo"]

_fused_linear_cpo_entry = define_preference_loss(
    "fused_linear_cpo", MARGIN_ARGUMENTS + [("bool", "average_log_prob", "False")], PAIR_OUTPUTS,
    fused_linear_cpo_forward, lambda *args: check_margin_inputs(*args[:4], args[5], args[6], args[7], 0.0),
    pair_shapes)


def fused_linear_cpo(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                     alpha: float = 1.0, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                     average_log_prob: bool = False):
    """CPO's loss ``-logsigmoid(beta * (c - r))`` (label smoothing as DPO's) plus alpha times the chosen sequences'
    NLL (``compute_nll_loss``), of the policy's hidden states input (N, T, H), chosen first then rejected, projected
    chunk by chunk: ``torch.ops.npu_liger.fused_linear_cpo``. Log-probabilities are sums over the valid tokens
    (``average_log_prob``: means). Returns the outputs of ``fused_linear_dpo``; only the loss has a gradient.
    """
    return _fused_linear_cpo_entry(input, weight, target, bias, ignore_index, beta, alpha, label_smoothing,
                                   compute_nll_loss, average_log_prob)
