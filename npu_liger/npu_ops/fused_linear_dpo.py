"""Fused linear DPO (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290, sigmoid loss with TRL's label smoothing,
cDPO): per pair i, with the policy's sequence log-probabilities c_i (chosen) and r_i (rejected) and the reference
model's rc_i, rr_i (0 without a reference, as Liger's),

    z_i    = beta * ((c_i - rc_i) - (r_i - rr_i))
    loss   = mean_i [-(1 - eps) logsigmoid(z_i) - eps logsigmoid(-z_i)]  (+ alpha * NLL of the chosen sequences)

with ``d loss_i / d c_i = beta * (-(1 - eps) sigmoid(-z_i) + eps sigmoid(z_i))`` and the negative for r_i. The
sequence log-probabilities are sums over the valid tokens (``average_log_prob``: their mean), computed chunk by
chunk from the hidden states (``_preference.py``); the reference's come from ref_input / ref_weight (chunked, no
gradient) or precomputed (ref_chosen_logps, ref_rejected_logps). Outputs: see ``_preference.pair_outputs``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._preference import check_beta, check_label_smoothing, check_linear_inputs, check_per_row, pair_forward, \
    pair_outputs, sigmoid_terms


def check_dpo_inputs(input, weight, target, bias, ref_input, ref_weight, ref_bias, ref_chosen_logps,
                     ref_rejected_logps, ignore_index, beta, label_smoothing, compute_nll_loss, alpha,
                     average_log_prob) -> None:
    check_linear_inputs(input, weight, target, bias, ref_input, ref_weight, ref_bias, paired=True)
    n_pairs = input.shape[0] // 2
    check_per_row("ref_chosen_logps", ref_chosen_logps, (n_pairs,), input)
    check_per_row("ref_rejected_logps", ref_rejected_logps, (n_pairs,), input)
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("ref_chosen_logps and ref_rejected_logps go together")
    if ref_chosen_logps is not None and ref_input is not None:
        raise ValueError("give the reference model (ref_input, ref_weight) or its log-probabilities "
                         "(ref_chosen_logps, ref_rejected_logps), not both")
    check_beta("beta", beta)
    check_beta("alpha", alpha)
    check_label_smoothing(label_smoothing)


def fused_linear_dpo_forward(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                             ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None,
                             ref_chosen_logps: Optional[torch.Tensor] = None,
                             ref_rejected_logps: Optional[torch.Tensor] = None, ignore_index: int = -100,
                             beta: float = 0.1, label_smoothing: float = 0.0, compute_nll_loss: bool = False,
                             alpha: float = 1.0, average_log_prob: bool = False, grad_input: bool = False,
                             grad_weight: bool = False, grad_bias: bool = False) -> tuple:
    """(loss, chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards, grad_input, grad_weight, grad_bias); gradients for an incoming gradient of 1, each an empty
    (0,) tensor when not asked for."""
    check_dpo_inputs(input, weight, target, bias, ref_input, ref_weight, ref_bias, ref_chosen_logps,
                     ref_rejected_logps, ignore_index, beta, label_smoothing, compute_nll_loss, alpha,
                     average_log_prob)

    def terms(chosen, rejected, ref_chosen, ref_rejected):
        margin = (chosen - rejected) if ref_chosen is None else (chosen - ref_chosen) - (rejected - ref_rejected)
        loss, d_margin = sigmoid_terms(margin * beta, label_smoothing)
        return loss, d_margin * beta, d_margin * -beta

    ref_seq = None if ref_chosen_logps is None else torch.cat([ref_chosen_logps, ref_rejected_logps])
    loss, pairs, *grads = pair_forward(input, weight, target, bias, ref_input, ref_weight, ref_bias, ref_seq,
                                       ignore_index, average_log_prob, alpha if compute_nll_loss else None, terms,
                                       grad_input, grad_weight, grad_bias)
    return pair_outputs(loss, pairs, beta, grads)
