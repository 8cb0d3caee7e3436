"""Liger-Kernel baselines, when ``liger_kernel`` is importable.

Each op maps to Liger's ``torch.autograd.Function`` (the same class ``liger_kernel.transformers`` calls):

=============  =====================================================================================
op             Liger-Kernel
=============  =====================================================================================
geglu          ``LigerGELUMulFunction.apply(a, b)`` (``liger_geglu``)
swiglu         ``LigerSiLUMulFunction.apply(a, b)`` (``liger_swiglu``)
embedding      ``LigerEmbeddingFunction.apply(weight, indices)`` (``ops/experimental/embedding.py``)
tvd            ``LigerTVDLossFunction.apply(p, q, None, "batchmean", -100)`` (``liger_tvd``); its backward
               returns a gradient for p only
rope           ``LigerRopeFunction.apply(q, k, cos, sin, None, 1)`` (``liger_rotary_pos_emb``)
qwen2vl_mrope  ``LigerQwen2VLMRopeFunction.apply(q, k, cos, sin, mrope_section, 1)`` (``liger_qwen2vl_mrope``)
llama4_rope    ``LigerLlama4RopeFunction.apply(q, k, freqs_cis)`` (``liger_llama4_text_rotary_pos_emb``)
=============  =====================================================================================

Liger rotates q/k in place (the rope family, and dq/dk in backward) and writes the geglu/swiglu gradients into
the saved inputs, so the harness hands every variant fresh inputs. Classes are looked up first in the
package (``liger_kernel.ops``, which applies Liger's per-device implementation selection) and then in the
submodules, so the lookup survives Liger moving files between releases; ``resolved()`` says what was used.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional, Tuple

CANDIDATES: Dict[str, Tuple[str, ...]] = {
    "geglu": ("liger_kernel.ops:LigerGELUMulFunction", "liger_kernel.ops.geglu:LigerGELUMulFunction"),
    "swiglu": ("liger_kernel.ops:LigerSiLUMulFunction", "liger_kernel.ops.swiglu:LigerSiLUMulFunction"),
    "embedding": (
        "liger_kernel.ops:LigerEmbeddingFunction",
        "liger_kernel.ops.experimental.embedding:LigerEmbeddingFunction",
        "liger_kernel.ops.embedding:LigerEmbeddingFunction",
    ),
    "tvd": ("liger_kernel.ops:LigerTVDLossFunction", "liger_kernel.ops.tvd:LigerTVDLossFunction"),
    "rope": ("liger_kernel.ops:LigerRopeFunction", "liger_kernel.ops.rope:LigerRopeFunction"),
    "qwen2vl_mrope": (
        "liger_kernel.ops:LigerQwen2VLMRopeFunction",
        "liger_kernel.ops.qwen2vl_mrope:LigerQwen2VLMRopeFunction",
    ),
    "llama4_rope": (
        "liger_kernel.ops:LigerLlama4RopeFunction",
        "liger_kernel.ops.llama4_rope:LigerLlama4RopeFunction",
    ),
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


def function_class(op: str):
    """Liger's autograd Function for ``op``; raises ImportError naming every place looked at."""
    errors = []
    for candidate in CANDIDATES[op]:
        module_name, attr = candidate.split(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # ImportError, AttributeError, or a backend failing to initialise
            errors.append(f"{candidate}: {type(exc).__name__}: {exc}")
            continue
        _RESOLVED[op] = f"{cls.__module__}.{cls.__qualname__}"
        return cls
    raise ImportError(f"Liger-Kernel has no {op}: " + "; ".join(errors))


def variant(op: str) -> Callable:
    """A function with the harness's argument convention for ``op`` (see ``specs.py``) that runs Liger."""
    cls = function_class(op)
    apply = cls.apply
    if op in ("geglu", "swiglu"):
        return lambda a, b: (apply(a, b),)
    if op == "embedding":
        return lambda weight, indices: (apply(weight, indices),)
    if op == "tvd":
        return lambda p, q: (apply(p, q, None, "batchmean", -100),)
    if op == "rope":
        return lambda q, k, cos, sin: tuple(apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin, None, 1))
    if op == "qwen2vl_mrope":
        from .specs import mrope_section_for

        return lambda q, k, cos, sin: tuple(
            apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin, list(mrope_section_for(q.shape[-1])), 1)
        )
    if op == "llama4_rope":
        return lambda q, k, freqs: tuple(apply(q, k, freqs))
    raise KeyError(op)


def resolved() -> Dict[str, str]:
    return dict(_RESOLVED)
