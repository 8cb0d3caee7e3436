"""Fused linear KTO (Ethayarajh et al. 2024, https://arxiv.org/abs/2402.01306), Liger's form: unpaired sequences,
each desirable (preference_labels True) or undesirable, with the policy's sequence log-probability s, the reference
model's rs (0 without one) and TRL's detached KL estimate kl (0-d; 0 without it),

    z    = beta * (s - rs - kl) * (+1 desirable, -1 undesirable)
    loss = mean over the N sequences of 1 - sigmoid(z)

with ``d loss_i / d s_i = -sigmoid(z) sigmoid(-z) * beta * (+-1)``. Log-probabilities are sums over the valid tokens
(``average_log_prob``: means). Outputs, as Liger's: the loss, then the sums over the desirable and the undesirable
sequences of the log-probabilities, of the logits (every position) and of the rewards beta * (s - rs).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._preference import check_beta, check_linear_inputs, check_per_row, chunked_token_logps, sequence_logps, \
    token_coefficients


def check_kto_inputs(input, weight, target, preference_labels, bias, ref_input, ref_weight, ref_bias, ref_logps, kl,
                     ignore_index, beta, average_log_prob) -> None:
    check_linear_inputs(input, weight, target, bias, ref_input, ref_weight, ref_bias, paired=False)
    check_per_row("preference_labels", preference_labels, input.shape[:1], input, kind="bool")
    check_per_row("ref_logps", ref_logps, input.shape[:1], input)
    check_per_row("kl", kl, (), input)
    if ref_logps is not None and ref_input is not None:
        raise ValueError("give the reference model (ref_input, ref_weight) or its log-probabilities (ref_logps), "
                         "not both")
    check_beta("beta", beta)


def fused_linear_kto_forward(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                             preference_labels: torch.Tensor, bias: Optional[torch.Tensor] = None,
                             ref_input: Optional[torch.Tensor] = None, ref_weight: Optional[torch.Tensor] = None,
                             ref_bias: Optional[torch.Tensor] = None, ref_logps: Optional[torch.Tensor] = None,
                             kl: Optional[torch.Tensor] = None, ignore_index: int = -100, beta: float = 0.1,
                             average_log_prob: bool = False, grad_input: bool = False, grad_weight: bool = False,
                             grad_bias: bool = False) -> tuple:
    """(loss, chosen_logps_sum, rejected_logps_sum, chosen_logits_sum, rejected_logits_sum, chosen_rewards_sum,
    rejected_rewards_sum, grad_input, grad_weight, grad_bias)."""
    check_kto_inputs(input, weight, target, preference_labels, bias, ref_input, ref_weight, ref_bias, ref_logps, kl,
                     ignore_index, beta, average_log_prob)
    n_seq = input.shape[0]
    valid = target != ignore_index
    sign = torch.where(preference_labels, 1.0, -1.0)
    divisor = 1.0 / max(n_seq, 1)

    def terms(index, seq, ref):
        logratio = seq if ref is None else seq - ref
        z = (logratio if kl is None else logratio - kl.float()) * sign[index] * beta
        return 1.0 - torch.sigmoid(z), torch.sigmoid(z) * torch.sigmoid(-z) * sign[index] * -beta

    def coefficients(index, token_logps, ref_tokens):
        chunk_valid = valid[index]
        seq = sequence_logps(token_logps, chunk_valid, average_log_prob)
        ref = ref_logps[index].float() if ref_logps is not None else \
            None if ref_tokens is None else sequence_logps(ref_tokens, chunk_valid, average_log_prob)
        return token_coefficients(terms(index, seq, ref)[1] * divisor, index, valid, average_log_prob)

    out = chunked_token_logps(input, weight, target, bias, ref_input, ref_weight, ref_bias, ignore_index,
                              coefficients, False, 1.0, grad_input, grad_weight, grad_bias)
    seq = sequence_logps(out.logps, valid, average_log_prob)
    ref = ref_logps.float() if ref_logps is not None else \
        None if out.ref_logps is None else sequence_logps(out.ref_logps, valid, average_log_prob)
    losses, _ = terms(torch.arange(n_seq, device=input.device), seq, ref)
    rewards = (seq if ref is None else seq - ref) * beta
    chosen = preference_labels

    def split(values):
        return torch.where(chosen, values, 0.0).sum(), torch.where(chosen, 0.0, values).sum()

    return (losses.sum() * divisor, *split(seq), *split(out.logits_sums), *split(rewards), out.grad_input,
            out.grad_weight, out.grad_bias)
