"""One small call of every public op, with its torch reference: the table the op-wide contract tests
(``test_op_contract.py``: every argument in every layout, NaN in, checkpointing, double backward, torch.func) and
``test_public_functions.py`` (meta tensors, modes, threads) run over. A new op adds one ``OpCase`` here.

``make()`` returns fresh positional arguments of the public function ``npu_liger.<name>``; ``grads`` names the
positions whose gradient the op computes; ``reference`` is the same computation in plain torch (Hugging Face's own
function where one exists), called with the same arguments. A second case of the same op (another form of its
arguments, e.g. an absent optional tensor) has a key of its own and names its op in ``function``; tests reach the
function and the op through ``public_name(key)``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from checklist import DEVICE, randn


class OpCase(NamedTuple):
    make: Callable[[], tuple]
    grads: Tuple[int, ...]
    reference: Callable
    # the op's name in torch.ops.npu_liger when the public function's arguments need translating for it
    op_args: Optional[Callable[[tuple], tuple]] = None
    # the public function (and op) this case calls, when the key is not its name: a second case of one op
    function: Optional[str] = None


def index(shape, high):
    return torch.randint(0, high, shape, device=DEVICE)


def gelu_tanh_product(a, b):
    return F.gelu(a, approximate="tanh") * b


def silu_product(a, b):
    return F.silu(a) * b


def embedding_reference(weight, indices, padding_idx=None):
    return F.embedding(indices, weight, padding_idx)


def tvd_reference(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    tv = (p - q).abs() * 0.5
    valid = (torch.ones(p.shape[0], dtype=torch.bool, device=p.device) if shift_labels is None
             else shift_labels != ignore_index)
    tv = torch.where(valid[:, None], tv, torch.zeros_like(tv))
    if reduction == "none":
        return tv
    if reduction == "sum":
        return tv.sum()
    divisor = valid.sum() * (p.shape[1] if reduction == "mean" else 1)
    return tv.sum() / divisor.clamp(min=1)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_reference(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb(unsqueeze_dim=1) (its formula, so that the table needs no transformers)."""
    cos, sin = cos.unsqueeze(-3) if cos.dim() == 3 else cos, sin.unsqueeze(-3) if sin.dim() == 3 else sin
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def mrope_reference(q, k, cos, sin, mrope_section):
    def merge(table):
        return torch.cat([m[i % 3] for i, m in enumerate(table.split(list(mrope_section) * 2, dim=-1))], dim=-1)

    return rope_reference(q, k, merge(cos), merge(sin))


def llama4_rope_reference(q, k, freqs_cis):
    freqs = freqs_cis[None, :, None, :] if freqs_cis.dim() == 2 else freqs_cis[:, :, None, :]

    def rotate(x):
        as_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(as_complex * freqs).flatten(3).type_as(x)

    return rotate(q), rotate(k)


def rms_norm_reference(x, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype) if weight is None else (offset + weight) * h.to(x.dtype)


