"""The chunked fused-linear core of the preference and policy losses (fused_linear_dpo, _orpo, _simpo, _cpo, _kto,
_grpo): per-token log-probabilities ``log_softmax(x @ weight.T + bias)[target]`` of a policy (and, without
gradient, of a reference model) without the (N * T, V) logits of either, and the gradients of a loss of them.

Inputs are (N, T, H) sequences with (N, T) targets (tokens whose target is ignore_index count for nothing). The
pair losses take Liger's and TRL's layout: the first N / 2 sequences are the chosen ones, the last N / 2 the
rejected ones, pair i = (i, N / 2 + i). A chunk holds whole units (a pair, or one sequence for the unpaired losses)
and as many as fit the rows of the fused linear losses' chunk policy (``_chunked.chunk_rows``). Per chunk of n rows:

    logits = x[rows] @ weight.T (+ bias)       torch's matmul into one (n, V) buffer (a pair's chosen and
                                               rejected rows side by side), in x's dtype; the reference model's
                                               into a second buffer, in its dtype
    the cross-entropy row kernel, loss only    -logp per token (``_cross_entropy_rows``, the losses' kernel)
    coefficients(...)                          the loss's torch formula on the chunk's tokens (fp32, on the
                                               device): c = d loss / d logp per token
    the row kernel again, scale -c / T         the buffer overwritten by d loss / d logits = c (onehot - softmax)
    grad_x[rows] = grad_logits @ weight, grad_weight += grad_logits.T @ x[rows], grad_bias += its column sums

so memory stays at one chunk of logits per model, as in fused_linear_cross_entropy (whose notes on grad_weight's
accumulation in weight's dtype apply unchanged). Every unit's loss depends on its own tokens only (a pair's on
its two sequences; the NLL term and the normalisers count the whole batch, from the targets, before the loop), so
the gradients come out of the forward pass, for an incoming gradient of 1 (the autograd formula scales them). A
second pass of the row kernel over the chunk (the first only gives the log-probabilities the coefficients need)
costs two reads of the chunk, little next to its three matmuls. Nothing synchronises the host.

The loss formulas (per pair, per sequence or per token) are the loss files' own; they give their closed-form
derivatives, and the loss and metrics are computed from the per-token log-probabilities of the whole batch after
the loop ((N, T) fp32, no (N, T, V) tensor).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from ._chunked import check_linear_head, check_second_head, chunk_rows
from ._cross_entropy_rows import launch_rows
from ._loss import TARGET_DTYPES, LossOptions, target_scale
from ._triton import check_float_tensor

# coefficients(seq_index (s,), token_logps (s, T), ref_token_logps (s, T) or None) -> d loss / d logp (s, T)
Coefficients = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


class TokenLogps(NamedTuple):
    """What the chunk loop gives: per-token log-probabilities (N, T) fp32 (0 where ignored), the reference's (or
    None), per-sequence sums of the policy's logits (N,) fp32, and the gradients asked for (else empty)."""
    logps: torch.Tensor
    ref_logps: Optional[torch.Tensor]
    logits_sums: torch.Tensor
    grad_input: torch.Tensor
    grad_weight: torch.Tensor
    grad_bias: torch.Tensor


