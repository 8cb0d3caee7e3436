"""Liger-Kernel baselines, when ``liger_kernel`` is importable.

Each op maps to the function Liger's own model patches call, falling back to the ``torch.autograd.Function``
behind it (first from the package ``liger_kernel.ops``, which applies Liger's per-device implementation
selection, then from the op's submodule), so the lookup survives Liger moving files between releases.
``resolved()`` records what ran.

=============  ==========================================================================================
op             Liger-Kernel (first that imports)
=============  ==========================================================================================
geglu          ``transformers.functional.liger_geglu(a, b)``; ``LigerGELUMulFunction.apply(a, b)``
swiglu         ``transformers.functional.liger_swiglu(a, b)``; ``LigerSiLUMulFunction.apply(a, b)``
embedding      ``LigerEmbeddingFunction.apply(weight, indices)`` (``ops/experimental/embedding.py``; no functional)
tvd            ``transformers.functional.liger_tvd(p, q, None, "batchmean", -100)``;
               ``LigerTVDLossFunction.apply(...)``; its backward returns a gradient for p only
cross_entropy  ``transformers.functional.liger_cross_entropy(logits, target)`` (what LigerCrossEntropyLoss
               calls); ``LigerCrossEntropyFunction.apply(logits, target)``; writes the gradient into logits
fused_linear_  ``transformers.functional.liger_fused_linear_cross_entropy(x, weight, target)`` (behind
cross_entropy  LigerFusedLinearCrossEntropyLoss); ``LigerFusedLinearCrossEntropyFunction.apply(x, weight, target)``
kl_div         ``transformers.functional.liger_kl_div(y_pred, y_true, reduction="batchmean")``;
               ``LigerKLDivLossFunction.apply(y_pred, y_true, "batchmean", False, 1e-10)``
jsd            ``transformers.functional.liger_jsd(log_q, log_p, None, 0.5, -100)``; ``LigerJSDFunction.apply``
fused_linear_  ``transformers.functional.liger_fused_linear_jsd(x, w, teacher_x, teacher_w)``;
jsd            ``LigerFusedLinearJSDFunction.apply(x, w, teacher_x, teacher_w, None, 0.5, -100, 1.0, None)``
grpo_loss      ``transformers.grpo_loss.triton_grpo_loss(logits, old, ref, ids, adv, mask, 1.0, 0.04, 0.2, 0.28,
               inplace=True, loss_type="dapo", reduce=True)[0]`` (the gradient written into logits' storage)
rope           ``transformers.rope.liger_rotary_pos_emb(q, k, cos, sin)``; ``LigerRopeFunction.apply(...)[:2]``
qwen2vl_mrope  ``transformers.qwen2vl_mrope.liger_multimodal_rotary_pos_emb(q, k, cos, sin, section)``;
               ``LigerQwen2VLMRopeFunction.apply(...)[:2]``
llama4_rope    ``transformers.llama4_rope.liger_llama4_text_rotary_pos_emb(q, k, freqs_cis)``;
               ``LigerLlama4RopeFunction.apply(q, k, freqs_cis)``
rms_norm       ``transformers.functional.liger_rms_norm(x, w, eps)`` (in_place=True, what LigerRMSNorm uses);
               ``LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", True)``
fused_add_...  ``transformers.functional.liger_fused_add_rms_norm(x, r, w, eps)``;
               ``LigerFusedAddRMSNormFunction.apply(x, r, w, eps, 0.0, "llama", True)``
layer_norm     ``transformers.functional.liger_layer_norm(x, w, b, eps)``; ``LigerLayerNormFunction.apply(...)``
softmax        ``transformers.functional.liger_softmax(x)``; ``LigerSoftmaxFunction.apply(x)``
sparsemax      ``transformers.functional.liger_sparsemax(x, -1)``; ``LigerSparsemaxFunction.apply(x, -1)``
dyt            ``transformers.functional.liger_dyt(x, alpha, gamma, beta)``; ``LigerDyTFunction.apply(...)``
poly_norm      ``transformers.functional.liger_poly_norm(x, w, b, eps)`` (in_place=True, LigerPolyNorm's default;
               bias 0-d as LigerPolyNorm holds it); ``LigerPolyNormFunction.apply(x, w, b, eps, True)``
group_norm     ``transformers.functional.liger_group_norm(x, w, b, C, G, eps)``; ``LigerGroupNormFunction.apply``
fused_moe      ``LigerFusedMoEFunction.apply(x, gate_up_proj, down_proj, top_k_index int32, top_k_weights)``
               (``liger_kernel.ops``, 0.8.1+: what its ``LigerExperts`` module calls; no functional)
=============  ==========================================================================================

Liger rotates q/k in place (the rope family, and dq/dk in backward) and writes the geglu/swiglu gradients into
the saved inputs, so the harness hands every variant fresh inputs.
"""

