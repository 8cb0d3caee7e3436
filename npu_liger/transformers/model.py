"""Patching models: ``apply_to_model`` for a model already built, ``apply_to_family`` (behind the
``apply_npu_liger_to_<family>()`` functions) for models built afterwards, and the ways back."""

from __future__ import annotations

import functools
import sys
import warnings
from collections import Counter
from types import ModuleType
from typing import Iterator, List, Literal, Tuple, Union

from torch import nn

from . import _patching, report
from .causal_mask import patch_causal_mask, patch_default_positions, restore_causal_mask
from .report import patch_report
from .families import (FAMILIES, FAMILY_BY_MODULE, Family, patch_rope, patch_structural_rope, restore_rope,
                       restore_structural_rope, rope_patched, structural_rope_patched)
from .loss import hook_family_losses, loss_patched, patch_losses, unhook_family_losses
from .modules import (experts_activation, looks_like_experts, patch_embedding, patch_experts, patch_gated_mlp,
                      patch_structural_mlp, patched_op)
from .norms import norm_summary, patch_norms, patched_norm_op


def _walk(module: nn.Module, config=None) -> Iterator[Tuple[nn.Module, object]]:
    """Every submodule with the nearest config at or above it (MLPs of some families keep none)."""
    own = getattr(module, "config", None)
    config = config if own is None else own
    yield module, config
    for child in module.children():
        yield from _walk(child, config)


def _families_in(model: nn.Module) -> list:
    seen = {FAMILY_BY_MODULE.get(type(m).__module__) for m in model.modules()}
    return [f for f in FAMILIES.values() if f in seen]


def _modeling_modules(model: nn.Module) -> List[ModuleType]:
    """The transformers modeling modules (``transformers.models.<x>.modeling_<x>``, remote code's too) that define
    the classes of ``model``'s modules, in order of first appearance."""
    names = dict.fromkeys(type(m).__module__ for m in model.modules())
    return [sys.modules[n] for n in names if n in sys.modules and ".modeling_" in n]


def _patch_rope(model: nn.Module) -> None:
    """The rotary functions of the model's families (the table's specs), and, in modeling modules the table does
    not name, those whose code is a known form (module-wide, as the family patch)."""
    for family in _families_in(model):
        patch_rope(family)
    for module in _modeling_modules(model):
        if module.__name__ not in FAMILY_BY_MODULE:
            patch_structural_rope(module)


# ``embedding=``: True (always), False (never) or "compiled" (inside torch.compile graphs only; the default).
EmbeddingMode = Union[bool, Literal["compiled"]]


def _check_embedding_mode(embedding) -> None:
    if embedding not in (True, False, "compiled"):
        raise ValueError(f"npu_liger: embedding= must be True, False or 'compiled', got {embedding!r}")


def _patch_modules(root: nn.Module, *, mlp: bool, embedding: EmbeddingMode, norm: bool = False) -> None:
    if mlp:
        for module, config in _walk(root):
            family = FAMILY_BY_MODULE.get(type(module).__module__)
            name = type(module).__name__
            if family is not None and name in family.mlp_classes:
                patch_gated_mlp(module, getattr(config, family.act_attr, None))
            elif family is not None and name in family.expert_classes:
                patch_experts(module, getattr(config, family.act_attr, None))
            elif looks_like_experts(module):
                patch_experts(module, experts_activation(module) or getattr(config, "hidden_act", None))
            else:
                patch_structural_mlp(module)  # a gated MLP of a known form, in any family
    if embedding:
        get = getattr(root, "get_input_embeddings", None)
        table = get() if get is not None else None
        if table is None:
            warnings.warn(f"npu_liger: {type(root).__name__} has no input embedding to patch", stacklevel=3)
        else:
            only_compiled = embedding == "compiled"
            if patch_embedding(table, only_compiled=only_compiled):
                report.patched("embedding", type(table).__name__,
                               "embedding (under torch.compile)" if only_compiled else "embedding")
    if norm:
        patch_norms(root)


