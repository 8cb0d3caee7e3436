"""Patching models: ``apply_to_model`` for a model already built, ``apply_to_family`` (behind the
``apply_npu_liger_to_<family>()`` functions) for models built afterwards, and the ways back."""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from typing import Iterator, Tuple

from torch import nn

from . import _patching
from .families import FAMILIES, FAMILY_BY_MODULE, Family, patch_rope, restore_rope, rope_patched
from .loss import hook_family_losses, loss_patched, patch_losses, unhook_family_losses
from .modules import patch_embedding, patch_experts, patch_gated_mlp, patched_op
from .norms import norm_summary, patch_norms


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


def _patch_modules(root: nn.Module, *, mlp: bool, embedding: bool, norm: bool = False) -> None:
    if mlp:
        for module, config in _walk(root):
            family = FAMILY_BY_MODULE.get(type(module).__module__)
            if family is None:
                continue
            name = type(module).__name__
            if name in family.mlp_classes:
                patch_gated_mlp(module, getattr(config, family.act_attr, None))
            elif name in family.expert_classes:
                patch_experts(module, getattr(config, family.act_attr, None))
    if embedding:
        get = getattr(root, "get_input_embeddings", None)
        table = get() if get is not None else None
        if table is None:
            warnings.warn(f"npu_liger: {type(root).__name__} has no input embedding to patch", stacklevel=3)
        else:
            patch_embedding(table)
    if norm:
        patch_norms(root)


def apply_to_model(model: nn.Module, *, rope: bool = True, mlp: bool = True, embedding: bool = False,
                   norm: bool = True, loss: bool = True) -> nn.Module:
    """Patch an already built transformers model in place and return it.

    - ``mlp``: every gated MLP of a supported family runs ``down_proj(op(gate_proj(x), up_proj(x)))`` with
      ``op`` = ``npu_liger.geglu`` for ``gelu_pytorch_tanh`` and ``npu_liger.swiglu`` for ``silu``, chosen from
      the config's activation (other activations: left alone, with a warning). Llama-4's stacked experts too.
      Per instance: other models are untouched.
    - ``rope``: the family's rotary function (``apply_rotary_pos_emb``, Llama-4's ``apply_rotary_emb``, ...)
      becomes the npu_liger drop-in. The attention layers look this function up in their modeling module at
      call time, so this patch is module-wide: every model of that family in the process gets it.
    - ``embedding``: the input embedding runs ``npu_liger.embedding`` (if that op exists; else a warning).
    - ``norm``: every RMSNorm of a supported family (decoder norms, Qwen3/Gemma3 q_norm/k_norm, the final norm)
      runs ``npu_liger.rms_norm`` with the casting mode that reproduces it (Gemma: offset 1, gemma casting), and
      every ``torch.nn.LayerNorm`` in the model (vision towers) runs ``npu_liger.layer_norm``. Per instance.
    - ``loss``: causal LMs compute the training loss (training mode, labels given) with
      ``npu_liger.fused_linear_cross_entropy``, without logits (``skip_logits=False`` in a call asks for them),
      while ``lm_head`` is a plain ``nn.Linear`` without hooks (else, checked per call: ``lm_head``'s own logits
      and ``npu_liger.cross_entropy``); see ``loss.py``. Per instance.

    Patching twice is harmless; ``unpatch(model)`` undoes it.
    """
    families = _families_in(model)
    if not families:
        supported = ", ".join(FAMILIES)
        warnings.warn(f"npu_liger: {type(model).__name__} contains no module of a supported family "
                      f"({supported}); nothing patched", stacklevel=2)
    if rope:
        for family in families:
            patch_rope(family)
    _patch_modules(model, mlp=mlp, embedding=embedding, norm=norm and bool(families))
    if loss:
        patch_losses(model)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``apply_to_model``: every patched module of ``model`` gets its original forward back, and the
    module-level rotary functions of its families are restored (for every model of those families)."""
    for module in model.modules():
        _patching.restore_instance(module)
    for family in _families_in(model):
        restore_rope(family)
    return model


def patch_summary(model: nn.Module) -> dict:
    """What runs through npu_liger in ``model``: ``{"mlp": {"geglu": n, ...}, "rope": [...], "embedding": n,
    "norm": {"rms_norm": n, "layer_norm": m}, "loss": n}``."""
    ops = Counter(op for op in map(patched_op, model.modules()) if op is not None)
    embeddings = sum(isinstance(m, nn.Embedding) and "forward" in _patching.instance_patches(m)
                     for m in model.modules())
    rope = [f"{family.name}.{fname}" for family in _families_in(model) for fname in rope_patched(family)]
    losses = sum(map(loss_patched, model.modules()))
    return {"mlp": dict(ops), "rope": rope, "embedding": embeddings, "norm": norm_summary(model), "loss": losses}


def _hook_init(cls: type, *, mlp: bool, embedding: bool, norm: bool) -> None:
    """Make ``cls.__init__`` patch each new instance (its MLPs, its embedding, its norms) once constructed."""
    original = _patching.original_attr(cls, "__init__")

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _patch_modules(self, mlp=mlp, embedding=embedding, norm=norm)

    functools.update_wrapper(__init__, original)  # keeps the signature transformers inspects
    _patching.set_attr(cls, "__init__", __init__)


def apply_to_family(name: str, *, rope: bool = True, mlp: bool = True, embedding: bool = False,
                    norm: bool = True, loss: bool = True) -> None:
    """Patch a family before its models are built: its rotary functions now, and a hook on its decoder
    model class so every model constructed afterwards has its MLPs (and embedding) patched. Calling again
    replaces the previous settings; ``revert(name)`` restores transformers' code."""
    family = _family(name)
    module = family.load()
    if rope:
        patch_rope(family)
    else:
        restore_rope(family)
    for cls_name in family.model_classes:
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        if mlp or embedding or norm:
            _hook_init(cls, mlp=mlp, embedding=embedding, norm=norm)
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


__all__ = ["apply_to_model", "apply_to_family", "unpatch", "revert", "patch_summary"]