from __future__ import annotations

import importlib

import torch
from typing import Callable, Dict, List, Optional, Tuple

from .specs import mrope_section_for


def _t(x):
    return x.transpose(1, 2)


def _first2(out):
    return tuple(out)[:2]  # some releases return (q, k, cos, sin) from LigerRopeFunction


def _first(out):
    return out[0] if isinstance(out, tuple) else out  # some releases return (loss, z_loss, ...)


def _gated(fn_is_class):
    return lambda f: (lambda a, b: (f.apply(a, b),)) if fn_is_class else (lambda a, b: (f(a, b),))


_ROPE = lambda f: lambda q, k, cos, sin: _first2(f(_t(q), _t(k), cos, sin))  # noqa: E731
_ROPE_CLS = lambda c: lambda q, k, cos, sin: _first2(c.apply(_t(q), _t(k), cos, sin, None, 1))  # noqa: E731
_MROPE = lambda f: lambda q, k, cos, sin: _first2(  # noqa: E731
    f(_t(q), _t(k), cos, sin, list(mrope_section_for(q.shape[-1]))))
_MROPE_CLS = lambda c: lambda q, k, cos, sin: _first2(  # noqa: E731
    c.apply(_t(q), _t(k), cos, sin, list(mrope_section_for(q.shape[-1])), 1))
_TVD = lambda f: lambda p, q: (f(p, q, None, "batchmean", -100),)  # noqa: E731
_TVD_CLS = lambda c: lambda p, q: (c.apply(p, q, None, "batchmean", -100),)  # noqa: E731
_LLAMA4 = lambda f: lambda q, k, freqs: _first2(f(q, k, freqs))  # noqa: E731
_LLAMA4_CLS = lambda c: lambda q, k, freqs: _first2(c.apply(q, k, freqs))  # noqa: E731
_CE = lambda f: lambda logits, target: (_first(f(logits, target)).float(),)  # noqa: E731
_CE_CLS = lambda c: lambda logits, target: (_first(c.apply(logits, target)).float(),)  # noqa: E731
_FLCE = lambda f: lambda x, w, target: (_first(f(x, w, target)).float(),)  # noqa: E731
_FLCE_CLS = lambda c: lambda x, w, target: (_first(c.apply(x, w, target)).float(),)  # noqa: E731
_KL = lambda f: lambda x, t: (f(x, t, reduction="batchmean").float(),)  # noqa: E731
_KL_CLS = lambda c: lambda x, t: (c.apply(x, t, "batchmean", False, 1e-10).float(),)  # noqa: E731
_JSD = lambda f: lambda x, y: (f(x, y, None, 0.5, -100).float(),)  # noqa: E731
_JSD_CLS = lambda c: lambda x, y: (c.apply(x, y, None, 0.5, -100).float(),)  # noqa: E731
_FLJSD = lambda f: lambda x, w, tx, tw: (f(x, w, tx, tw, None, 0.5, -100, 1.0).float(),)  # noqa: E731
_FLJSD_CLS = lambda c: lambda x, w, tx, tw: (c.apply(x, w, tx, tw, None, 0.5, -100, 1.0, None).float(),)  # noqa: E731
_GRPO = lambda f: lambda logits, ids, adv, mask, old, ref: (  # noqa: E731
    f(logits, old, ref, ids, adv, mask, 1.0, 0.04, 0.2, 0.28, True, "dapo", None, "token", True)[0].float(),)
