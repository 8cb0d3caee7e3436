"""Fused linear GRPO (LigerFusedLinearGRPOLoss's computation): the per-token GRPO loss of ``grpo_loss.py`` on the
per-token log-probabilities of ``log_softmax((input @ weight.T + bias) / temperature)[selected_token_ids]``,
computed chunk by chunk by the preference losses' core (``_preference.chunked_token_logps``, no (B * T, V) logits).

Per token with A = advantages[b], old = old_per_token_logps (logp, detached, without it), ref = the reference's
log-probability (from ref_input / ref_weight / ref_bias, or ref_per_token_logps):

    coef_1 = exp(logp - old),  coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss_t = -min(coef_1 * A, coef_2 * A) + beta * (exp(ref - logp) - (ref - logp) - 1)

and the loss is sum(w * loss_t) with grpo_loss's per-token weights w (``token_weights``: grpo, bnpo, dr_grpo,
dapo) from attention_mask. d loss / d logp = w * (-coef_1 * A where the unclipped term is the minimum, else 0,
+ beta * (1 - exp(ref - logp))), as grpo_loss's kernel. Outputs: the loss, the masked mean of the k3 KL (0 with
beta = 0, as nothing is computed then) and the clip ratio (grpo_loss's definition).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._preference import check_beta, check_linear_inputs, check_per_row, chunked_token_logps
from .grpo_loss import check_grpo_options, token_weights


def check_grpo_linear_inputs(input, weight, selected_token_ids, attention_mask, advantages, bias, ref_input,
                             ref_weight, ref_bias, ref_per_token_logps, old_per_token_logps, beta, epsilon_low,
                             epsilon_high, temperature, loss_type, max_completion_length) -> None:
    check_linear_inputs(input, weight, selected_token_ids, bias, ref_input, ref_weight, ref_bias, paired=False)
    shape = tuple(input.shape[:2])
    check_per_row("attention_mask", attention_mask, shape, input, kind="real")
    check_per_row("advantages", advantages, shape[:1], input)
    check_per_row("ref_per_token_logps", ref_per_token_logps, shape, input)
    check_per_row("old_per_token_logps", old_per_token_logps, shape, input)
    if ref_per_token_logps is not None and ref_input is not None:
        raise ValueError("give the reference model (ref_input, ref_weight) or its log-probabilities "
                         "(ref_per_token_logps), not both")
    check_beta("beta", beta)
    if beta != 0.0 and ref_input is None and ref_per_token_logps is None:
        raise ValueError(f"beta != 0 (got {beta}) needs the reference model (ref_input, ref_weight) or "
                         "ref_per_token_logps")
    check_grpo_options(temperature, beta, epsilon_low, epsilon_high, loss_type, max_completion_length)


def grpo_token_terms(logp, old, ref, advantages, beta, eps_low, eps_high):
    """(per-token loss, d loss / d logp, kl, is_clipped) of grpo_loss's kernel formula, in torch (fp32)."""
    coef_1 = torch.exp(logp - (logp.detach() if old is None else old))
    coef_2 = coef_1.clamp(1.0 - eps_low, 1.0 + eps_high)
    a = advantages.unsqueeze(-1)
    unclipped, clipped = coef_1 * a, coef_2 * a
    takes_clipped = clipped < unclipped
    loss = -torch.where(takes_clipped, clipped, unclipped)
    dlogp = torch.where(takes_clipped, 0.0, -unclipped)
    is_clipped = ((coef_1 < 1.0 - eps_low) & (a < 0.0)) | ((coef_1 > 1.0 + eps_high) & (a > 0.0))
    kl = torch.zeros_like(logp)
    if ref is not None and beta != 0.0:
        delta = ref - logp
        ratio = torch.exp(delta)
        kl = ratio - delta - 1.0
        loss = loss + kl * beta
        dlogp = dlogp + (1.0 - ratio) * beta
    return loss, dlogp, kl, is_clipped


def fused_linear_grpo_forward(input: torch.Tensor, weight: torch.Tensor, selected_token_ids: torch.Tensor,
                              attention_mask: torch.Tensor, advantages: torch.Tensor,
                              bias: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                              ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None,
                              ref_per_token_logps: Optional[torch.Tensor] = None,
                              old_per_token_logps: Optional[torch.Tensor] = None, beta: float = 0.04,
                              epsilon_low: float = 0.2, epsilon_high: float = 0.2, temperature: float = 1.0,
                              loss_type: str = "dapo", max_completion_length: Optional[int] = None,
                              grad_input: bool = False, grad_weight: bool = False, grad_bias: bool = False) -> tuple:
    """(loss, kl_mean, clip_ratio, grad_input, grad_weight, grad_bias)."""
    check_grpo_linear_inputs(input, weight, selected_token_ids, attention_mask, advantages, bias, ref_input,
                             ref_weight, ref_bias, ref_per_token_logps, old_per_token_logps, beta, epsilon_low,
                             epsilon_high, temperature, loss_type, max_completion_length)
    valid = attention_mask != 0
    ignore_index = -100
    target = torch.where(valid, selected_token_ids, ignore_index)
    w = token_weights(valid.to(torch.float32), loss_type, max_completion_length, None)
    adv = advantages.float()
    use_ref = beta != 0.0
    old_all = None if old_per_token_logps is None else old_per_token_logps.float()
    ref_all = None if ref_per_token_logps is None else ref_per_token_logps.float()

    def coefficients(index, token_logps, ref_tokens):
        ref = (ref_all[index] if ref_all is not None else ref_tokens) if use_ref else None
        old = None if old_all is None else old_all[index]
        _, dlogp, _, _ = grpo_token_terms(token_logps, old, ref, adv[index], beta, epsilon_low, epsilon_high)
        return torch.where(valid[index], dlogp * w[index], 0.0)

    ref_model = (ref_input, ref_weight, ref_bias) if use_ref else (None, None, None)
    out = chunked_token_logps(input, weight, target, bias, *ref_model, ignore_index, coefficients, False,
                              temperature, grad_input, grad_weight, grad_bias)
    ref = (ref_all if ref_all is not None else out.ref_logps) if use_ref else None
    loss_t, _, kl, is_clipped = grpo_token_terms(out.logps, old_all, ref, adv, beta, epsilon_low, epsilon_high)
    count = valid.sum().clamp_min(1).to(torch.float32)
    loss = torch.where(valid, loss_t * w, 0.0).sum()
    kl_mean = torch.where(valid, kl, 0.0).sum() / count
    clip_ratio = torch.where(valid & is_clipped, 1.0, 0.0).sum() / count
    return loss, kl_mean, clip_ratio, out.grad_input, out.grad_weight, out.grad_bias
