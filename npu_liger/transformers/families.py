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

import functools
import importlib
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Tuple

from .. import _install
from . import _patching, report, rope
from ._source import canonical, squeezed

# (function name in the modeling module, drop-in, npu_liger op, fragments of transformers' source for it
# (whitespace removed) that must all be present: a release that changed the math is left alone, with a warning).
# A function that calls rotate_half must find the module's rotate_half to be Llama's (GLM's is interleaved).
PLAIN_ROPE = (("apply_rotary_pos_emb", rope.apply_rotary_pos_emb, "rope", ("(q*cos)+(rotate_half(q)*sin)",)),)
# partial rotary (Phi-3, Qwen3-Next / Qwen3.5, GLM-4-MoE, Nemotron): the first cos.shape[-1] dims rotated, the rest
# passed through
PARTIAL_ROPE = (("apply_rotary_pos_emb", rope.apply_rotary_pos_emb, "rope",
                 ("rotary_dim=cos.shape[-1]", "q_rot,q_pass=q[...,:rotary_dim],q[...,rotary_dim:]",
                  "(q_rot*cos)+(rotate_half(q_rot)*sin)", "q_pass],dim=-1)")),)
NEMOTRON_ROPE = (("apply_rotary_pos_emb", rope.apply_rotary_pos_emb, "rope",
                  ("rot_dim=cos.shape[-1]", "q,q_pass=q[...,:rot_dim],q[...,rot_dim:]", "(q*cos)+(rotate_half(q)*sin)",
                   "torch.cat((q_embed,q_pass),dim=-1)")),)
# OLMo-2/3: the plain rotation, the results cast back to q's and k's dtypes
CAST_ROPE = (("apply_rotary_pos_emb", rope.apply_rotary_pos_emb_cast, "rope",
              ("(q*cos)+(rotate_half(q)*sin)", "returnq_embed.to(q_type),k_embed.to(k_type)")),)
MROPE = (("apply_multimodal_rotary_pos_emb", rope.apply_multimodal_rotary_pos_emb, "qwen2vl_mrope",
          ("cos.split(mrope_section,dim=-1)",)),)
LLAMA4_ROPE = (("apply_rotary_emb", rope.apply_rotary_emb, "llama4_rope", ("xq_*freqs_cis[:,:,None,:]",)),)
# Rotary functions of modules the table does not name are recognised by their code: equal (``_source.canonical``)
# to one of these families' checked function. (family, its spec)
ROPE_EXEMPLARS = (("llama", PLAIN_ROPE), ("phi3", PARTIAL_ROPE), ("qwen3_next", PARTIAL_ROPE),
                  ("nemotron", NEMOTRON_ROPE), ("olmo2", CAST_ROPE))


@dataclass(frozen=True)
class Family:
    """One family of the table. ``left``: (piece, reason) for each piece of its code npu_liger leaves to
    transformers (documented in docs/FAMILIES.md; also reported by ``patch_report``). MLPs, experts and norms of
    classes not named here are patched when their code is a known form (``modules.recognise_mlp``,
    ``norms.recognise``)."""

    name: str
    module: str
    act_attr: str
    model_classes: Tuple[str, ...]
    mlp_classes: Tuple[str, ...] = ()
    expert_classes: Tuple[str, ...] = ()
    rope: Tuple[tuple, ...] = PLAIN_ROPE
    causal_lm: Tuple[str, ...] = ()
    left: Tuple[Tuple[str, str], ...] = ()
    title: str = ""

    def load(self) -> ModuleType:
        try:
            import transformers  # noqa: F401
        except ImportError as error:
            raise ImportError(_install.TRANSFORMERS_HINT) from error
        return importlib.import_module(self.module)

    def available(self) -> bool:
        """Whether the installed transformers has this family's modeling module."""
        try:
            self.load()
        except ImportError:
            return False
        return True


def _module(name: str) -> str:
    return f"transformers.models.{name}.modeling_{name}"


def _family(name, model_cls, mlp_cls, act_attr="hidden_act", **kw) -> Family:
    return Family(name, _module(name), act_attr, (model_cls,), (mlp_cls,), **kw)


def _moe_family(name, model_cls, mlp_cls, experts_cls, **kw) -> Family:
    """A MoE family of transformers 5.x: its stacked experts (3-D ``gate_up_proj``/``down_proj``) run
    ``fused_moe``; its dense/shared-expert MLP class (if any) the gated-MLP patch; router and block stay HF's."""
    return Family(name, _module(name), "hidden_act", (model_cls,), (mlp_cls,) if mlp_cls else (), (experts_cls,), **kw)