_EMB_CLS = lambda c: lambda weight, indices: (c.apply(weight, indices),)  # noqa: E731
_RMS = lambda f: lambda x, w: (f(x, w, 1e-6),)  # noqa: E731
_RMS_CLS = lambda c: lambda x, w: (c.apply(x, w, 1e-6, 0.0, "llama", True),)  # noqa: E731
_FUSED = lambda f: lambda x, r, w: tuple(f(x, r, w, 1e-6))  # noqa: E731
_FUSED_CLS = lambda c: lambda x, r, w: tuple(c.apply(x, r, w, 1e-6, 0.0, "llama", True))  # noqa: E731
_LN = lambda f: lambda x, w, b: (f(x, w, b, 1e-5),)  # noqa: E731
_LN_CLS = lambda c: lambda x, w, b: (c.apply(x, w, b, 1e-5),)  # noqa: E731
_SOFTMAX = lambda f: lambda x: (f(x),)  # noqa: E731
_SOFTMAX_CLS = lambda c: lambda x: (c.apply(x),)  # noqa: E731
_SPARSEMAX = lambda f: lambda x: (f(x, -1),)  # noqa: E731
_SPARSEMAX_CLS = lambda c: lambda x: (c.apply(x, -1),)  # noqa: E731
_DYT = lambda f: lambda x, a, g, b: (f(x, a, g, b),)  # noqa: E731
_DYT_CLS = lambda c: lambda x, a, g, b: (c.apply(x, a, g, b),)  # noqa: E731
_POLY = lambda f: lambda x, w, b: (f(x, w, b, 1e-6, True),)  # noqa: E731
_POLY_CLS = lambda c: lambda x, w, b: (c.apply(x, w, b, 1e-6, True),)  # noqa: E731
_GN = lambda f: lambda x, w, b, groups: (f(x, w, b, x.shape[1], groups, 1e-5),)  # noqa: E731
_GN_CLS = lambda c: lambda x, w, b, groups: (c.apply(x, w, b, x.shape[1], groups, 1e-5),)  # noqa: E731


def _dpo_module(cls):
    loss = cls(beta=0.1, use_ref_model=True, compiled=True)
    return lambda x, w, y, rx, rw: (loss(w, x, y, None, rx, rw)[0].float(),)


_MOE_CLS = lambda c: lambda x, gu, dp, index, w: (c.apply(x, gu, dp, index.to(torch.int32), w),)  # noqa: E731

