"""The eager PyTorch baselines: the Hugging Face formulas each op replaces.

Where transformers provides the function (``apply_rotary_pos_emb`` of Llama, ``apply_rotary_emb`` of Llama-4,
``apply_multimodal_rotary_pos_emb`` of Qwen2-VL) it is used as is; transformers versions that moved or dropped
one fall back to the same formula written out here. ``SOURCES`` records which was used.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def geglu(a: Tensor, b: Tensor) -> Tensor:
    return F.gelu(a, approximate="tanh") * b


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    return F.silu(a) * b


def embedding(weight: Tensor, indices: Tensor) -> Tensor:
    return F.embedding(indices, weight)


def tvd_batchmean(p: Tensor, q: Tensor) -> Tensor:
    """``0.5 * |p - q|`` summed and divided by the number of rows (reduction "batchmean", no labels)."""
    return (0.5 * (p - q).abs()).sum() / p.shape[0]


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """HF ``LlamaRMSNorm.forward``: statistics in fp32, the normalised x cast back, then times the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> Tuple[Tensor, Tensor]:
    """A decoder layer's ``hidden = residual + hidden`` followed by its RMSNorm: (normed, sum)."""
    s = x + residual
    return rms_norm(s, weight, eps), s


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def softmax(x: Tensor) -> Tensor:
    return torch.softmax(x, -1)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """The sort-based formula (Martins & Astudillo 2016) as eager code writes it: sort, cumulative sums, the support
    size, tau, ``max(x - tau, 0)``; in fp32 (sorting and summing bf16 loses percents), the result in x's dtype.
    ``max`` as a selection on x - tau > 0, not ``clamp``, whose gradient also passes where x == tau exactly (on bf16's
    grid a value often sits exactly at tau): the support is where the output is positive."""
    z = x.float().movedim(dim, -1)
    ordered = z.sort(-1, descending=True).values
    rank = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    support = 1 + rank * ordered > ordered.cumsum(-1)
    tau = (torch.where(support, ordered, 0).sum(-1, keepdim=True) - 1) / support.sum(-1, keepdim=True)
    shifted = z - tau
    return torch.where(shifted > 0, shifted, 0).movedim(-1, dim).to(x.dtype)


def dyt(x: Tensor, alpha: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """Dynamic Tanh as its paper (and Liger's test) writes it."""
    return gamma * torch.tanh(alpha * x) + beta


def poly_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6) -> Tensor:
    """PolyCom's PolyNorm: ``w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b``, norm an RMSNorm without weight."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias


def group_norm(x: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float = 1e-5) -> Tensor:
    return F.group_norm(x, num_groups, weight, bias, eps)


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """HF's way: the loss from fp32 logits (``ForCausalLMLoss`` upcasts), mean over targets != -100."""
    return F.cross_entropy(logits.float(), target)


def fused_linear_cross_entropy(x: Tensor, weight: Tensor, target: Tensor) -> Tensor:
    """The unfused computation HF runs: lm_head's logits in x's dtype, then the fp32 cross entropy."""
    return F.cross_entropy(F.linear(x, weight).float(), target)


def kl_div_batchmean(y_pred: Tensor, y_true: Tensor) -> Tensor:
    """``F.kl_div`` of log-probability predictions against probabilities, summed over the batch's rows."""
    return F.kl_div(y_pred, y_true, reduction="batchmean")


def _row_kl(prediction: Tensor, observation: Tensor) -> Tensor:
    return F.kl_div(prediction, observation, reduction="none", log_target=True).sum(-1)


def jsd(log_q: Tensor, log_p: Tensor, beta: float = 0.5) -> Tensor:
    """Liger-Kernel's torch JSD (its tests' reference), in fp32: beta * KL(P || M) + (1 - beta) * KL(Q || M)."""
    log_q, log_p = log_q.float(), log_p.float()
    log_m = torch.lerp(log_q.exp(), log_p.exp(), beta).log()
    return (beta * _row_kl(log_m, log_p) + (1 - beta) * _row_kl(log_m, log_q)).mean()