def _new(name, model_classes, causal_lm=(), rope=PLAIN_ROPE, left=(), module=None, title="") -> Family:
    """A family whose MLPs, experts and norms are found by their code (no class names needed): the table says
    which classes to hook before building, which causal LMs get the loss patch, its rotary spec and what is left."""
    classes = (model_classes,) if isinstance(model_classes, str) else tuple(model_classes)
    lms = (causal_lm,) if isinstance(causal_lm, str) else tuple(causal_lm)
    return Family(name, module or _module(name), "hidden_act", classes, rope=rope, causal_lm=lms, left=tuple(left),
                  title=title)


# Reasons for the pieces left to transformers, shared by several families.
GEMMA_NORM_POW = ("norm", "RMSNorm with torch.pow(mean + eps, -0.5) and an optional scale (Gemma-3n/4), not a form "
                  "rms_norm is verified against")
SINGLE_ROPE = ("rope", "rotary applied to q and k in separate calls (one tensor each); the rope op rotates both")
GLM_ROPE = ("rope", "interleaved partial rotary (GLM's repeat_interleave'd cos/sin)")
GRANITE_LOGITS_SCALE = ("loss", "logits divided by config.logits_scaling after lm_head; the fused loss takes no logit "
                                "scale")
GATED_NORM = ("norm", "the linear-attention layers' gated RMSNorm (norm(x) * silu(gate)) stays transformers'")
MLLAMA_LOSS = ("loss", "MllamaForCausalLM: its forward upcasts the logits (logits = self.lm_head(hidden_states)"
                       ".float()), not the causal-LM form the loss patch checks; MllamaForConditionalGeneration is "
                       "patched")
