"""Fused linear CPO (Xu et al. 2024, https://arxiv.org/abs/2401.08417): SimPO's loss with gamma = 0 and, by
default, summed sequence log-probabilities (``fused_linear_simpo.py``), plus alpha times the chosen sequences' NLL
(on by default)."""

from __future__ import annotations

from typing import Optional

import torch

from ._preference import margin_forward


def fused_linear_cpo_forward(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                             alpha: float = 1.0, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                             average_log_prob: bool = False, grad_input: bool = False, grad_weight: bool = False,
                             grad_bias: bool = False) -> tuple:
    """(loss, chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards, grad_input, grad_weight, grad_bias)."""
    return margin_forward(input, weight, target, bias, ignore_index, beta, alpha, label_smoothing, compute_nll_loss,
                          0.0, average_log_prob, grad_input, grad_weight, grad_bias)
