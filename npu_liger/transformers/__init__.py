"""Hugging Face transformers integration: run transformers models on npu_liger's ops.

    import npu_liger.transformers as nlt

    model = nlt.apply_to_model(model)             # a built model: gated MLPs -> geglu/swiglu, rotary -> rope ops,
                                                  # RMSNorm -> rms_norm, nn.LayerNorm -> layer_norm
    nlt.apply_npu_liger_to_llama()                # or before building: models constructed afterwards are patched
    model = torch.compile(model, fullgraph=True)  # the ops are opaque graph nodes; no graph breaks
    nlt.unpatch(model); nlt.revert()              # and back

Families: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 (text), Qwen2-VL, Qwen2.5-VL and Qwen3-VL (text
models), Llama-4 (text); MoE (experts -> ``fused_moe``): Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4-MoE,
Qwen3-VL-MoE and Qwen3.5-MoE (text models), HunYuan-MoE, and Llama-4's experts.
Drop-in functions with transformers' signatures: ``apply_rotary_pos_emb``, ``apply_multimodal_rotary_pos_emb``
(Qwen2-VL), ``apply_rotary_emb`` (Llama-4). ``count_npu_liger_ops()`` shows which ops really ran.

transformers is an optional dependency (the ``hf`` extra): it is imported only when a model or family is
patched, never by importing this package.
"""

from __future__ import annotations

from .families import FAMILIES
from .liger_compat import *  # noqa: F401,F403 - Liger-Kernel's apply_liger_kernel_to_<family> names
from .model import EmbeddingMode, apply_to_family, apply_to_model, patch_report, patch_summary, revert, unpatch
from .ops_used import count_npu_liger_ops
from .rope import apply_multimodal_rotary_pos_emb, apply_rotary_emb, apply_rotary_pos_emb


def _family_patcher(name: str, title: str):
    def patch(*, rope: bool = True, mlp: bool = True, embedding: EmbeddingMode = "compiled", norm: bool = True,
              loss: bool = True, causal_mask: bool = True) -> None:
        apply_to_family(name, rope=rope, mlp=mlp, embedding=embedding, norm=norm, loss=loss,
                        causal_mask=causal_mask)

    patch.__name__ = patch.__qualname__ = f"apply_npu_liger_to_{name}"
    experts = " and experts" if FAMILIES[name].expert_classes else ""
    patch.__doc__ = (f"Patch {title} before building models: its rotary function now (module-wide), and its "
                     f"MLPs{experts} and norms (and the input embedding: under torch.compile by default, "
                     f"always with ``embedding=True``) of every model constructed afterwards, and (``loss``) "
                     f"the training loss of its causal LMs through fused linear cross entropy; ``causal_mask``: "
                     f"see ``apply_to_model``. ``revert({name!r})`` undoes it.")
    return patch


apply_npu_liger_to_llama = _family_patcher("llama", "Llama")
apply_npu_liger_to_mistral = _family_patcher("mistral", "Mistral")
apply_npu_liger_to_qwen2 = _family_patcher("qwen2", "Qwen2")
apply_npu_liger_to_qwen3 = _family_patcher("qwen3", "Qwen3")
apply_npu_liger_to_gemma = _family_patcher("gemma", "Gemma")
apply_npu_liger_to_gemma2 = _family_patcher("gemma2", "Gemma2")
apply_npu_liger_to_gemma3 = _family_patcher("gemma3", "Gemma3 (text model)")
apply_npu_liger_to_qwen2_vl = _family_patcher("qwen2_vl", "Qwen2-VL (text model)")
apply_npu_liger_to_qwen2_5_vl = _family_patcher("qwen2_5_vl", "Qwen2.5-VL (text model)")
apply_npu_liger_to_qwen3_vl = _family_patcher("qwen3_vl", "Qwen3-VL (text model)")
apply_npu_liger_to_llama4 = _family_patcher("llama4", "Llama-4 (text model)")
apply_npu_liger_to_mixtral = _family_patcher("mixtral", "Mixtral")
apply_npu_liger_to_qwen2_moe = _family_patcher("qwen2_moe", "Qwen2-MoE")
apply_npu_liger_to_qwen3_moe = _family_patcher("qwen3_moe", "Qwen3-MoE")
apply_npu_liger_to_olmoe = _family_patcher("olmoe", "OLMoE")
apply_npu_liger_to_glm4_moe = _family_patcher("glm4_moe", "GLM-4-MoE")
apply_npu_liger_to_qwen3_vl_moe = _family_patcher("qwen3_vl_moe", "Qwen3-VL-MoE (text model)")
apply_npu_liger_to_qwen3_5_moe = _family_patcher("qwen3_5_moe", "Qwen3.5-MoE (text model)")
apply_npu_liger_to_hunyuan_v1_moe = _family_patcher("hunyuan_v1_moe", "HunYuan-MoE")

__all__ = [
    "FAMILIES",
    "apply_multimodal_rotary_pos_emb",
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "apply_to_family",
    "apply_to_model",
    "count_npu_liger_ops",
    "patch_report",
    "patch_summary",
    "revert",
    "unpatch",
    *(f"apply_npu_liger_to_{name}" for name in FAMILIES),
]
