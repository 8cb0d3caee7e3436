"""Fused linear SimPO (Meng et al. 2024, https://arxiv.org/abs/2405.14734) and CPO (Xu et al. 2024,
https://arxiv.org/abs/2401.08417): per pair, with the policy's sequence log-probabilities c (chosen) and r
(rejected), no reference model,

    z    = beta * (c - r) - gamma
    loss = mean [-(1 - eps) logsigmoid(z) - eps logsigmoid(-z)]  (+ alpha * NLL of the chosen sequences)

SimPO length-normalises (c and r are the mean token log-probabilities, Liger's ``average_log_prob=True``); CPO is
the same loss with gamma = 0 and summed log-probabilities by default (``fused_linear_cpo.py``); both are
``_preference.margin_forward``. Outputs: ``_preference.pair_outputs`` (rewards beta * c, beta * r).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._preference import margin_forward


def fused_linear_simpo_forward(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                               alpha: float = 1.0, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                               gamma: float = 0.5, grad_input: bool = False, grad_weight: bool = False,
                               grad_bias: bool = False) -> tuple:
    """(loss, chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards, grad_input, grad_weight, grad_bias)."""
    return margin_forward(input, weight, target, bias, ignore_index, beta, alpha, label_smoothing, compute_nll_loss,
                          gamma, True, grad_input, grad_weight, grad_bias)