LINEAR_ATTN = ("attention", "linear-attention (gated delta net) layers stay transformers'")

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
        _moe_family("mixtral", "MixtralModel", None, "MixtralExperts", causal_lm=("MixtralForCausalLM",)),
        _moe_family("qwen2_moe", "Qwen2MoeModel", "Qwen2MoeMLP", "Qwen2MoeExperts",
                    causal_lm=("Qwen2MoeForCausalLM",)),
        _moe_family("qwen3_moe", "Qwen3MoeModel", "Qwen3MoeMLP", "Qwen3MoeExperts",
                    causal_lm=("Qwen3MoeForCausalLM",)),
        _moe_family("olmoe", "OlmoeModel", "OlmoeMLP", "OlmoeExperts", causal_lm=("OlmoeForCausalLM",)),
        _moe_family("glm4_moe", "Glm4MoeModel", "Glm4MoeMLP", "Glm4MoeExperts", rope=PARTIAL_ROPE,
                    causal_lm=("Glm4MoeForCausalLM",)),
        _moe_family("qwen3_vl_moe", "Qwen3VLMoeTextModel", "Qwen3VLMoeTextMLP", "Qwen3VLMoeTextExperts",
                    causal_lm=("Qwen3VLMoeForConditionalGeneration",)),
        _moe_family("qwen3_5_moe", "Qwen3_5MoeTextModel", "Qwen3_5MoeMLP", "Qwen3_5MoeExperts", rope=PARTIAL_ROPE,
                    causal_lm=("Qwen3_5MoeForCausalLM",), left=(GATED_NORM, LINEAR_ATTN)),
        _moe_family("hunyuan_v1_moe", "HunYuanMoEV1Model", "HunYuanMoEV1MLP", "HunYuanMoEV1Experts",
                    causal_lm=("HunYuanMoEV1ForCausalLM",)),
        # The families below name no MLP, experts or norm classes: those are found by their code.
        _new("granite", "GraniteModel", left=(GRANITE_LOGITS_SCALE,)),
        _new("smollm3", "SmolLM3Model", "SmolLM3ForCausalLM"),
        _new("ministral", "MinistralModel", "MinistralForCausalLM"),
        _new("ministral3", "Ministral3Model", "Ministral3ForCausalLM"),
        # vision-language models whose language model (and vision tower) are other modules: patched by their code
        _new("mistral3", "Mistral3Model", "Mistral3ForConditionalGeneration", rope=(),
             title="Mistral-3 (Pixtral vision)"),
        _new("llava", "LlavaModel", "LlavaForConditionalGeneration", rope=()),
        _new("internvl", "InternVLModel", "InternVLForConditionalGeneration", rope=()),
        _new("smolvlm", "SmolVLMModel", "SmolVLMForConditionalGeneration", rope=()),
        _new("nemotron", "NemotronModel", "NemotronForCausalLM", rope=NEMOTRON_ROPE,
             left=(("norm", "NemotronLayerNorm1P: a LayerNorm with (1 + weight), not layer_norm's formula"),
                   ("mlp", "relu2 MLP without a gate"))),
        _new("phi3", "Phi3Model", "Phi3ForCausalLM", rope=PARTIAL_ROPE),  # fused gate_up_proj MLP
        _new("olmo2", "Olmo2Model", "Olmo2ForCausalLM", rope=CAST_ROPE),
        _new("olmo3", "Olmo3Model", "Olmo3ForCausalLM", rope=CAST_ROPE),
        _new("glm4", "Glm4Model", "Glm4ForCausalLM", rope=(), left=(GLM_ROPE,)),  # fused gate_up_proj MLP
        _new("glm4v", "Glm4vTextModel", "Glm4vForConditionalGeneration", rope=(),
             left=(("rope", "Glm4v's rotate_half_llm (interleaved pairs)"),)),
        _new("gemma3n", "Gemma3nTextModel", "Gemma3nForCausalLM", rope=(),
             left=(GEMMA_NORM_POW, SINGLE_ROPE,
                   ("mlp", "Gemma3nTextMLP: activation sparsity (a statistical top-k on the gate)"),
                   ("loss", "Gemma3nForConditionalGeneration reads the softcap from the text config (its forward "
                            "is not the form checked); Gemma3nForCausalLM is patched"))),
        _new("gemma4", "Gemma4TextModel", "Gemma4ForCausalLM", rope=(),
             left=(GEMMA_NORM_POW, SINGLE_ROPE, ("experts", "gelu-tanh experts (fused_moe computes silu)"),
                   ("loss", "Gemma4ForConditionalGeneration: as Gemma-3n's; Gemma4ForCausalLM is patched"))),
        _new("exaone4", "Exaone4Model", "Exaone4ForCausalLM"),
        _new("hunyuan_v1_dense", "HunYuanDenseV1Model", "HunYuanDenseV1ForCausalLM", title="HunYuan-Dense"),
        _new("seed_oss", "SeedOssModel", "SeedOssForCausalLM",
             left=(("mlp", "dropout (residual_dropout) after down_proj: not the gated-MLP form"),)),
        _new("qwen3_5", "Qwen3_5TextModel", ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
             rope=PARTIAL_ROPE, left=(GATED_NORM, LINEAR_ATTN)),
        _new("qwen3_next", "Qwen3NextModel", "Qwen3NextForCausalLM", rope=PARTIAL_ROPE, left=(GATED_NORM, LINEAR_ATTN)),
        _new("falcon_h1", "FalconH1Model",
             left=(("mlp", "gate and down multipliers (muP) around the gated MLP"),
                   ("loss", "logits multiplied by lm_head_multiplier after lm_head"),
                   ("mamba", "the Mamba-2 mixer and its gated RMSNorm stay transformers'"))),
        # MllamaForCausalLM upcasts its logits (self.lm_head(hidden_states).float()), an assignment the loss
        # patch's source check does not accept: left, the report giving the table's reason
        _new("mllama", "MllamaTextModel", "MllamaForConditionalGeneration",
             left=(("mlp", "the vision tower's fc1/fc2 GELU MLP (no gate)"), MLLAMA_LOSS)),
        _new("deepseek_v3", "DeepseekV3Model", "DeepseekV3ForCausalLM",
             left=(("rope", "apply_rotary_pos_emb_interleave (rope_interleave=True, the config default: MLA's "
                            "interleaved layout); with rope_interleave=False the plain function runs rope"),)),
        _new("deepseek_v4", "DeepseekV4Model", rope=(),
             left=(("rope", "interleaved rotary on the trailing slice of each head"),
                   ("mlp", "DeepseekV4MLP / experts: not the gated-MLP or experts form npu_liger knows"),
                   ("loss", "not the causal-LM forward npu_liger knows"))),
        _new("glm4v_moe", "Glm4vMoeTextModel", "Glm4vMoeForConditionalGeneration", rope=PARTIAL_ROPE),
        _new("glm4_moe_lite", "Glm4MoeLiteModel", "Glm4MoeLiteForCausalLM", left=(
            ("rope", "apply_rotary_pos_emb_interleave (rope_interleave=True: MLA's interleaved layout); with "
                     "rope_interleave=False the plain function runs rope"),)),
        _new("granitemoe", "GraniteMoeModel", left=(GRANITE_LOGITS_SCALE,)),
        _new("phimoe", "PhimoeModel", "PhimoeForCausalLM"),
    )
}
FAMILY_BY_MODULE = {f.module: f for f in FAMILIES.values()}


