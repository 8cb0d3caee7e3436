"""Liger-Kernel's patch functions under their own names: ``apply_liger_kernel_to_<family>(rope=True,
cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, layer_norm=None, swiglu=True, geglu=True,
model=None)`` for every family npu_liger supports, so code written for ``liger_kernel.transformers`` switches by
its import line:

    from npu_liger.transformers import apply_liger_kernel_to_llama   # was: from liger_kernel.transformers import ...

    apply_liger_kernel_to_llama()                   # before building: apply_to_family("llama", ...)
    apply_liger_kernel_to_llama(model=model)        # a built model: apply_to_model(model, ...)

The names come from the family table (``families.FAMILIES``) when this module is imported, so a family added there
gets its alias with no edit here; ``LIGER_ONLY_NAMES`` adds Liger's other names for a family we have
(``apply_liger_kernel_to_gemma3_text``). Keywords, Liger's -> ours:

- ``rope`` -> ``rope``.
- ``swiglu``, ``geglu`` -> ``mlp`` (both default True; either False turns the MLP patch off). The op follows the
  config's activation, as Liger's choice of module per family does. Each alias takes both keywords (Liger's take
  the one their family uses) and defaults to True (Liger's Qwen3-VL defaults ``swiglu`` to False).
- ``rms_norm``, ``layer_norm`` -> ``norm``: npu_liger patches a model's RMSNorm and LayerNorm modules (vision
  towers) together. ``layer_norm`` defaults to ``rms_norm`` (Liger: True); when both are given and differ, neither
  kind is patched, with a warning (a patched norm computes what its module did: this costs speed, never
  changes results).
- ``fused_linear_cross_entropy`` -> ``loss``: the causal LM's training loss through fused linear cross entropy,
  without logits (``skip_logits``), as Liger's ``lce_forward`` does.
- ``cross_entropy=True`` (Liger's unfused patch: it replaces ``torch.nn.functional.cross_entropy`` process-wide
  and keeps the logits) has no equivalent here: our loss patch drops the logits in training, which code reading
  ``outputs.logits`` would notice. So it patches no loss: transformers computes its own cross entropy (the same
  numbers), with a warning; ``npu_liger.cross_entropy`` / ``npu_liger.nn.CrossEntropyLoss`` are there for direct
  use. Both True raises ValueError, as Liger refuses it.
- ``model`` -> ``apply_to_model(model, ...)`` (Liger also swaps the family's classes for models built later; here
  call once more without ``model`` for that). A model with no module of the family raises ValueError.
The functions have real signatures (Liger's ``_apply_liger_kernel`` filters keywords by them); other keywords
raise TypeError. docs/SWITCHING.md has the whole table.
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional

from torch import nn

from .families import FAMILIES
from .model import apply_to_family, apply_to_model

# Liger-Kernel's other function names for a family of ours: Liger name -> our family (only where the family exists)
LIGER_ONLY_NAMES = {"gemma3_text": "gemma3"}


def _alias(family: str, liger_name: str) -> Callable[..., None]:
    def apply(rope: bool = True, cross_entropy: bool = False, fused_linear_cross_entropy: bool = True,
              rms_norm: bool = True, layer_norm: Optional[bool] = None, swiglu: bool = True, geglu: bool = True,
              model: nn.Module = None) -> None:
        if cross_entropy and fused_linear_cross_entropy:
            raise ValueError("cross_entropy and fused_linear_cross_entropy cannot both be True")
        if cross_entropy:
            warnings.warn("npu_liger: cross_entropy=True (Liger-Kernel's unfused loss patch, which keeps the "
                          "logits) has no npu_liger equivalent; the loss is left to transformers (same result). "
                          "fused_linear_cross_entropy=True patches it without logits; npu_liger.cross_entropy "
                          "is the op for direct use", stacklevel=2)
        if layer_norm is not None and bool(layer_norm) != bool(rms_norm):
            warnings.warn(f"npu_liger: rms_norm={rms_norm}, layer_norm={layer_norm}: npu_liger patches RMSNorm and "
                          "LayerNorm modules together, so neither is patched", stacklevel=2)
        norm = bool(rms_norm) and (layer_norm is None or bool(layer_norm))
        flags = dict(rope=bool(rope), mlp=bool(swiglu and geglu), norm=norm, loss=bool(fused_linear_cross_entropy))
        if model is None:
            apply_to_family(family, **flags)
            return
        module = getattr(FAMILIES[family], "module", None)
        if module is not None and not any(type(m).__module__ == module for m in model.modules()):
            raise ValueError(f"apply_liger_kernel_to_{liger_name}(model=...): {type(model).__name__} has no module "
                             f"of the {family} family; use the function of its own family, or "
                             "npu_liger.transformers.apply_to_model(model)")
        apply_to_model(model, **flags)

    apply.__name__ = apply.__qualname__ = f"apply_liger_kernel_to_{liger_name}"
    apply.__doc__ = (f"Liger-Kernel's ``apply_liger_kernel_to_{liger_name}``: npu_liger's patches of the {family} "
                     f"family with Liger's keywords (``apply_to_family({family!r}, ...)``, or ``apply_to_model`` "
                     "with ``model=``). See npu_liger.transformers.liger_compat for how each keyword maps.")
    return apply


def _aliases() -> Dict[str, Callable[..., None]]:
    names = {name: name for name in FAMILIES}
    names.update({liger: ours for liger, ours in LIGER_ONLY_NAMES.items()
                  if ours in FAMILIES and liger not in FAMILIES})  # a family of that name keeps its own
    return {f"apply_liger_kernel_to_{liger}": _alias(ours, liger) for liger, ours in names.items()}


ALIASES = _aliases()
globals().update(ALIASES)
# model_type -> function, as Liger-Kernel's MODEL_TYPE_TO_APPLY_LIGER_FN (the family names are transformers' model
# types)
MODEL_TYPE_TO_APPLY_LIGER_FN = {name[len("apply_liger_kernel_to_"):]: fn for name, fn in ALIASES.items()}

__all__ = ["MODEL_TYPE_TO_APPLY_LIGER_FN", *ALIASES]