def check_per_row(name: str, t: Optional[torch.Tensor], shape, input: torch.Tensor, kind: str = "float") -> None:
    """An optional per-sequence or per-token tensor of ``shape`` on input's device (float, bool or any real)."""
    if t is None:
        return
    if kind == "float":
        check_float_tensor(name, t)
    elif not isinstance(t, torch.Tensor) or t.is_complex() or (kind == "bool" and t.dtype != torch.bool):
        raise TypeError(f"{name} must be a {'bool' if kind == 'bool' else 'real'} tensor, got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != input.device:
        raise RuntimeError(f"{name} must be on the device of input ({input.device}), got {t.device}")


def check_beta(name: str, value: float) -> None:
    if not -float("inf") < value < float("inf"):
        raise ValueError(f"{name} must be finite, got {value}")


def check_linear_inputs(input, weight, target, bias, ref_input, ref_weight, ref_bias, paired: bool) -> None:
    """The policy's (N, T, H) input, (V, H) weight, (V,) bias, the (N, T) targets and, if given, the reference
    model's input (N, T, H'), weight (V, H') and bias (V,) (both or neither of input and weight)."""
    policy, reference = ("input", "weight", "bias"), ("ref_input", "ref_weight", "ref_bias")
    check_linear_head(policy, input, weight, bias, ("N", "T", "H"))
    if not isinstance(target, torch.Tensor) or target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be an int32 or int64 tensor, got {getattr(target, 'dtype', type(target))}")
    if tuple(target.shape) != tuple(input.shape[:2]):
        raise ValueError(f"target must have shape (N, T) = {tuple(input.shape[:2])}, got {tuple(target.shape)}")
    if target.device != input.device:
        raise RuntimeError(f"target must be on the device of input ({input.device}), got {target.device}")
    if paired and input.shape[0] % 2:
        raise ValueError(f"input must hold chosen then rejected sequences (an even N), got N = {input.shape[0]}")
    if (ref_input is None) != (ref_weight is None) or (ref_bias is not None and ref_weight is None):
        raise ValueError("ref_input and ref_weight go together (and ref_bias needs them)")
    if ref_input is not None:
        check_linear_head(reference, ref_input, ref_weight, ref_bias, ("N", "T", "H"))
        check_second_head(reference, ref_input, ref_weight, policy, input, weight, "(N, T)")


def _project(x_rows, weight, bias, out):
    if bias is None:
        torch.mm(x_rows, weight.t(), out=out)
    else:
        torch.addmm(bias, x_rows, weight.t(), out=out)


def _row_logps(logits, labels, losses, options, one):
    """-logp per row into ``losses`` (0 for ignored rows)."""
    launch_rows(logits, labels, None, None, losses, None, one, options)


def chunked_token_logps(input, weight, target, bias, ref_input, ref_weight, ref_bias, ignore_index: int,
                        coefficients: Optional[Coefficients], paired: bool, temperature: float = 1.0,
                        grad_input: bool = False, grad_weight: bool = False, grad_bias: bool = False) -> TokenLogps:
    """The chunk loop of the module docstring. ``coefficients`` is called once per chunk when a gradient is
    asked for; its sequences are the chunk's, in the chunk's order (a pair chunk: its chosen, then its rejected)."""
    n_seq, seq_len, hidden = input.shape
    vocab, n_rows = weight.shape[0], n_seq * seq_len
    device = input.device
    grad_bias = grad_bias and bias is not None
    wants = (grad_input or grad_weight or grad_bias) and coefficients is not None
    x = input.reshape(n_rows, hidden)
    labels = target.reshape(n_rows)
    target_scale(labels, None, ignore_index, "sum", vocab)  # reports out-of-range targets (no host sync on GPUs)
    ref_x = None if ref_input is None else ref_input.reshape(n_rows, ref_input.shape[2])
    per_unit = 2 if paired else 1
    n_units = n_seq // per_unit
    unit_rows = max(seq_len * per_unit, 1)
    units = max(1, min(n_units, chunk_rows(n_rows, hidden, vocab) // unit_rows))
    buffer_rows = units * unit_rows
    buffer = torch.empty((buffer_rows, vocab), dtype=input.dtype, device=device)
    ref_buffer = None if ref_x is None else torch.empty((buffer_rows, vocab), dtype=ref_x.dtype, device=device)
    options = LossOptions(ignore_index, "sum")
    one = torch.ones((), dtype=torch.float32, device=device)
    logps = torch.empty((n_seq, seq_len), dtype=torch.float32, device=device)
    ref_logps = None if ref_x is None else torch.empty((n_seq, seq_len), dtype=torch.float32, device=device)
    logits_sums = torch.empty((n_seq,), dtype=torch.float32, device=device)
    gx = torch.empty((n_rows, hidden), dtype=input.dtype, device=device) if grad_input and wants else None
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if grad_weight and wants else None
    gb = torch.zeros((vocab,), dtype=torch.float32, device=device) if grad_bias and wants else None
    inv_t = 1.0 / temperature
    if n_rows == 0:  # no token: nothing to project, sums over nothing
        logps.zero_()
        logits_sums.zero_()
        if ref_logps is not None:
            ref_logps.zero_()
        for g in (gx, gw):
            if g is not None:
                g.zero_()
    for u0 in range(0, n_units if n_rows else 0, units):
        u1 = min(u0 + units, n_units)
        seqs = [(u0, u1)] + ([(n_units + u0, n_units + u1)] if paired else [])
        segments = [(a * seq_len, b * seq_len) for a, b in seqs]
        n = sum(b - a for a, b in segments)
        logits = buffer[:n]
        chunk_labels = labels[segments[0][0]:segments[0][1]] if len(segments) == 1 else \
            torch.cat([labels[a:b] for a, b in segments])
        losses = torch.empty((n,), dtype=torch.float32, device=device)
        offset = 0
        for a, b in segments:
            _project(x[a:b], weight, bias, logits[offset: offset + b - a])
            offset += b - a
        chunk_sums = logits.sum(-1, dtype=torch.float32).view(-1, seq_len).sum(-1)
        if inv_t != 1.0:
            logits.mul_(inv_t)
        _row_logps(logits, chunk_labels, losses, options, one)
        chunk_logps = losses.neg().view(-1, seq_len)
        chunk_ref = None
        if ref_buffer is not None:
            ref_logits, offset = ref_buffer[:n], 0
            for a, b in segments:
                _project(ref_x[a:b], ref_weight, ref_bias, ref_logits[offset: offset + b - a])
                offset += b - a
            if inv_t != 1.0:
                ref_logits.mul_(inv_t)
            _row_logps(ref_logits, chunk_labels, losses, options, one)
            chunk_ref = losses.neg().view(-1, seq_len)
        first = 0
        for sa, sb in seqs:  # the chunk's sequences back to their places in the batch
            logps[sa:sb] = chunk_logps[first: first + sb - sa]
            logits_sums[sa:sb] = chunk_sums[first: first + sb - sa]
            if chunk_ref is not None:
                ref_logps[sa:sb] = chunk_ref[first: first + sb - sa]
            first += sb - sa
        if not wants:
            continue
        seq_index = torch.cat([torch.arange(a, b, device=device) for a, b in seqs])
        coef = coefficients(seq_index, chunk_logps, chunk_ref)
        scale = (coef * -inv_t).reshape(-1).contiguous()
        launch_rows(logits, chunk_labels, None, None, losses, logits, scale, options)
        offset = 0
        for a, b in segments:
            grad_logits = logits[offset: offset + b - a]
            if gx is not None:
                torch.mm(grad_logits, weight, out=gx[a:b])
            if gw is not None:  # the first product overwrites (beta=0): no zero fill
                gw.addmm_(grad_logits.t(), x[a:b], beta=0.0 if (u0 == 0 and offset == 0) else 1.0)
            offset += b - a
        if gb is not None:
            gb += logits.sum(0, dtype=torch.float32)
    return TokenLogps(logps, ref_logps, logits_sums, input.new_empty((0,)) if gx is None else gx.view(input.shape),
                      input.new_empty((0,)) if gw is None else gw,
                      input.new_empty((0,)) if gb is None else gb.to(input.dtype))


def sequence_logps(token_logps: torch.Tensor, valid: torch.Tensor, average: bool) -> torch.Tensor:
    """(N,) per-sequence log-probabilities: the sum over valid tokens, or their mean (a sequence without a valid
    token has 0)."""
    total = token_logps.sum(-1)
    return total / valid.sum(-1).clamp_min(1) if average else total


def token_coefficients(seq_coef, seq_index, valid, average):
    """d loss / d logp per token from d loss / d sequence logp."""
    chunk_valid = valid[seq_index]
    per_seq = seq_coef / chunk_valid.sum(-1).clamp_min(1) if average else seq_coef
    return torch.where(chunk_valid, per_seq.unsqueeze(-1), 0.0)


class Pairs(NamedTuple):
    """The per-sequence values of a pair loss over the whole batch (all (N / 2,) fp32 but the scalars)."""
    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: Optional[torch.Tensor]
    ref_rejected: Optional[torch.Tensor]
    chosen_logits_mean: torch.Tensor
    rejected_logits_mean: torch.Tensor
    nll: torch.Tensor


# pair_terms(chosen, rejected, ref_chosen, ref_rejected) -> (per-pair losses, d/d chosen, d/d rejected), all (k,)
PairTerms = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]],
                     Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def pair_forward(input, weight, target, bias, ref_input, ref_weight, ref_bias, ref_seq_logps, ignore_index: int,
                 average_log_prob: bool, nll_alpha: Optional[float], pair_terms: PairTerms, grad_input: bool,
                 grad_weight: bool, grad_bias: bool) -> Tuple[torch.Tensor, Pairs, torch.Tensor, torch.Tensor,
                                                              torch.Tensor]:
    """(loss, Pairs, grad_input, grad_weight, grad_bias) of ``mean over pairs of pair_terms`` plus, with
    ``nll_alpha``, alpha times the chosen sequences' NLL (summed over their valid tokens, divided by their count).
    ``ref_seq_logps`` (N,): precomputed reference log-probabilities (else from ref_input, else None)."""
    n_seq, seq_len = target.shape
    n_pairs = n_seq // 2
    valid = target != ignore_index
    divisor = 1.0 / max(n_pairs, 1)
    nll_count = valid[:n_pairs].sum().clamp_min(1).to(torch.float32)

    def coefficients(seq_index, token_logps, ref_tokens):
        seq = sequence_logps(token_logps, valid[seq_index], average_log_prob)
        ref = ref_seq_logps[seq_index].float() if ref_seq_logps is not None else \
            None if ref_tokens is None else sequence_logps(ref_tokens, valid[seq_index], average_log_prob)
        k = seq.shape[0] // 2
        _, d_chosen, d_rejected = pair_terms(seq[:k], seq[k:], None if ref is None else ref[:k],
                                             None if ref is None else ref[k:])
        coef = token_coefficients(torch.cat([d_chosen, d_rejected]) * divisor, seq_index, valid, average_log_prob)
        if nll_alpha is not None:
            chosen_rows = (seq_index < n_pairs).unsqueeze(-1) & valid[seq_index]
            coef = coef - torch.where(chosen_rows, nll_alpha / nll_count, 0.0)
        return coef

    out = chunked_token_logps(input, weight, target, bias, ref_input, ref_weight, ref_bias, ignore_index,
                              coefficients, True, 1.0, grad_input, grad_weight, grad_bias)
    seq = sequence_logps(out.logps, valid, average_log_prob)
    if ref_seq_logps is not None:
        ref = ref_seq_logps.float()
    else:
        ref = None if out.ref_logps is None else sequence_logps(out.ref_logps, valid, average_log_prob)
    means = out.logits_sums.view(2, -1).sum(-1) / float(max(n_pairs * seq_len * weight.shape[0], 1))
    nll = -out.logps[:n_pairs].sum() / nll_count
    chosen, rejected = seq.split(n_pairs) if n_pairs else (seq, seq.clone())
    ref_chosen, ref_rejected = (None, None) if ref is None else ref.split(n_pairs) if n_pairs else (ref, ref)
    # outputs are new tensors, never views of one another
    pairs = Pairs(chosen.clone(), rejected.clone(), ref_chosen, ref_rejected, means[0].clone(), means[1].clone(),
                  nll)
    losses, _, _ = pair_terms(pairs.chosen, pairs.rejected, pairs.ref_chosen, pairs.ref_rejected)
    loss = losses.sum() * divisor
    if nll_alpha is not None:
        loss = loss + nll * nll_alpha
    return loss, pairs, out.grad_input, out.grad_weight, out.grad_bias


def sigmoid_terms(margin: torch.Tensor, label_smoothing: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``-(1 - eps) logsigmoid(z) - eps logsigmoid(-z)`` and its derivative ``-(1 - eps) sigmoid(-z) + eps
    sigmoid(z)`` (DPO, SimPO and CPO's pair loss of their margin z)."""
    loss = -F.logsigmoid(margin) * (1.0 - label_smoothing) - F.logsigmoid(-margin) * label_smoothing
    d_margin = torch.sigmoid(-margin) * -(1.0 - label_smoothing) + torch.sigmoid(margin) * label_smoothing
    return loss, d_margin


def check_label_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def pair_outputs(loss: torch.Tensor, pairs: Pairs, beta: float, grads, *extra) -> tuple:
    """The outputs TRL logs, Liger's order: loss, chosen and rejected log-probs, their logits' means, the NLL, the
    chosen and rejected rewards (beta times the log-ratio to the reference, or to 0 without one), then ``extra``
    and the gradients."""
    ref_c = 0.0 if pairs.ref_chosen is None else pairs.ref_chosen
    ref_r = 0.0 if pairs.ref_rejected is None else pairs.ref_rejected
    return (loss, pairs.chosen, pairs.rejected, pairs.chosen_logits_mean, pairs.rejected_logits_mean, pairs.nll,
            (pairs.chosen - ref_c) * beta, (pairs.rejected - ref_r) * beta, *extra, *grads)


def check_margin_inputs(input, weight, target, bias, beta, alpha, label_smoothing, gamma) -> None:
    check_linear_inputs(input, weight, target, bias, None, None, None, paired=True)
    for name, value in (("beta", beta), ("alpha", alpha), ("gamma", gamma)):
        check_beta(name, value)
    check_label_smoothing(label_smoothing)


def margin_forward(input, weight, target, bias, ignore_index, beta, alpha, label_smoothing, compute_nll_loss, gamma,
                   average_log_prob, grad_input, grad_weight, grad_bias) -> tuple:
    """SimPO's and CPO's loss, ``mean [-(1 - eps) logsigmoid(beta * (c - r) - gamma) - eps logsigmoid(-...)]``
    (+ alpha * NLL), and outputs (``fused_linear_simpo.py``)."""
    check_margin_inputs(input, weight, target, bias, beta, alpha, label_smoothing, gamma)

    def terms(chosen, rejected, ref_chosen, ref_rejected):
        loss, d_margin = sigmoid_terms((chosen - rejected) * beta - gamma, label_smoothing)
        return loss, d_margin * beta, d_margin * -beta

    loss, pairs, *grads = pair_forward(input, weight, target, bias, None, None, None, None, ignore_index,
                                       average_log_prob, alpha if compute_nll_loss else None, terms, grad_input,
                                       grad_weight, grad_bias)
    return pair_outputs(loss, pairs, beta, grads)