def _rope_known(module: ModuleType, fname: str, fragments) -> bool:
    """``module.fname`` (its original) contains every fragment, and the rotate_half it calls is Llama's."""
    source = _source(_patching.original_attr(module, fname))
    if source is None:
        return True  # no source to check: trust the table
    if not all(f in source for f in fragments):
        return False
    if "rotate_half(" in source and hasattr(module, "rotate_half"):
        from transformers.models.llama import modeling_llama

        return canonical(module.rotate_half) == canonical(modeling_llama.rotate_half)
    return True


def patch_rope(family: Family) -> list:
    """Point the family's module-level rotary functions at the drop-ins; returns the names patched. This is
    global to the modeling module (its attention layers look the name up at call time), i.e. it reaches every
    model of the family in the process."""
    module, patched = family.load(), []
    for fname, dropin, op, fragments in family.rope:
        if not hasattr(module, fname):
            continue
        if not _rope_known(module, fname, fragments):
            warnings.warn(f"npu_liger: {family.name}'s {fname} is not the computation npu_liger knows (a "
                          f"different transformers version?); left as it is", stacklevel=3)
            report.leave("rope", f"{family.name}.{fname}", "source changed", warn=False)
        else:
            _patching.set_function(module, fname, dropin)
            report.patched("rope", f"{family.name}.{fname}", op)
            patched.append(fname)
    return patched


def restore_rope(family: Family) -> None:
    module = family.load()
    for fname, *_ in family.rope:
        _patching.restore_function(module, fname)


def rope_patched(family: Family) -> list:
    module = family.load()
    return [fname for fname, dropin, *_ in family.rope if _patching.called_function(module, fname) is dropin]


@functools.lru_cache(maxsize=None)
def _rope_forms() -> dict:
    """canonical form -> (drop-in, op) of the exemplar rotary functions whose source checks out."""
    forms = {}
    for name, spec in ROPE_EXEMPLARS:
        family = FAMILIES.get(name)
        if family is None or not family.available():
            continue
        module = family.load()
        for fname, dropin, op, fragments in spec:
            if hasattr(module, fname) and _rope_known(module, fname, fragments):
                form = canonical(_patching.original_attr(module, fname))
                if form is not None:
                    forms[form] = (dropin, op)
    return forms


STRUCTURAL_ROPE_NAMES = ("apply_rotary_pos_emb",)


def patch_structural_rope(module: ModuleType) -> list:
    """A modeling module the table does not name: its ``apply_rotary_pos_emb`` becomes a drop-in where its code
    is an exemplar's (``ROPE_EXEMPLARS``) and its rotate_half is Llama's; returns the names patched (module-wide,
    as ``patch_rope``). Rotary functions of other forms are reported as left."""
    from transformers.models.llama import modeling_llama

    patched = []
    short = module.__name__.rsplit(".", 1)[-1].replace("modeling_", "")
    for fname in STRUCTURAL_ROPE_NAMES:
        function = _patching.original_attr(module, fname) if hasattr(module, fname) else None
        if function is None:
            continue
        entry = _rope_forms().get(canonical(function))
        rotate_ok = not hasattr(module, "rotate_half") or \
            canonical(module.rotate_half) == canonical(modeling_llama.rotate_half)
        if entry is None or not rotate_ok:
            report.leave("rope", f"{short}.{fname}", "not a rotary form npu_liger computes", warn=False)
            continue
        dropin, op = entry
        _patching.set_function(module, fname, dropin)
        report.patched("rope", f"{short}.{fname}", op)
        patched.append(fname)
    return patched


def restore_structural_rope(module: ModuleType) -> None:
    for fname in STRUCTURAL_ROPE_NAMES:
        _patching.restore_function(module, fname)


def structural_rope_patched(module: ModuleType) -> list:
    short = module.__name__.rsplit(".", 1)[-1].replace("modeling_", "")
    return [f"{short}.{fname}" for fname in STRUCTURAL_ROPE_NAMES if _patching.is_function_patched(module, fname)]


_source = squeezed