def apply_to_model(model: nn.Module, *, rope: bool = True, mlp: bool = True, embedding: EmbeddingMode = "compiled",
                   norm: bool = True, loss: bool = True, causal_mask: bool = True) -> nn.Module:
    """Patch an already built transformers model in place and return it.

    - ``mlp``: every gated MLP of a supported family runs ``down_proj(op(gate_proj(x), up_proj(x)))`` with
      ``op`` = ``npu_liger.geglu`` for ``gelu_pytorch_tanh`` and ``npu_liger.swiglu`` for ``silu``, chosen from
      the config's activation (other activations: left alone, with a warning). Llama-4's stacked experts too.
      Per instance: other models are untouched.
    - ``rope``: the family's rotary function (``apply_rotary_pos_emb``, Llama-4's ``apply_rotary_emb``, ...)
      becomes the npu_liger drop-in. The attention layers look this function up in their modeling module at
      call time, so this patch is module-wide: every model of that family in the process gets it.
    - ``embedding``: the input embedding runs ``npu_liger.embedding``: ``True`` always, ``"compiled"`` (the
      default) inside torch.compile graphs only, where Inductor's own embedding backward holds an fp32 copy of
      the (V, D) gradient plus its cast (``modules._embedding_forward_when_compiled``); eager mode keeps torch's
      kernel, which writes the gradient once as ours does. ``False``: never. Per instance.
    - ``norm``: every RMSNorm of a supported family (decoder norms, Qwen3/Gemma3 q_norm/k_norm, the final norm)
      runs ``npu_liger.rms_norm`` with the casting mode that reproduces it (Gemma: offset 1, gemma casting), and
      every ``torch.nn.LayerNorm`` in the model (vision towers) runs ``npu_liger.layer_norm``. Per instance.
    - ``loss``: causal LMs compute the training loss (training mode, labels given) with
      ``npu_liger.fused_linear_cross_entropy``, without logits (``skip_logits=False`` in a call asks for them),
      while ``lm_head`` is a plain ``nn.Linear`` without hooks (else, checked per call: ``lm_head``'s own logits
      and ``npu_liger.cross_entropy``); see ``loss.py``. Per instance.
    - ``causal_mask``: under torch.compile, a causal mask without padding reaches SDPA as ``is_causal=True``, as
      in eager mode, instead of a dense mask tensor that costs attention its causal kernels (``causal_mask.py``;
      the same results). Process-wide, as transformers' mask functions are.

    Families the table (``families.FAMILIES``) does not name are patched by module structure: an RMSNorm, a gated
    MLP (``gate_proj``/``up_proj`` or one ``gate_up_proj``), stacked experts, a modeling module's
    ``apply_rotary_pos_emb`` or a causal LM whose code is, up to names, that of a known transformers class or
    function (``_source.canonical``; the activation must be silu or gelu-tanh, the loss HF's ``ForCausalLMLoss``).
    What was patched and what was left, with the reason, is logged (``logging`` "npu_liger.transformers": INFO for
    families of the table, WARNING for a model patched by structure alone) and kept: ``patch_report(model)``.

    Patching twice is harmless; ``unpatch(model)`` undoes it.
    """
    _check_embedding_mode(embedding)
    families = _families_in(model)
    rep = report.PatchReport(model=type(model).__name__, families=[f.name for f in families])
    with report.collecting(rep):
        if rope:
            _patch_rope(model)
        _patch_modules(model, mlp=mlp, embedding=embedding, norm=norm)
        if loss:
            patch_losses(model)
        if causal_mask and patch_causal_mask():
            patch_default_positions(model)
        _note_left(model, rep, dict(rope=rope, mlp=mlp, norm=norm, loss=loss))
    report.store(model, rep)
    # the causal-mask patch is transformers-wide: a model of which nothing else was patched still says so
    patched_here = any(count for kind, count in rep.patched.items() if kind != "attention")
    if not patched_here and families:
        # recognised, but every piece asked for is one the family's code keeps (e.g. Granite's scaled logits)
        off = [piece for piece, on in dict(rope=rope, mlp=mlp, norm=norm, loss=loss).items() if not on]
        left = "; ".join(f"{kind}: " + ", ".join(f"{k} ({why})" for k, why in sorted(d.items()))
                         for kind, d in rep.left.items() if d) or "nothing found to patch"
        warnings.warn(f"npu_liger: {type(model).__name__} is of the family {', '.join(rep.families)}, but nothing was "
                      f"patched: what was asked for is left to transformers, because {left}"
                      + (f" (turned off by the call: {', '.join(off)})" if off else ""), stacklevel=2)
    elif not patched_here:
        supported = ", ".join(FAMILIES)
        warnings.warn(f"npu_liger: {type(model).__name__} contains no module of a supported family ({supported}) "
                      f"and no module of a form npu_liger recognises; nothing patched ({rep.summary()})",
                      stacklevel=2)
    elif not families:
        report.LOGGER.warning(rep.summary())  # patched by structure alone: say what
    else:
        report.LOGGER.info(rep.summary())
    return model


_CANDIDATES = (("norm", ("RMSNorm", "LayerNorm", "LayerNorm1P", "L2Norm")), ("mlp", ("MLP", "Mlp")),
               ("experts", ("Experts",)), ("loss", ("ForCausalLM", "ForConditionalGeneration")))