def fused_add_rms_norm_reference(x, residual, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    s = x + residual
    return rms_norm_reference(s, weight, eps, offset, casting_mode), s


def layer_norm_reference(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def dyt_reference(x, alpha, gamma, beta=None):
    y = gamma * torch.tanh(alpha * x)
    return y if beta is None else y + beta


def poly_norm_reference(x, weight, bias, eps=1e-6):
    """PolyCom's PolyNorm (Liger's test reference)."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias


def group_norm_reference(x, weight, bias, num_groups, eps=1e-5):
    return F.group_norm(x, num_groups, weight, bias, eps)


def cross_entropy_reference(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def flce_reference(x, weight, target, bias=None, ce_weight=None, ignore_index=-100, reduction="mean",
                   label_smoothing=0.0):
    logits = F.linear(x, weight, bias)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # HF's upcast; float64 stays float64
    return F.cross_entropy(logits, target, ce_weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def class_weight(n):
    return torch.rand(n, device=DEVICE) + 0.5


def kl_div_reference(y_pred, y_true, reduction="batchmean", log_target=False, eps=1e-10):
    return F.kl_div(y_pred, y_true, reduction=reduction, log_target=log_target)


def jsd_reference(input, target, shift_labels=None, beta=0.5, ignore_index=-100):
    """Liger-Kernel's test reference: torch's KLDivLoss(log_target=True) terms, summed per row, over valid rows."""
    def kl(prediction, observation):
        return F.kl_div(prediction, observation, reduction="none", log_target=True).sum(-1)

    if beta == 0.0:
        rows = kl(input, target)
    elif beta == 1.0:
        rows = kl(target, input)
    else:
        log_m = torch.lerp(input.exp(), target.exp(), beta).log()
        rows = beta * kl(log_m, target) + (1 - beta) * kl(log_m, input)
    valid = (torch.ones(rows.shape, dtype=torch.bool, device=rows.device) if shift_labels is None
             else shift_labels != ignore_index)
    return torch.where(valid, rows, torch.zeros_like(rows)).sum() / valid.sum().clamp(min=1)


def _at_least_fp32(t):
    """Half-precision logits to fp32 (what the loss is computed in), float64 ones kept."""
    return t if t.dtype == torch.float64 else t.float()


def fused_linear_jsd_reference(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None,
                               jsd_beta=0.5, ignore_index=-100, temperature=1.0):
    student = (_at_least_fp32(F.linear(student_input, student_weight)) / temperature).log_softmax(-1)
    teacher = (_at_least_fp32(F.linear(teacher_input, teacher_weight)) / temperature).log_softmax(-1)
    return jsd_reference(student, teacher.detach(), shift_labels, jsd_beta, ignore_index)


def fused_linear_grpo_reference(input, weight, selected_token_ids, attention_mask, advantages, bias=None,
                                ref_input=None, ref_weight=None, ref_bias=None, ref_per_token_logps=None,
                                old_per_token_logps=None, beta=0.04, epsilon_low=0.2, epsilon_high=0.2,
                                temperature=1.0, loss_type="dapo", max_completion_length=None):
    """The case's options only (beta = 0, no old log-probabilities, dapo = bnpo without num_items_in_batch): the
    token mean of -A * exp(logp - logp.detach()) (clipping never applies), then its KL mean 0 and clip ratio 0."""
    logits = _at_least_fp32(F.linear(input, weight, bias)) / temperature
    logits = torch.where((attention_mask != 0).unsqueeze(-1), logits, 0.0)  # masked tokens are not read
    logp = logits.log_softmax(-1).gather(-1, selected_token_ids.unsqueeze(-1)).squeeze(-1)
    kept = attention_mask != 0
    loss_t = -torch.exp(logp - logp.detach()) * advantages.to(logp.dtype).unsqueeze(-1)
    loss_t = torch.where(kept, loss_t, 0)  # a masked token counts for nothing, NaN or not (as ignore_index rows)
    zero = logp.new_zeros(())  # beta = 0: no KL computed; a NaN ratio compares False: not clipped
    return loss_t.sum() / kept.sum().clamp_min(1), zero, zero


def grpo_loss_reference(logits, completion_ids, advantages, completion_mask=None, old_logp=None, ref_logp=None,
                        temperature=1.0, beta=0.0, eps_low=0.2, eps_high=0.2, loss_type="dapo",
                        max_completion_length=None, num_items_in_batch=None):
    """TRL's GRPOTrainer._compute_loss (token-level importance sampling). Masked tokens are not read (their logits,
    old/ref log-probabilities and advantage are replaced by 0 before use), as the op documents; everything else is
    TRL's arithmetic. Returns (loss, per_token_kl, is_clipped, clip_ratio), the statistics without gradient."""
    n_seq, seq_len = completion_ids.shape
    if logits.shape[1] == seq_len + 1:
        logits = logits[:, :-1]
    valid = (torch.ones((n_seq, seq_len), dtype=torch.bool, device=logits.device) if completion_mask is None
             else completion_mask != 0)
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    logits = torch.where(valid[..., None], logits, zero)
    logp = (_at_least_fp32(logits) / temperature).log_softmax(-1)
    logp = logp.gather(-1, completion_ids[..., None].long()).squeeze(-1)
    old = logp.detach() if old_logp is None else torch.where(valid, old_logp.to(logp.dtype), 0.0)
    adv = torch.where(valid, advantages[:, None].to(logp.dtype), 0.0)
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        ref = torch.where(valid, ref_logp.to(logp.dtype), 0.0)
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        if beta != 0.0:
            per_token = per_token + beta * kl
    mask = valid.to(logp.dtype)
    per_token = torch.where(valid, per_token, 0.0)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (n_seq * (max_completion_length or seq_len))
    else:
        normalizer = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch).to(mask)
        loss = (per_token * mask).sum() / normalizer.clamp(min=1.0)
    clipped = (((coef_1 < 1 - eps_low) & (adv < 0)) | ((coef_1 > 1 + eps_high) & (adv > 0))) & valid
    clipped = clipped.to(logp.dtype).detach()
    kl = torch.where(valid, kl, 0.0).detach()
    return loss, kl, clipped, clipped.sum() / mask.sum().clamp(min=1.0)


