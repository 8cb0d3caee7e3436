"""Per-instance patches of transformers modules: gated MLPs, stacked experts (transformers 5.x's MoE experts and
Llama-4's, through ``npu_liger.fused_moe``), input embeddings.

A patched module gets its own ``forward`` (an instance attribute shadowing the class's), so only that module
changes, its parameters and state dict stay as they are, and ``_patching.restore_instance`` undoes it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional, Tuple

import torch
from torch import nn

import npu_liger  # the functional API: eager fast path, the registered op under compile/dispatch modes

from ..nn._gated_mlp import gated_down_proj  # down_proj(gate(a, b)), the product recomputed in backward
from . import _patching, report
from ._source import canonical, exemplar_class, squeezed

# Config activation -> npu_liger op computing ``act(gate) * up`` in one kernel.
GATED_OPS = {"gelu_pytorch_tanh": "geglu", "silu": "swiglu", "swish": "swiglu"}


def _activation_module(module: nn.Module) -> Optional[nn.Module]:
    for name in ("act_fn", "activation_fn"):  # Llama-4's MLP calls it activation_fn
        act = getattr(module, name, None)
        if act is not None:
            return act
    return None


def _gated_op_name(module: nn.Module, act_name: Optional[str]) -> Optional[str]:
    """The op for ``module``'s activation, or None (with a warning) when it must be left alone. The config's
    activation string decides; the module's activation object must be the one that string builds (so a model
    whose activation was swapped after construction is not silently changed)."""
    from transformers.activations import ACT2FN

    where = f"{type(module).__name__}"
    op = GATED_OPS.get(act_name) if isinstance(act_name, str) else None
    if op is None:
        warnings.warn(f"npu_liger: {where} uses activation {act_name!r}; only {sorted(GATED_OPS)} have a fused "
                      f"npu_liger kernel, so this MLP is left unpatched", stacklevel=4)
        return None
    act = _activation_module(module)
    if type(act) is not type(ACT2FN[act_name]):
        warnings.warn(f"npu_liger: {where}'s activation is {type(act).__name__}, not the {act_name!r} its config "
                      f"names; left unpatched", stacklevel=4)
        return None
    return op


# What the patched forwards replace, as transformers writes it (whitespace removed). A class whose forward no
# longer contains its pattern (a transformers release that changed the computation) is left alone with a
# warning rather than silently given different semantics.
_MLP_PATTERNS = ("self.act_fn(self.gate_proj(x))*self.up_proj(x)",
                 "self.activation_fn(self.gate_proj(x))*self.up_proj(x)")
_EXPERTS_PATTERNS = ("torch.bmm(hidden_states,self.gate_up_proj)", "up*self.act_fn(gate)", "self.down_proj)")
# transformers 5.x's experts loop (MixtralExperts.forward, copied by Qwen2/3-MoE, OLMoE, GLM-4-MoE, ...)
_MOE_EXPERTS_PATTERNS = ("nn.functional.linear(current_state,self.gate_up_proj[expert_idx]).chunk(2,dim=-1)",
                         "current_hidden_states=self.act_fn(gate)*up",
                         "nn.functional.linear(current_hidden_states,self.down_proj[expert_idx])",
                         "current_hidden_states*top_k_weights[token_idx,top_k_pos,None]",
                         "ifexpert_idx==self.num_experts:continue")
# use_experts_implementation's flags under which the stored layout is the one fused_moe reads
_MOE_LAYOUT = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
               "has_post_expert_norm": False}


@functools.lru_cache(maxsize=None)
def _forward_source(cls: type) -> Optional[str]:
    return squeezed(cls.forward)  # None: no source to check (e.g. a frozen install): trust the class name


def _forward_is_known(module: nn.Module, patterns, require_all: bool) -> bool:
    source = _forward_source(type(module))
    if source is None:
        return True
    found = [p in source for p in patterns]
    if all(found) if require_all else any(found):
        return True
    warnings.warn(f"npu_liger: {type(module).__name__}.forward is not the computation npu_liger knows "
                  f"(a different transformers version?); left unpatched", stacklevel=4)
    return False


def _geglu_mlp_forward(self, x):
    return gated_down_proj("geglu", self.gate_proj(x), self.up_proj(x), self.down_proj)


def _swiglu_mlp_forward(self, x):
    return gated_down_proj("swiglu", self.gate_proj(x), self.up_proj(x), self.down_proj)


def _fused_gate_up(self, x):
    """Phi-3 / GLM-4's one ``gate_up_proj`` (gate rows first): its output's two halves."""
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return gate, up


def _geglu_fused_mlp_forward(self, x):
    return gated_down_proj("geglu", *_fused_gate_up(self, x), self.down_proj)


def _swiglu_fused_mlp_forward(self, x):
    return gated_down_proj("swiglu", *_fused_gate_up(self, x), self.down_proj)


def _fused_moe_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers 5.x's ``<Family>Experts.forward`` (silu experts, 3-D ``gate_up_proj``/``down_proj``) as one
    ``npu_liger.fused_moe``; under autocast or with hidden states in another dtype than the weights (which
    transformers' ``F.linear`` would cast) the class's own forward runs."""
    if hidden_states.dtype != self.gate_up_proj.dtype or torch.is_autocast_enabled(hidden_states.device.type):
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    k = top_k_index.shape[-1]
    out = npu_liger.fused_moe(hidden_states.reshape(-1, hidden_states.shape[-1]), self.gate_up_proj,
                              self.down_proj, top_k_index.reshape(-1, k), top_k_weights.reshape(-1, k))
    return out.view(hidden_states.shape)