def fused_linear_jsd(student_input: Tensor, student_weight: Tensor, teacher_input: Tensor, teacher_weight: Tensor,
                     temperature: float = 1.0) -> Tensor:
    """The unfused distillation loss: both models' logits in their dtype, log-softmax and JSD in fp32."""
    student = (F.linear(student_input, student_weight).float() / temperature).log_softmax(-1)
    with torch.no_grad():
        teacher = (F.linear(teacher_input, teacher_weight).float() / temperature).log_softmax(-1)
    return jsd(student, teacher)


def grpo_loss(logits: Tensor, completion_ids: Tensor, advantages: Tensor, completion_mask: Tensor, old_logp: Tensor,
              ref_logp: Tensor, beta: float = 0.04, eps_low: float = 0.2, eps_high: float = 0.28) -> Tensor:
    """TRL's GRPOTrainer._compute_loss (loss_type "dapo", token-level ratios): the selective log-softmax of the
    completion tokens from fp32 logits (the last position dropped), PPO clipping, the k3 KL to the reference."""
    logp = logits[:, :-1].float().log_softmax(-1).gather(-1, completion_ids[..., None]).squeeze(-1)
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(coef_1 * advantages[:, None], coef_2 * advantages[:, None])
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    mask = completion_mask.float()
    return ((per_token + beta * kl) * mask).sum() / mask.sum().clamp(min=1.0)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _local_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def _local_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    sections = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sections, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sections, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def _local_llama4_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


SOURCES: Dict[str, str] = {}


def _resolve(key: str, module: str, name: str, fallback, probe):
    """transformers' function when importable and equal to the formula on a small probe, else ``fallback``."""
    try:
        fn = getattr(__import__(module, fromlist=[name]), name)
    except Exception:  # transformers missing, or the function moved in this version
        SOURCES[key] = f"local copy of the HF formula ({module}.{name} not importable)"
        return fallback
    try:
        args = probe()
        ok = all(torch.allclose(x, y, atol=1e-6) for x, y in zip(fn(*args), fallback(*args), strict=True))
    except Exception:
        ok = False
    if not ok:  # e.g. replaced by a hub kernel: not the eager baseline any more
        SOURCES[key] = f"local copy of the HF formula ({module}.{name} differs from it on a probe)"
        return fallback
    SOURCES[key] = f"{module}.{name}"
    return fn


def _probe_rope():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    return q, k, torch.randn(1, 3, 8, generator=g), torch.randn(1, 3, 8, generator=g)


def _probe_mrope():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 16, generator=g), torch.randn(1, 1, 3, 16, generator=g)
    return q, k, torch.randn(3, 1, 3, 16, generator=g), torch.randn(3, 1, 3, 16, generator=g), [2, 3, 3]


def _probe_llama4():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 3, 2, 8, generator=g), torch.randn(1, 3, 1, 8, generator=g)
    return q, k, torch.polar(torch.ones(1, 3, 4), torch.randn(1, 3, 4, generator=g))


_hf_rope = None
_hf_mrope = None
_hf_llama4 = None


def _load():
    global _hf_rope, _hf_mrope, _hf_llama4
    if _hf_rope is None:
        _hf_rope = _resolve("rope", "transformers.models.llama.modeling_llama", "apply_rotary_pos_emb",
                            _local_rotary_pos_emb, _probe_rope)
        _hf_mrope = _resolve("qwen2vl_mrope", "transformers.models.qwen2_vl.modeling_qwen2_vl",
                             "apply_multimodal_rotary_pos_emb", _local_multimodal_rotary_pos_emb, _probe_mrope)
        _hf_llama4 = _resolve("llama4_rope", "transformers.models.llama4.modeling_llama4", "apply_rotary_emb",
                              _local_llama4_rotary_emb, _probe_llama4)


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor]:
    """q, k: (bsz, heads, seq, head_dim); cos, sin: (1 or bsz, seq, head_dim)."""
    _load()
    return _hf_rope(q, k, cos, sin, unsqueeze_dim=1)


def qwen2vl_mrope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, mrope_section: Sequence[int]):
    """q, k: (bsz, heads, seq, head_dim); cos, sin: (3, bsz, seq, head_dim)."""
    _load()
    return _hf_mrope(q, k, cos, sin, list(mrope_section), unsqueeze_dim=1)