F = "liger_kernel.transformers.functional"
CANDIDATES: Dict[str, List[Tuple[str, Callable]]] = {
    "geglu": [(f"{F}:liger_geglu", _gated(False)), ("liger_kernel.ops:LigerGELUMulFunction", _gated(True)),
              ("liger_kernel.ops.geglu:LigerGELUMulFunction", _gated(True))],
    "swiglu": [(f"{F}:liger_swiglu", _gated(False)), ("liger_kernel.ops:LigerSiLUMulFunction", _gated(True)),
               ("liger_kernel.ops.swiglu:LigerSiLUMulFunction", _gated(True))],
    "embedding": [("liger_kernel.ops:LigerEmbeddingFunction", _EMB_CLS),
                  ("liger_kernel.ops.experimental.embedding:LigerEmbeddingFunction", _EMB_CLS),
                  ("liger_kernel.ops.embedding:LigerEmbeddingFunction", _EMB_CLS)],
    "tvd": [(f"{F}:liger_tvd", _TVD), ("liger_kernel.ops:LigerTVDLossFunction", _TVD_CLS),
            ("liger_kernel.ops.tvd:LigerTVDLossFunction", _TVD_CLS)],
    "cross_entropy": [(f"{F}:liger_cross_entropy", _CE), ("liger_kernel.ops:LigerCrossEntropyFunction", _CE_CLS),
                      ("liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction", _CE_CLS)],
    "fused_linear_cross_entropy": [
        (f"{F}:liger_fused_linear_cross_entropy", _FLCE),
        ("liger_kernel.ops:LigerFusedLinearCrossEntropyFunction", _FLCE_CLS),
        ("liger_kernel.ops.fused_linear_cross_entropy:LigerFusedLinearCrossEntropyFunction", _FLCE_CLS)],
    "kl_div": [(f"{F}:liger_kl_div", _KL), ("liger_kernel.ops:LigerKLDivLossFunction", _KL_CLS),
               ("liger_kernel.ops.kl_div:LigerKLDivLossFunction", _KL_CLS)],
    "jsd": [(f"{F}:liger_jsd", _JSD), ("liger_kernel.ops:LigerJSDFunction", _JSD_CLS),
            ("liger_kernel.ops.jsd:LigerJSDFunction", _JSD_CLS)],
    "fused_linear_jsd": [(f"{F}:liger_fused_linear_jsd", _FLJSD),
                         ("liger_kernel.ops:LigerFusedLinearJSDFunction", _FLJSD_CLS),
                         ("liger_kernel.ops.fused_linear_jsd:LigerFusedLinearJSDFunction", _FLJSD_CLS)],
    "grpo_loss": [("liger_kernel.transformers.grpo_loss:triton_grpo_loss", _GRPO)],
    "rope": [("liger_kernel.transformers.rope:liger_rotary_pos_emb", _ROPE),
             ("liger_kernel.ops:LigerRopeFunction", _ROPE_CLS), ("liger_kernel.ops.rope:LigerRopeFunction", _ROPE_CLS)],
    "qwen2vl_mrope": [("liger_kernel.transformers.qwen2vl_mrope:liger_multimodal_rotary_pos_emb", _MROPE),
                      (f"{F}:liger_qwen2vl_mrope", _MROPE),
                      ("liger_kernel.ops:LigerQwen2VLMRopeFunction", _MROPE_CLS),
                      ("liger_kernel.ops.qwen2vl_mrope:LigerQwen2VLMRopeFunction", _MROPE_CLS)],
    "llama4_rope": [("liger_kernel.transformers.llama4_rope:liger_llama4_text_rotary_pos_emb", _LLAMA4),
                    ("liger_kernel.ops:LigerLlama4RopeFunction", _LLAMA4_CLS),
                    ("liger_kernel.ops.llama4_rope:LigerLlama4RopeFunction", _LLAMA4_CLS)],
    "rms_norm": [(f"{F}:liger_rms_norm", _RMS), ("liger_kernel.ops:LigerRMSNormFunction", _RMS_CLS),
                 ("liger_kernel.ops.rms_norm:LigerRMSNormFunction", _RMS_CLS)],
    "fused_add_rms_norm": [(f"{F}:liger_fused_add_rms_norm", _FUSED),
                           ("liger_kernel.ops:LigerFusedAddRMSNormFunction", _FUSED_CLS),
                           ("liger_kernel.ops.fused_add_rms_norm:LigerFusedAddRMSNormFunction", _FUSED_CLS)],
    "layer_norm": [(f"{F}:liger_layer_norm", _LN), ("liger_kernel.ops:LigerLayerNormFunction", _LN_CLS),
                   ("liger_kernel.ops.layer_norm:LigerLayerNormFunction", _LN_CLS)],
    "softmax": [(f"{F}:liger_softmax", _SOFTMAX), ("liger_kernel.ops:LigerSoftmaxFunction", _SOFTMAX_CLS),
                ("liger_kernel.ops.softmax:LigerSoftmaxFunction", _SOFTMAX_CLS)],
    "sparsemax": [(f"{F}:liger_sparsemax", _SPARSEMAX), ("liger_kernel.ops:LigerSparsemaxFunction", _SPARSEMAX_CLS),
                  ("liger_kernel.ops.sparsemax:LigerSparsemaxFunction", _SPARSEMAX_CLS)],
    "dyt": [(f"{F}:liger_dyt", _DYT), ("liger_kernel.ops:LigerDyTFunction", _DYT_CLS),
            ("liger_kernel.ops.dyt:LigerDyTFunction", _DYT_CLS)],
    "poly_norm": [(f"{F}:liger_poly_norm", _POLY), ("liger_kernel.ops:LigerPolyNormFunction", _POLY_CLS),
                  ("liger_kernel.ops.poly_norm:LigerPolyNormFunction", _POLY_CLS)],
    "group_norm": [(f"{F}:liger_group_norm", _GN), ("liger_kernel.ops:LigerGroupNormFunction", _GN_CLS),
                   ("liger_kernel.ops.group_norm:LigerGroupNormFunction", _GN_CLS)],
    "fused_linear_dpo": [("liger_kernel.chunked_loss:LigerFusedLinearDPOLoss", _dpo_module)],
    "fused_moe": [("liger_kernel.ops:LigerFusedMoEFunction", _MOE_CLS),
                  ("liger_kernel.ops.fused_moe:LigerFusedMoEFunction", _MOE_CLS)],
}

_RESOLVED: Dict[str, str] = {}


def version() -> Optional[str]:
    try:
        from importlib.metadata import version as _version

        return _version("liger-kernel")
    except Exception:
        try:
            return getattr(importlib.import_module("liger_kernel"), "__version__", "unknown")
        except Exception:
            return None


def available() -> bool:
    try:
        importlib.import_module("liger_kernel")
        return True
    except Exception:
        return False


def variant(op: str) -> Callable:
    """A function with the harness's argument convention for ``op`` (see ``specs.py``) that runs Liger;
    raises ImportError naming every place looked at."""
    errors = []
    for candidate, adapt in CANDIDATES[op]:
        module_name, attr = candidate.split(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # ImportError, AttributeError, or a backend failing to initialise
            errors.append(f"{candidate}: {type(exc).__name__}: {exc}")
            continue
        _RESOLVED[op] = f"{getattr(obj, '__module__', module_name)}.{getattr(obj, '__qualname__', attr)}"
        return adapt(obj)
    raise ImportError(f"Liger-Kernel has no {op}: " + "; ".join(errors))


def resolved() -> Dict[str, str]:
    return dict(_RESOLVED)