def _grpo_case():
    mask = torch.ones((2, 3), dtype=torch.int64, device=DEVICE)
    mask[1, 2] = 0
    return (randn((2, 4, 11)), index((2, 3), 11), randn((2,)), mask, randn((2, 3), scale=0.1) - 2.4,
            randn((2, 3), scale=0.1) - 2.4, 0.9, 0.04, 0.2, 0.28, "grpo")


def softmax_reference(x):
    return torch.softmax(x, -1)


def sparsemax_reference(x, dim=-1):
    """The paper's algorithm (Martins & Astudillo 2016, Algorithm 1): sort, find the support size k from the
    cumulative sums, tau = (sum of the k largest - 1) / k. Selections by ``torch.where`` (not multiplication by the
    support mask), so -inf entries get 0 and a non-finite value outside the support does not reach the rest; a row
    with a NaN or +inf, or of -inf only, is NaN (the op's contract). ``max(x - tau, 0)`` is a selection on
    x - tau > 0 rather than ``clamp``, whose gradient passes at x == tau: the support is where the output is
    positive (an entry exactly at tau, common on bf16's coarse grid, gets no gradient)."""
    z = x.movedim(dim, -1)
    ordered = z.sort(-1, descending=True).values
    rank = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    support = 1 + rank * ordered > ordered.cumsum(-1)
    tau = (torch.where(support, ordered, 0).sum(-1, keepdim=True) - 1) / support.sum(-1, keepdim=True)
    defined = (z < float("inf")).all(-1, keepdim=True) & (z > float("-inf")).any(-1, keepdim=True)
    shifted = z - tau
    y = torch.where(defined, torch.where(shifted > 0, shifted, 0), float("nan"))
    return y.movedim(-1, dim)