def llama4_rope(q: Tensor, k: Tensor, freqs_cis: Tensor) -> Tuple[Tensor, Tensor]:
    """q, k: (bsz, seq, heads, head_dim), interleaved (re, im) pairs; freqs_cis complex (1 or bsz, seq, hd/2)."""
    _load()
    return _hf_llama4(q, k, freqs_cis)


def sources() -> Dict[str, str]:
    _load()
    return dict(SOURCES)


# --- MoE experts: transformers' own experts code on a stand-in module (its attributes only) ---------------------

def _moe_stand_in(gate_up_proj: Tensor, down_proj: Tensor):
    from types import SimpleNamespace

    stand_in = SimpleNamespace(num_experts=gate_up_proj.shape[0], gate_up_proj=gate_up_proj, down_proj=down_proj,
                               act_fn=F.silu, has_gate=True, has_bias=False, is_transposed=False,
                               has_post_expert_norm=False, _is_expert_parallel=False)
    stand_in._apply_gate = lambda out: F.silu(out.chunk(2, dim=-1)[0]) * out.chunk(2, dim=-1)[1]
    return stand_in


def _moe_loop(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    """The formula of transformers' ``MixtralExperts.forward`` (the loop over the experts hit)."""
    out = torch.zeros_like(x)
    mask = F.one_hot(top_k_index, num_classes=gate_up_proj.shape[0] + 1).permute(2, 1, 0)
    for e in range(gate_up_proj.shape[0]):
        top_k_pos, token_idx = torch.where(mask[e])
        if token_idx.numel():
            gate, up = F.linear(x[token_idx], gate_up_proj[e]).chunk(2, dim=-1)
            rows = F.linear(F.silu(gate) * up, down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
            out.index_add_(0, token_idx, rows.to(out.dtype))
    return out


def moe_experts(x: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
                top_k_weights: Tensor) -> Tensor:
    """transformers' eager experts (``MixtralExperts.forward``, unwrapped from its implementation switch)."""
    try:
        import inspect

        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        forward = inspect.unwrap(MixtralExperts.forward)
        SOURCES["fused_moe"] = "transformers MixtralExperts.forward (eager loop)"
    except Exception:
        forward = None
        SOURCES["fused_moe"] = "local copy of MixtralExperts.forward (transformers not importable)"
    if forward is None:
        return _moe_loop(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    return forward(_moe_stand_in(gate_up_proj, down_proj), x, top_k_index, top_k_weights)


def moe_experts_grouped_mm(x: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
                           top_k_weights: Tensor) -> Tensor:
    """transformers' ``experts_implementation="grouped_mm"`` (``integrations.moe.grouped_mm_experts_forward``:
    torch's grouped_mm where it applies, its own fallback op elsewhere)."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    return grouped_mm_experts_forward(_moe_stand_in(gate_up_proj, down_proj), x, top_k_index, top_k_weights)


def fused_linear_dpo(x: Tensor, weight: Tensor, target: Tensor, ref_x: Tensor, ref_weight: Tensor, beta: float = 0.1,
                     ignore_index: int = -100) -> Tensor:
    """The unfused DPO sigmoid loss: both models' logits (N, T, V) in their dtype, log-softmax in fp32, the target
    tokens' log-probabilities summed per sequence (ignore_index counts for nothing), chosen rows first then
    rejected, ``-logsigmoid(beta * ((c - rc) - (r - rr)))`` averaged over the pairs; the reference without grad."""
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)

    def seq_logps(h, w):
        logp = (h @ w.t()).float().log_softmax(-1).gather(-1, safe[..., None]).squeeze(-1)
        return (logp * valid).sum(-1)

    policy = seq_logps(x, weight)
    with torch.no_grad():
        ref = seq_logps(ref_x, ref_weight)
    half = x.shape[0] // 2
    margin = (policy[:half] - ref[:half]) - (policy[half:] - ref[half:])
    return -torch.nn.functional.logsigmoid(beta * margin).mean()
