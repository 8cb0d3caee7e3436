"""Fused linear ORPO (Hong et al. 2024, https://arxiv.org/abs/2403.07691): per pair, with the policy's mean token
log-probabilities c (chosen) and r (rejected) (Liger's ``average_log_prob=True``),

    log_odds = (c - r) - (log(1 - exp(c)) - log(1 - exp(r)))
    loss     = -beta * mean logsigmoid(log_odds)  (+ NLL of the chosen sequences, weight 1, with compute_nll_loss)

with ``d log_odds / d c = 1 / (1 - exp(c))`` and ``d log_odds / d r = -1 / (1 - exp(r))``. No reference model.
Outputs: ``_preference.pair_outputs`` (rewards beta * c, beta * r), then log_odds_ratio (the mean logsigmoid) and
log_odds_chosen (the mean log_odds), as Liger's.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._preference import check_beta, check_linear_inputs, pair_forward, pair_outputs


def check_orpo_inputs(input, weight, target, bias, ignore_index, beta, compute_nll_loss) -> None:
    check_linear_inputs(input, weight, target, bias, None, None, None, paired=True)
    check_beta("beta", beta)


def _log1mexp(v):
    """log(1 - e^v) for v <= 0, to a few roundings (Maechler, "Accurately computing log(1 - exp(-|a|))"): near 0,
    1 - e^v from a rounded e^v keeps few digits, so it is -expm1(v) there; below -log 2, log1p(-e^v)."""
    return torch.where(v > -0.6931471805599453, torch.log(-torch.expm1(v)), torch.log1p(-torch.exp(v)))


def _log_odds(chosen, rejected):
    return (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))


def fused_linear_orpo_forward(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                              bias: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                              compute_nll_loss: bool = True, grad_input: bool = False, grad_weight: bool = False,
                              grad_bias: bool = False) -> tuple:
    """(loss, chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards, log_odds_ratio, log_odds_chosen, grad_input, grad_weight, grad_bias)."""
    check_orpo_inputs(input, weight, target, bias, ignore_index, beta, compute_nll_loss)

    def terms(chosen, rejected, ref_chosen, ref_rejected):
        log_odds = _log_odds(chosen, rejected)
        d_log_odds = torch.sigmoid(-log_odds) * -beta
        return (-F.logsigmoid(log_odds) * beta, d_log_odds / -torch.expm1(chosen),
                d_log_odds / torch.expm1(rejected))

    loss, pairs, *grads = pair_forward(input, weight, target, bias, None, None, None, None, ignore_index, True,
                                       1.0 if compute_nll_loss else None, terms, grad_input, grad_weight, grad_bias)
    log_odds = _log_odds(pairs.chosen, pairs.rejected)
    n = float(max(pairs.chosen.shape[0], 1))
    return pair_outputs(loss, pairs, beta, grads, F.logsigmoid(log_odds).sum() / n, log_odds.sum() / n)