def _fused_moe_llama4_experts_forward(self, hidden_states):
    """Llama-4's ``Llama4TextExperts.forward``: every expert on its own block of ``hidden_states`` (the MoE block
    routes densely, the router's scores already multiplied in), i.e. ``fused_moe`` with expert ``r // T`` for row
    r and weight 1, on the transposed views of its (E, H, 2I) / (E, I, H) weights."""
    if hidden_states.dtype != self.gate_up_proj.dtype or torch.is_autocast_enabled(hidden_states.device.type):
        return type(self).forward(self, hidden_states)
    experts = self.gate_up_proj.shape[0]
    rows = hidden_states.view(-1, self.hidden_size)
    index = torch.div(torch.arange(rows.shape[0], device=rows.device), max(rows.shape[0] // experts, 1),
                      rounding_mode="floor").unsqueeze(1)
    weights = torch.ones((rows.shape[0], 1), dtype=rows.dtype, device=rows.device)
    return npu_liger.fused_moe(rows, self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2), index,
                               weights)


_MLP_FORWARDS = {"geglu": _geglu_mlp_forward, "swiglu": _swiglu_mlp_forward}
_FUSED_MLP_FORWARDS = {"geglu": _geglu_fused_mlp_forward, "swiglu": _swiglu_fused_mlp_forward}
_EXPERT_FORWARDS = {"fused_moe": _fused_moe_experts_forward}
_FORWARD_OPS = {**{f: op for table in (_MLP_FORWARDS, _FUSED_MLP_FORWARDS, _EXPERT_FORWARDS)
                   for op, f in table.items()},
                _fused_moe_llama4_experts_forward: "fused_moe"}
PATCHED_FORWARDS = frozenset(_FORWARD_OPS)


def _patch_forward(module: nn.Module, forward) -> None:
    """Give ``module`` its own ``forward`` = the module-level function ``forward`` bound to it. A
    ``functools.partial`` (unlike a bound method, which pickles as a lookup of the function's name on the
    module) pickles, survives ``torch.save``/``torch.load`` and deepcopies with the model."""
    _patching.set_instance_attr(module, "forward", functools.partial(forward, module))


def patched_function(module: nn.Module):
    """The module-level function a module's patched ``forward`` runs (None if its forward is not patched)."""
    return getattr(module.__dict__.get("forward"), "func", None)