def fused_moe_reference(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    """transformers' ``MixtralExperts.forward`` (its loop over the experts hit, in plain torch; an index equal to E
    is skipped)."""
    experts = gate_up_proj.shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(top_k_index.long(), num_classes=experts + 1).permute(2, 1, 0)
    for e in range(experts):
        top_k_pos, token_idx = torch.where(mask[e])
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(x[token_idx], gate_up_proj[e]).chunk(2, dim=-1)
        rows = F.linear(F.silu(gate) * up, down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
        out = out.index_add(0, token_idx, rows.to(out.dtype))
    return out


# The preference losses (fused_linear_dpo, _orpo, _simpo, _cpo, _kto), from the papers' formulas with Liger's
# conventions (tests/test_preference_losses.py judges them in depth); the *_reference functions below them take the
# public functions' arguments.
def preference_token_logps(x, w, b, target, ignore_index=-100):
    logits = x @ w.T + (0 if b is None else b)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # half-precision logits, fp32 loss
    valid = target != ignore_index
    # ignored tokens are not read by the loss (their logits still count in the logits-mean metrics)
    read = torch.where(valid.unsqueeze(-1), logits, 0.0)
    lp = read.log_softmax(-1).gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lp, 0.0), valid, logits


def preference_sequence_logps(lp, valid, average):
    return lp.sum(-1) / valid.sum(-1).clamp_min(1) if average else lp.sum(-1)


def pair_reference(kind, x, w, target, b, ref=None, beta=0.1, eps=0.0, nll=False, alpha=1.0, average=False,
                   gamma=0.5, ignore_index=-100):
    lp, valid, logits = preference_token_logps(x, w, b, target, ignore_index)
    s = preference_sequence_logps(lp, valid, average)
    n = x.shape[0] // 2
    c, r = s[:n], s[n:]
    rc, rr = (torch.zeros_like(c), torch.zeros_like(r)) if ref is None else ref
    extra = ()
    if kind == "dpo":
        z = beta * ((c - rc) - (r - rr))
    elif kind in ("simpo", "cpo"):
        z = beta * (c - r) - (gamma if kind == "simpo" else 0.0)
    if kind == "orpo":
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        loss = -beta * F.logsigmoid(log_odds).mean()
        extra = (F.logsigmoid(log_odds).mean().detach(), log_odds.mean().detach())
    else:
        loss = (-(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)).mean()
    nll_loss = -lp[:n].sum() / valid[:n].sum().clamp_min(1)
    if nll:
        loss = loss + alpha * nll_loss
    means = logits.detach().reshape(2, -1).sum(-1) / (n * x.shape[1] * w.shape[0])
    return (loss, c.detach(), r.detach(), means[0], means[1], nll_loss.detach(), (beta * (c - rc)).detach(),
            (beta * (r - rr)).detach(), *extra)


def kto_reference(x, w, target, labels, b, ref=None, kl=None, beta=0.1, average=False, ignore_index=-100):
    lp, valid, logits = preference_token_logps(x, w, b, target, ignore_index)
    s = preference_sequence_logps(lp, valid, average)
    ratio = s - (0 if ref is None else ref)
    sign = torch.where(labels, 1.0, -1.0).to(s.dtype)
    loss = (1 - torch.sigmoid(beta * (ratio - (0 if kl is None else kl)) * sign)).mean()
    ls = logits.detach().sum((1, 2))

    def split(v):
        v = v.detach()
        return torch.where(labels, v, 0).sum(), torch.where(labels, 0, v).sum()

    return (loss, *split(s), *split(ls), *split(beta * ratio))



def _reference_model_logps(ref_input, ref_weight, ref_bias, target, ignore_index, average):
    """The reference model's per-sequence log-probabilities (no gradient), or None without one."""
    if ref_input is None:
        return None
    lp, valid, _ = preference_token_logps(ref_input.detach(), ref_weight.detach(),
                                          None if ref_bias is None else ref_bias.detach(), target, ignore_index)
    return preference_sequence_logps(lp, valid, average)


def dpo_reference(input, weight, target, bias=None, ref_input=None, ref_weight=None, ref_bias=None,
                  ref_chosen_logps=None, ref_rejected_logps=None, ignore_index=-100, beta=0.1, label_smoothing=0.0,
                  compute_nll_loss=False, alpha=1.0, average_log_prob=False):
    ref = _reference_model_logps(ref_input, ref_weight, ref_bias, target, ignore_index, average_log_prob)
    if ref is not None:
        ref = ref.split(input.shape[0] // 2)
    elif ref_chosen_logps is not None:
        ref = (ref_chosen_logps, ref_rejected_logps)
    return pair_reference("dpo", input, weight, target, bias, ref, beta, label_smoothing, compute_nll_loss, alpha,
                          average_log_prob, ignore_index=ignore_index)


def orpo_reference(input, weight, target, bias=None, ignore_index=-100, beta=0.1, compute_nll_loss=True):
    return pair_reference("orpo", input, weight, target, bias, None, beta, nll=compute_nll_loss, average=True,
                          ignore_index=ignore_index)


def simpo_reference(input, weight, target, bias=None, ignore_index=-100, beta=0.1, alpha=1.0, label_smoothing=0.0,
                    compute_nll_loss=True, gamma=0.5):
    return pair_reference("simpo", input, weight, target, bias, None, beta, label_smoothing, compute_nll_loss, alpha,
                          True, gamma, ignore_index)


def cpo_reference(input, weight, target, bias=None, ignore_index=-100, beta=0.1, alpha=1.0, label_smoothing=0.0,
                  compute_nll_loss=True, average_log_prob=False):
    return pair_reference("cpo", input, weight, target, bias, None, beta, label_smoothing, compute_nll_loss, alpha,
                          average_log_prob, ignore_index=ignore_index)


def fused_linear_kto_reference(input, weight, target, preference_labels, bias=None, ref_input=None, ref_weight=None,
                               ref_bias=None, ref_logps=None, kl=None, ignore_index=-100, beta=0.1,
                               average_log_prob=False):
    ref = _reference_model_logps(ref_input, ref_weight, ref_bias, target, ignore_index, average_log_prob)
    return kto_reference(input, weight, target, preference_labels, bias, ref if ref is not None else ref_logps, kl,
                         beta, average_log_prob, ignore_index)


def _sequences(n_seq=4, seq=3, hidden=8, vocab=11):
    """(N, T, H) hidden states, (V, H) weight, (N, T) targets with one ignored token, (V,) bias."""
    target = index((n_seq, seq), vocab)
    target[0, 1] = -100
    return randn((n_seq, seq, hidden)), randn((vocab, hidden), scale=0.4), target, randn((vocab,))


def _dpo_case():
    x, w, target, b = _sequences()
    return (x, w, target, b, randn((4, 3, 6)), randn((11, 6), scale=0.4), None, None, None, -100, 0.2, 0.1, True,
            0.5, False)


def _kto_case():
    x, w, target, b = _sequences()
    labels = torch.tensor([True, False, True, False], device=DEVICE)
    return (x, w, target, labels, b, None, None, None, randn((4,)) - 5.0, randn(()).abs(), -100, 0.3, False)


CASES = {
    "geglu": OpCase(lambda: (randn((3, 37)), randn((3, 37))), (0, 1), gelu_tanh_product),
    "swiglu": OpCase(lambda: (randn((3, 37)), randn((3, 37))), (0, 1), silu_product),
    "embedding": OpCase(lambda: (randn((11, 6)), index((2, 5), 11), None), (0,), embedding_reference,
                        op_args=lambda args: (args[0], args[1], -1 if args[2] is None else args[2])),
    "tvd": OpCase(lambda: (randn((4, 9)).softmax(-1), randn((4, 9)).softmax(-1), None, "sum"), (0, 1),
                  tvd_reference),
    "rope": OpCase(lambda: (randn((2, 4, 5, 8)), randn((2, 2, 5, 8)), randn((5, 8)), randn((5, 8))), (0, 1),
                   rope_reference),
    "qwen2vl_mrope": OpCase(lambda: (randn((2, 4, 5, 8)), randn((2, 2, 5, 8)), randn((3, 2, 5, 8)),
                                     randn((3, 2, 5, 8)), [2, 1, 1]), (0, 1), mrope_reference),
    "llama4_rope": OpCase(lambda: (randn((2, 5, 4, 8)), randn((2, 5, 2, 8)),
                                   torch.polar(torch.ones(5, 4, device=DEVICE), randn((5, 4)))), (0, 1),
                          llama4_rope_reference),
    "rms_norm": OpCase(lambda: (randn((3, 16)), randn((16,))), (0, 1), rms_norm_reference),
    "rms_norm_no_weight": OpCase(lambda: (randn((3, 16)), None), (0,), rms_norm_reference, function="rms_norm"),
    "fused_add_rms_norm": OpCase(lambda: (randn((3, 16)), randn((3, 16)), randn((16,))), (0, 1, 2),
                                 fused_add_rms_norm_reference),
    "layer_norm": OpCase(lambda: (randn((3, 16)), randn((16,)), randn((16,))), (0, 1, 2), layer_norm_reference),
    "softmax": OpCase(lambda: (randn((3, 4, 19)) * 2.0,), (0,), softmax_reference),
    # (2, 11, 17) over dim 1: the split layout; its "transposed" layout stores dim 1 innermost (the rows layout)
    "sparsemax": OpCase(lambda: (randn((2, 11, 17)) * 2.0, 1), (0,), sparsemax_reference),
    "dyt": OpCase(lambda: (randn((3, 16)), randn((1,)), randn((16,)), randn((16,))), (0, 1, 2, 3), dyt_reference),
    "poly_norm": OpCase(lambda: (randn((3, 16)), randn((3,)), randn((1,))), (0, 1, 2), poly_norm_reference),
    "group_norm": OpCase(lambda: (randn((2, 6, 5)), randn((6,)), randn((6,)), 3), (0, 1, 2), group_norm_reference),
    # class weights and label smoothing: every tensor argument of the row kernel is drawn in every layout
    "cross_entropy": OpCase(lambda: (randn((4, 10)), index((4,), 10), class_weight(10), -100, "mean", 0.1), (0,),
                            cross_entropy_reference),
    "fused_linear_cross_entropy": OpCase(lambda: (randn((4, 8)), randn((10, 8)), index((4,), 10), randn((10,)),
                                                  class_weight(10), -100, "mean", 0.1), (0, 1, 3),
                                         flce_reference),
    "kl_div": OpCase(lambda: (randn((4, 9)).log_softmax(-1), randn((4, 9)).softmax(-1), "sum"), (0, 1),
                     kl_div_reference),
    "jsd": OpCase(lambda: (randn((4, 9)).log_softmax(-1), randn((4, 9)).log_softmax(-1), None, 0.3), (0,),
                  jsd_reference),
    "fused_linear_jsd": OpCase(lambda: (randn((4, 8)), randn((10, 8)), randn((4, 6)), randn((10, 6)), None, 0.5,
                                        -100, 2.0), (0, 1), fused_linear_jsd_reference),
    "grpo_loss": OpCase(_grpo_case, (0,), grpo_loss_reference),
    # preference losses: chosen sequences first, then rejected; a reference model (DPO) or precomputed ones (KTO)
    "fused_linear_dpo": OpCase(_dpo_case, (0, 1, 3), dpo_reference),
    "fused_linear_orpo": OpCase(lambda: (*_sequences(), -100, 0.2, True), (0, 1, 3), orpo_reference),
    "fused_linear_simpo": OpCase(lambda: (*_sequences(), -100, 2.0, 0.7, 0.1, True, 0.5), (0, 1, 3),
                                 simpo_reference),
    "fused_linear_cpo": OpCase(lambda: (*_sequences(), -100, 0.1, 1.0, 0.0, True, True), (0, 1, 3), cpo_reference),
    "fused_linear_kto": OpCase(_kto_case, (0, 1, 4), fused_linear_kto_reference),
    "fused_linear_grpo": OpCase(lambda: (randn((2, 3, 8)), randn((10, 8)), index((2, 3), 10),
                                         torch.tensor([[1, 1, 0], [1, 1, 1]], device=DEVICE), randn((2,)), None,
                                         None, None, None, None, None, 0.0), (0, 1), fused_linear_grpo_reference),
    # 3 experts, intermediate 8; index 3 (= E) is a slot served elsewhere
    "fused_moe": OpCase(lambda: (randn((5, 16)), randn((3, 16, 16), scale=0.3), randn((3, 16, 8), scale=0.3),
                                 index((5, 2), 4), randn((5, 2)).softmax(-1)), (0, 1, 2, 4), fused_moe_reference),
}
OPS = sorted(CASES)


def public_name(name: str) -> str:
    """The public function (``npu_liger.<it>``) and op (``torch.ops.npu_liger.<it>``) the case ``name`` calls."""
    return CASES[name].function or name


def op_args(name: str, args: tuple) -> tuple:
    """The op's positional arguments for the public function's ``args``."""
    translate = CASES[name].op_args
    return translate(args) if translate is not None else args


def run_op(name: str, args: tuple):
    return getattr(torch.ops.npu_liger, public_name(name))(*op_args(name, args))
