"""The supported model families: what each one's modeling file calls, and what npu_liger replaces.

Per family: the transformers modeling module; the config attribute naming the MLP activation; the decoder
model classes (hooked by the ``apply_npu_liger_to_<family>()`` functions so models built afterwards are
patched as they are constructed); the gated-MLP and stacked-experts classes (patched per instance); and the
module-level rotary functions the attention layers look up at call time, with their drop-ins and ops.
Only names present in the installed transformers are touched. Qwen2-VL's text attention calls
``apply_multimodal_rotary_pos_emb`` in 4.x (-> the ``qwen2vl_mrope`` op) and, in 5.x, the plain
``apply_rotary_pos_emb`` on cos/sin whose M-RoPE sections its rotary module has already merged (-> ``rope``,
the same arithmetic; docs/DESIGN.md explains why ``qwen2vl_mrope`` is not used there). Qwen2.5-VL and Qwen3-VL
(5.x) work the same way.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Tuple

from .. import _install
from . import _patching, rope

# (function name in the modeling module, drop-in, npu_liger op, a fragment of transformers' source for it
# (whitespace removed) that must be present: a release that changed the math is left alone, with a warning)
PLAIN_ROPE = (("apply_rotary_pos_emb", rope.apply_rotary_pos_emb, "rope", "(q*cos)+(rotate_half(q)*sin)"),)
MROPE = (("apply_multimodal_rotary_pos_emb", rope.apply_multimodal_rotary_pos_emb, "qwen2vl_mrope",
          "cos.split(mrope_section,dim=-1)"),)
LLAMA4_ROPE = (("apply_rotary_emb", rope.apply_rotary_emb, "llama4_rope",
                "xq_*freqs_cis[:,:,None,:]"),)


@dataclass(frozen=True)
class Family:
    name: str
    module: str
    act_attr: str
    model_classes: Tuple[str, ...]
    mlp_classes: Tuple[str, ...]
    expert_classes: Tuple[str, ...] = ()
    rope: Tuple[tuple, ...] = PLAIN_ROPE

    def load(self) -> ModuleType:
        try:
            import transformers  # noqa: F401
        except ImportError as error:
            raise ImportError(_install.TRANSFORMERS_HINT) from error
        return importlib.import_module(self.module)


def _family(name, model_cls, mlp_cls, act_attr="hidden_act", **kw) -> Family:
    return Family(name, f"transformers.models.{name}.modeling_{name}", act_attr, (model_cls,), (mlp_cls,), **kw)


def _moe_family(name, model_cls, mlp_cls, experts_cls, **kw) -> Family:
    """A MoE family of transformers 5.x: its stacked experts (3-D ``gate_up_proj``/``down_proj``) run
    ``fused_moe``; its dense/shared-expert MLP class (if any) the gated-MLP patch; router and block stay HF's."""
    return Family(name, f"transformers.models.{name}.modeling_{name}", "hidden_act", (model_cls,),
                  (mlp_cls,) if mlp_cls else (), (experts_cls,), **kw)


FAMILIES = {
    f.name: f
    for f in (
        _family("llama", "LlamaModel", "LlamaMLP"),
        _family("mistral", "MistralModel", "MistralMLP"),
        _family("qwen2", "Qwen2Model", "Qwen2MLP"),
        _family("qwen3", "Qwen3Model", "Qwen3MLP"),
        _family("gemma", "GemmaModel", "GemmaMLP"),
        _family("gemma2", "Gemma2Model", "Gemma2MLP", act_attr="hidden_activation"),
        _family("gemma3", "Gemma3TextModel", "Gemma3MLP", act_attr="hidden_activation"),
        _family("qwen2_vl", "Qwen2VLTextModel", "Qwen2MLP", rope=PLAIN_ROPE + MROPE),
        # 5.x only: their rotary modules merge the M-RoPE sections into cos/sin (Qwen3-VL interleaved), and
        # the text attention calls the plain apply_rotary_pos_emb (docs/DESIGN.md, "M-RoPE on transformers 5.x")
        _family("qwen2_5_vl", "Qwen2_5_VLTextModel", "Qwen2MLP"),
        _family("qwen3_vl", "Qwen3VLTextModel", "Qwen3VLTextMLP"),
        _family("llama4", "Llama4TextModel", "Llama4TextMLP", expert_classes=("Llama4TextExperts",),
                rope=LLAMA4_ROPE),
        _moe_family("mixtral", "MixtralModel", None, "MixtralExperts"),
        _moe_family("qwen2_moe", "Qwen2MoeModel", "Qwen2MoeMLP", "Qwen2MoeExperts"),
        _moe_family("qwen3_moe", "Qwen3MoeModel", "Qwen3MoeMLP", "Qwen3MoeExperts"),
        _moe_family("olmoe", "OlmoeModel", "OlmoeMLP", "OlmoeExperts"),
        # partial rotary (rotary dims first, the rest passed through) written differently: rope left to transformers
        _moe_family("glm4_moe", "Glm4MoeModel", "Glm4MoeMLP", "Glm4MoeExperts", rope=()),
        _moe_family("qwen3_vl_moe", "Qwen3VLMoeTextModel", "Qwen3VLMoeTextMLP", "Qwen3VLMoeTextExperts"),
        _moe_family("qwen3_5_moe", "Qwen3_5MoeTextModel", "Qwen3_5MoeMLP", "Qwen3_5MoeExperts", rope=()),  # as GLM
        _moe_family("hunyuan_v1_moe", "HunYuanMoEV1Model", "HunYuanMoEV1MLP", "HunYuanMoEV1Experts"),
    )
}
FAMILY_BY_MODULE = {f.module: f for f in FAMILIES.values()}


def patch_rope(family: Family) -> list:
    """Point the family's module-level rotary functions at the drop-ins; returns the names patched. This is
    global to the modeling module (its attention layers look the name up at call time), i.e. it reaches every
    model of the family in the process."""
    module, patched = family.load(), []
    for fname, dropin, _op, fragment in family.rope:
        if not hasattr(module, fname):
            continue
        source = _source(_patching.original_attr(module, fname))
        if source is not None and fragment not in source:
            warnings.warn(f"npu_liger: {family.name}'s {fname} is not the computation npu_liger knows (a "
                          f"different transformers version?); left as it is", stacklevel=3)
        else:
            _patching.set_attr(module, fname, dropin)
            patched.append(fname)
    return patched


def restore_rope(family: Family) -> None:
    module = family.load()
    for fname, *_ in family.rope:
        _patching.restore_attr(module, fname)


def rope_patched(family: Family) -> list:
    module = family.load()
    return [fname for fname, dropin, *_ in family.rope if getattr(module, fname, None) is dropin]


_source = squeezed