def patched_op(module: nn.Module) -> Optional[str]:
    """The npu_liger op a patched module runs (None if unpatched)."""
    return _FORWARD_OPS.get(patched_function(module))


def patch_gated_mlp(module: nn.Module, act_name: Optional[str]) -> Optional[str]:
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` -> ``down_proj(op(gate_proj(x), up_proj(x)))``."""
    if not _forward_is_known(module, _MLP_PATTERNS, require_all=False):
        report.leave("mlp", type(module).__name__, "forward source changed", warn=False)
        return None
    op = _gated_op_name(module, act_name)
    if op is not None:
        _patch_forward(module, _MLP_FORWARDS[op])
        report.patched("mlp", type(module).__name__, op)
    else:
        report.leave("mlp", type(module).__name__, f"activation {act_name!r} has no fused kernel", warn=False)
    return op


# Gated MLPs of families the table does not name are recognised by their code (``_source.canonical``): a forward
# that is, up to names, one of these transformers forwards (each checked by its fragments) computes
# ``down_proj(act(gate) * up)`` from the same attributes. (module, class, fragments, the forwards by op)
MLP_EXEMPLARS = (
    ("llama", "LlamaMLP", ("self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))",), _MLP_FORWARDS),
    ("phi3", "Phi3MLP", ("up_states=self.gate_up_proj(hidden_states)", "gate,up_states=up_states.chunk(2,dim=-1)",
                         "up_states=up_states*self.activation_fn(gate)", "returnself.down_proj(up_states)"),
     _FUSED_MLP_FORWARDS),
)


@functools.lru_cache(maxsize=None)
def _mlp_forms() -> dict:
    forms = {}
    for family, name, fragments, forwards in MLP_EXEMPLARS:
        cls = exemplar_class(family, name)
        if cls is None:
            continue
        source, form = _forward_source(cls), canonical(cls.forward)
        if source is not None and form is not None and all(f in source for f in fragments):
            forms[form] = forwards
    return forms


def _activation_op(module: nn.Module) -> Tuple[Optional[str], str]:
    """(op, activation name) from the module's activation object: an exact instance of what ACT2FN builds for a
    name in GATED_OPS; (None, its type name) otherwise."""
    from transformers.activations import ACT2FN

    act = _activation_module(module)
    for name, op in GATED_OPS.items():
        if act is not None and type(act) is type(ACT2FN[name]):
            return op, name
    return None, type(act).__name__


def recognise_mlp(module: nn.Module):
    """The forwards (by op) for a gated MLP whose code is an exemplar's, else None."""
    form = canonical(type(module).forward)
    return _mlp_forms().get(form) if form is not None else None


def patch_structural_mlp(module: nn.Module) -> Optional[str]:
    """A gated MLP recognised by its code (``recognise_mlp``), its op chosen from its activation object; returns the
    op, or None (not a gated MLP of a known form, or an activation without a fused kernel: reported)."""
    forwards = recognise_mlp(module)
    if forwards is None:
        return None
    op, act = _activation_op(module)
    if op is None:
        report.leave("mlp", type(module).__name__, f"activation {act} has no fused kernel (only "
                     f"{sorted(GATED_OPS)})", stacklevel=4)
        return None
    _patch_forward(module, forwards[op])
    report.patched("mlp", type(module).__name__, op)
    return op


def _moe_layout_known(module: nn.Module) -> bool:
    """transformers' ``use_experts_implementation`` flags say the weights are stored as fused_moe reads them."""
    odd = {flag: getattr(module, flag) for flag, want in _MOE_LAYOUT.items()
           if getattr(module, flag, want) != want}
    if odd:
        warnings.warn(f"npu_liger: {type(module).__name__} stores its experts differently ({odd}); left unpatched",
                      stacklevel=4)
    return not odd


def patch_experts(module: nn.Module, act_name: Optional[str]) -> Optional[str]:
    """Stacked silu experts -> ``npu_liger.fused_moe``: transformers 5.x's experts loop (``MixtralExperts``
    and its copies: Qwen2/3-MoE, OLMoE, GLM-4-MoE, Qwen3-VL-MoE, Qwen3.5-MoE, HunYuan-MoE) and Llama-4's dense
    ``bmm(up * act(gate), down_proj)``. Returns "fused_moe", or None (left alone, with a warning)."""
    source = _forward_source(type(module))
    moe_loop = source is not None and all(p in source for p in _MOE_EXPERTS_PATTERNS)
    llama4 = source is not None and all(p in source for p in _EXPERTS_PATTERNS)
    if not (moe_loop or llama4):
        _forward_is_known(module, _MOE_EXPERTS_PATTERNS, require_all=True)  # warns
        return None
    op = _gated_op_name(module, act_name)  # warns for activations without a kernel
    if op not in (None, "swiglu"):
        warnings.warn(f"npu_liger: fused_moe computes silu experts; {type(module).__name__} ({op}) left unpatched",
                      stacklevel=3)
    if op != "swiglu" or (moe_loop and not _moe_layout_known(module)):
        report.leave("experts", type(module).__name__, f"activation {act_name!r} or weight layout is not what "
                     "fused_moe computes", warn=False)
        return None
    _patch_forward(module, _fused_moe_experts_forward if moe_loop else _fused_moe_llama4_experts_forward)
    report.patched("experts", type(module).__name__, "fused_moe")
    return "fused_moe"


def looks_like_experts(module: nn.Module) -> bool:
    """transformers 5.x's experts loop, by its code (the fragments of ``patch_experts``), in any family."""
    source = _forward_source(type(module))
    return source is not None and all(p in source for p in _MOE_EXPERTS_PATTERNS)


def experts_activation(module: nn.Module) -> Optional[str]:
    """The config name of an experts module's activation object (``_activation_op``), for ``patch_experts``."""
    op, name = _activation_op(module)
    return name if op is not None else None


def _embedding_forward(self, input_ids):
    return npu_liger.embedding(self.weight, input_ids, self.padding_idx)  # torch's padding_idx convention


def _scaled_embedding_forward(self, input_ids):
    """Gemma's ``*TextScaledWordEmbedding``: the lookup times ``embed_scale`` (cast as transformers does)."""
    out = npu_liger.embedding(self.weight, input_ids, self.padding_idx)
    return out * self.embed_scale.to(self.weight.dtype)


def _embedding_forward_when_compiled(self, input_ids):
    """``embedding="compiled"``: torch's own lookup in eager mode, npu_liger's inside a torch.compile graph.
    Inductor decomposes the embedding backward into an fp32 (V, D) buffer it accumulates into and then casts:
    3x the table's size in bf16 held at the end of the backward (1.5 GiB for a 128k x 2048 vocabulary), where
    torch's eager kernel and ours write the gradient once, in its own dtype."""
    if not torch.compiler.is_compiling():
        return type(self).forward(self, input_ids)
    if type(self) is nn.Embedding:
        return _embedding_forward(self, input_ids)
    return _scaled_embedding_forward(self, input_ids)


def patch_embedding(module: Optional[nn.Module], *, only_compiled: bool = False) -> bool:
    """Route an input embedding's lookup through ``torch.ops.npu_liger.embedding`` (with ``only_compiled``,
    inside torch.compile graphs only)."""
    name = type(module).__name__
    plain = type(module) is nn.Embedding
    scaled = isinstance(module, nn.Embedding) and name.endswith("ScaledWordEmbedding") and \
        isinstance(getattr(module, "embed_scale", None), torch.Tensor)
    if not (plain or scaled) or module.max_norm is not None or module.sparse \
            or module.scale_grad_by_freq:
        warnings.warn(f"npu_liger: input embedding {name} (max_norm, sparse, scale_grad_by_freq or an unknown "
                      "subclass) is left unpatched", stacklevel=3)
        return False
    if only_compiled:
        _patch_forward(module, _embedding_forward_when_compiled)
    else:
        _patch_forward(module, _scaled_embedding_forward if scaled else _embedding_forward)
    return True