def _note_left(model: nn.Module, rep: "report.PatchReport", flags: dict) -> None:
    """Record in the report the modules that look patchable by their class name but were not patched, with the
    family table's reason where it gives one."""
    reasons = {}
    for family in _families_in(model):
        for piece, why in family.left:
            reasons.setdefault(piece, why)
    for module in model.modules():
        name = type(module).__name__
        patched = patched_op(module) is not None or patched_norm_op(module) is not None or loss_patched(module)
        if patched:
            continue
        for kind, suffixes in _CANDIDATES:
            if flags.get("mlp" if kind == "experts" else kind, True) and name.endswith(suffixes) and \
                    not rep.is_patched(kind, name):
                rep.add_left(kind, name, reasons.get(kind, "not a form npu_liger recognises"))
    for piece, why in reasons.items():
        if piece not in ("norm", "mlp", "experts", "loss"):  # rope, attention, ...: functions, not modules
            rep.add_left(piece, "(family table)", why)


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``apply_to_model``: every patched module of ``model`` gets its original forward back, and the
    module-level rotary functions of its families and transformers' causal-mask function are restored (for every
    model of those families, and every model)."""
    for module in model.modules():
        _patching.restore_instance(module)
    restore_causal_mask()
    for family in _families_in(model):
        restore_rope(family)
    for module in _modeling_modules(model):
        if module.__name__ not in FAMILY_BY_MODULE:
            restore_structural_rope(module)
    return model


def patch_summary(model: nn.Module) -> dict:
    """What runs through npu_liger in ``model``: ``{"mlp": {"geglu": n, ...}, "rope": [...], "embedding": n,
    "norm": {"rms_norm": n, "layer_norm": m}, "loss": n}``."""
    ops = Counter(op for op in map(patched_op, model.modules()) if op is not None)
    embeddings = sum(isinstance(m, nn.Embedding) and "forward" in _patching.instance_patches(m)
                     for m in model.modules())
    rope = [f"{family.name}.{fname}" for family in _families_in(model) for fname in rope_patched(family)]
    rope += [name for module in _modeling_modules(model) if module.__name__ not in FAMILY_BY_MODULE
             for name in structural_rope_patched(module)]
    losses = sum(map(loss_patched, model.modules()))
    return {"mlp": dict(ops), "rope": rope, "embedding": embeddings, "norm": norm_summary(model), "loss": losses}


def _hook_init(cls: type, *, mlp: bool, embedding: EmbeddingMode, norm: bool, rope: bool = False,
               causal_mask: bool = False) -> None:
    """Make ``cls.__init__`` patch each new instance (its MLPs, its embedding, its norms, and with ``rope`` the
    rotary functions of the modules it is built from: a vision-language model's language model) once
    constructed."""
    original = _patching.original_attr(cls, "__init__")

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _patch_modules(self, mlp=mlp, embedding=embedding, norm=norm)
        if rope:
            _patch_rope(self)
        if causal_mask:
            patch_default_positions(self)

    functools.update_wrapper(__init__, original)  # keeps the signature transformers inspects
    _patching.set_attr(cls, "__init__", __init__)


def apply_to_family(name: str, *, rope: bool = True, mlp: bool = True, embedding: EmbeddingMode = "compiled",
                    norm: bool = True, loss: bool = True, causal_mask: bool = True) -> None:
    """Patch a family before its models are built: its rotary functions now, and a hook on its decoder
    model class so every model constructed afterwards has its MLPs (and embedding) patched. Calling again
    replaces the previous settings; ``revert(name)`` restores transformers' code (``revert()`` also the
    process-wide ``causal_mask`` patch, see ``apply_to_model``)."""
    _check_embedding_mode(embedding)
    family = _family(name)
    module = family.load()
    causal_mask = causal_mask and patch_causal_mask()
    if rope:
        patch_rope(family)
    else:
        restore_rope(family)
    for cls_name in family.model_classes:
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        if mlp or embedding or norm or rope or causal_mask:
            _hook_init(cls, mlp=mlp, embedding=embedding, norm=norm, rope=rope, causal_mask=causal_mask)
        else:
            _patching.restore_attr(cls, "__init__")
    hook_family_losses(name, loss)


def revert(*families: str) -> None:
    """Restore transformers' code. With family names: their rotary functions and construction hooks (models
    already built keep their patched modules: ``unpatch`` those). Without: everything npu_liger.transformers
    changed, including every live patched module."""
    if not families:
        _patching.restore_everything()
        return
    for name in families:
        family = _family(name)
        restore_rope(family)
        module = family.load()
        for cls_name in family.model_classes:
            cls = getattr(module, cls_name, None)
            if cls is not None:
                _patching.restore_attr(cls, "__init__")
        unhook_family_losses(name)


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; expected one of {sorted(FAMILIES)}") from None


__all__ = ["apply_to_model", "apply_to_family", "unpatch", "revert", "patch_summary", "patch_report"]
