"""Per-instance patches of the norms in transformers models: every family's RMSNorm class -> ``npu_liger.rms_norm``
with the casting mode that reproduces its rounding, ``torch.nn.LayerNorm`` (vision towers) -> ``npu_liger.layer_norm``
and ``torch.nn.GroupNorm`` (convolutional vision and audio encoders) -> ``npu_liger.group_norm``.

Each class's forward source is checked against the computation npu_liger reproduces (as ``modules.py`` does for
MLPs): a transformers release that changed it is left alone, with a warning.

The residual add before a decoder layer's norm is not fused here: it sits in each family's decoder-layer forward
(with its attention/cache arguments), which would have to be rewritten per family and per release;
``npu_liger.fused_add_rms_norm`` is there for model code written against it.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections import Counter
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from torch import nn

import npu_liger

from . import report
from ._source import canonical_forward, exemplar_class
from .families import FAMILY_BY_MODULE
from .modules import _patch_forward, patched_function


def _llama_rms_forward(self, hidden_states):
    """LlamaRMSNorm and its copies: ``weight * normalised(x).to(x.dtype)``; also Llama4TextRMSNorm from transformers
    5.25 (``normalised(x).type_as(x) * weight``, the same computation, with Llama's ``variance_epsilon``)."""
    return npu_liger.rms_norm(hidden_states, self.weight, self.variance_epsilon, 0.0, "llama")


def _llama4_rms_forward(self, x):
    """Llama4TextRMSNorm up to transformers 5.24: ``normalised(x).type_as(x) * weight`` (the llama rounding), with
    ``eps``."""
    return npu_liger.rms_norm(x, self.weight, self.eps, 0.0, "llama")


def _l2_norm_forward(self, x):
    """Llama-4's weightless qk norm up to transformers 5.24 (Llama4TextL2Norm): ``normalised(x.float()).type_as(x)``,
    with ``eps``."""
    return npu_liger.rms_norm(x, None, self.eps, 0.0, "llama")


def _weightless_rms_forward(self, x):
    """Llama-4's weightless qk norm from transformers 5.25 (Llama4TextWeightlessRMSNorm): the same, with
    ``variance_epsilon``."""
    return npu_liger.rms_norm(x, None, self.variance_epsilon, 0.0, "llama")


def _olmo2_rms_forward(self, hidden_states):
    """Olmo2RMSNorm and its copies (OLMo-3, DeepSeek-V4): ``(weight * normalised(x)).to(x.dtype)``, the product in
    fp32: the gemma rounding with offset 0."""
    return npu_liger.rms_norm(hidden_states, self.weight, self.variance_epsilon, 0.0, "gemma")


def _gemma_rms_forward(self, x):
    """GemmaRMSNorm (Gemma 1/2/3): ``(normalised(x) * (1 + weight.float())).type_as(x)``, all fp32."""
    return npu_liger.rms_norm(x, self.weight, self.eps, 1.0, "gemma")


def _layer_norm_forward(self, x):
    return npu_liger.layer_norm(x, self.weight, self.bias, self.eps)


def _group_norm_forward(self, x):
    return npu_liger.group_norm(x, self.weight, self.bias, self.num_groups, self.eps)


class _Form(NamedTuple):
    """A norm computation npu_liger reproduces: the patched forward, the fragments of the class's forward (and
    ``_norm``) source, whitespace removed, that must all be present, and the epsilon attribute the forward reads
    (what picks the form of a class without source)."""

    forward: Callable
    fragments: Tuple[str, ...]
    eps: str


# The epsilon attribute. transformers 5.25 renamed Llama-4's norms' ``eps`` to ``variance_epsilon`` (Llama's name;
# Gemma 1-3 keep ``eps``). A form whose source may read either is written once, ``{eps}`` in its fragments, and
# checked with each name; each name has its own patched forward, so a class gets the forward that reads what its
# own code reads.
def _by_eps(fragments: Tuple[str, ...], **forwards: Callable) -> Tuple[_Form, ...]:
    """One form per epsilon name: ``forwards`` maps ``eps``/``variance_epsilon`` to the forward that reads it."""
    return tuple(_Form(forward, tuple(f.format(eps=name) for f in fragments), name)
                 for name, forward in forwards.items())


_LLAMA_SOURCE = ("hidden_states.to(torch.float32)", "variance=hidden_states.pow(2).mean(-1,keepdim=True)",
                 "hidden_states*torch.rsqrt(variance+self.variance_epsilon)",
                 "returnself.weight*hidden_states.to(input_dtype)")
_OLMO2_SOURCE = _LLAMA_SOURCE[:3] + ("return(self.weight*hidden_states).to(input_dtype)",)
_NORM_METHOD = "returnx*torch.rsqrt(x.pow(2).mean(-1,keepdim=True)+self.{eps})"
_LLAMA4_SOURCE = (_NORM_METHOD, "output=self._norm(x.float()).type_as(x)", "returnoutput*self.weight")
_WEIGHTLESS_SOURCE = (_NORM_METHOD, "returnself._norm(x.float()).type_as(x)")
_GEMMA_SOURCE = (_NORM_METHOD.format(eps="eps"), "output=self._norm(x.float())",
                 "output=output*(1.0+self.weight.float())", "returnoutput.type_as(x)")

LLAMA_FORMS = (_Form(_llama_rms_forward, _LLAMA_SOURCE, "variance_epsilon"),)
OLMO2_FORMS = (_Form(_olmo2_rms_forward, _OLMO2_SOURCE, "variance_epsilon"),)
GEMMA_FORMS = (_Form(_gemma_rms_forward, _GEMMA_SOURCE, "eps"),)
LLAMA4_FORMS = _by_eps(_LLAMA4_SOURCE, eps=_llama4_rms_forward, variance_epsilon=_llama_rms_forward)
WEIGHTLESS_FORMS = _by_eps(_WEIGHTLESS_SOURCE, eps=_l2_norm_forward, variance_epsilon=_weightless_rms_forward)

# class name -> its forms (the first whose fragments match is patched). Only classes defined in a supported family's
# modeling module are patched (FAMILY_BY_MODULE).
RMS_NORM_CLASSES: Dict[str, Tuple[_Form, ...]] = {
    **{name: LLAMA_FORMS
       for name in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen2VLRMSNorm",
                    "Qwen2_5_VLRMSNorm", "Qwen3VLTextRMSNorm")},
    **{name: GEMMA_FORMS for name in ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")},
    "Llama4TextRMSNorm": LLAMA4_FORMS,
    # Llama-4's qk norm, no weight: Llama4TextL2Norm up to 5.24; from 5.25 Llama4TextWeightlessRMSNorm (the old
    # name kept as an alias of it)
    "Llama4TextL2Norm": WEIGHTLESS_FORMS,
    "Llama4TextWeightlessRMSNorm": WEIGHTLESS_FORMS,
}
# Norms of families the table does not name are recognised by their code: a class whose forward (and ``_norm``) is,
# up to names and docstrings, that of one of these transformers classes (itself checked by its fragments above)
# gets the same patch (``_source.canonical``). (module, class, forms); a class this release lacks is skipped.
EXEMPLARS = (("llama", "LlamaRMSNorm", LLAMA_FORMS),
             ("gemma", "GemmaRMSNorm", GEMMA_FORMS),
             ("olmo2", "Olmo2RMSNorm", OLMO2_FORMS),
             ("llama4", "Llama4TextRMSNorm", LLAMA4_FORMS),
             ("llama4", "Llama4TextWeightlessRMSNorm", WEIGHTLESS_FORMS),
             ("llama4", "Llama4TextL2Norm", WEIGHTLESS_FORMS))
NORM_OPS = {_olmo2_rms_forward: "rms_norm", _llama_rms_forward: "rms_norm", _llama4_rms_forward: "rms_norm",
            _gemma_rms_forward: "rms_norm", _l2_norm_forward: "rms_norm", _weightless_rms_forward: "rms_norm",
            _layer_norm_forward: "layer_norm", _group_norm_forward: "group_norm"}


def _matching(source: str, forms: Tuple[_Form, ...]) -> Optional[_Form]:
    """The first of ``forms`` whose fragments are all in ``source``."""
    return next((form for form in forms if all(f in source for f in form.fragments)), None)


@functools.lru_cache(maxsize=None)
def _exemplar_forms() -> Dict[str, Tuple]:
    """canonical form -> (patched forward, exemplar class name), for the exemplars whose source checks out."""
    forms = {}
    for family, name, candidates in EXEMPLARS:
        cls = exemplar_class(family, name)
        if cls is None:
            continue
        source = _source(cls)
        form = canonical_forward(cls, "_norm")
        matched = _matching(source, candidates) if source is not None else None
        if form is not None and matched is not None:
            forms[form] = (matched.forward, name)
    return forms


def recognise(cls: type):
    """The patched forward for a norm class the table does not name, if its code is an exemplar's; else None."""
    form = canonical_forward(cls, "_norm")
    entry = _exemplar_forms().get(form) if form is not None else None
    return None if entry is None else entry[0]


@functools.lru_cache(maxsize=None)
def _source(cls: type) -> Optional[str]:
    """forward's source and, where the class has one, ``_norm``'s, whitespace removed (None: no source)."""
    try:
        parts = [inspect.getsource(cls.forward)]
        if hasattr(cls, "_norm"):
            parts.append(inspect.getsource(cls._norm))
    except (OSError, TypeError):
        return None
    return "".join("".join(parts).split())


def _checked_forward(module: nn.Module, forms: Tuple[_Form, ...]):
    """The patched forward of the form ``module``'s class's source matches; None, with a warning, if none. Without
    source (e.g. a frozen install) the class name is trusted, the form chosen by the epsilon attribute present."""
    source = _source(type(module))
    if source is None:
        matched = next((form for form in forms if hasattr(module, form.eps)), None)
    else:
        matched = _matching(source, forms)
    if matched is not None:
        return matched.forward
    warnings.warn(f"npu_liger: {type(module).__name__}.forward is not the computation npu_liger knows (a "
                  f"different transformers version?); left unpatched", stacklevel=5)
    report.leave("norm", type(module).__name__, "forward source changed", warn=False)
    return None


def patch_norms(root: nn.Module, *, layer_norm: bool = True, group_norm: bool = True) -> int:
    """Patch every known RMSNorm of a supported family under ``root``, with ``layer_norm`` every plain
    ``torch.nn.LayerNorm`` over one dim (elementwise affine or not) and with ``group_norm`` every plain
    ``torch.nn.GroupNorm`` (affine or not; subclasses, which may change forward, are left alone); returns how many
    modules were patched."""
    patched = 0
    for module in root.modules():
        cls = type(module)
        forms = RMS_NORM_CLASSES.get(cls.__name__) if cls.__module__ in FAMILY_BY_MODULE else None
        if forms is not None:
            forward = _checked_forward(module, forms)
            if forward is not None:
                _patch_forward(module, forward)
                report.patched("norm", cls.__name__, "rms_norm")
                patched += 1
        elif recognise(cls) is not None:
            _patch_forward(module, recognise(cls))
            report.patched("norm", cls.__name__, "rms_norm")
            patched += 1
        elif layer_norm and cls is nn.LayerNorm and len(module.normalized_shape) == 1:
            _patch_forward(module, _layer_norm_forward)
            report.patched("norm", "LayerNorm", "layer_norm")
            patched += 1
        elif group_norm and cls is nn.GroupNorm:
            _patch_forward(module, _group_norm_forward)
            report.patched("norm", "GroupNorm", "group_norm")
            patched += 1
    return patched


def patched_norm_op(module: nn.Module) -> Optional[str]:
    """The npu_liger op a patched norm runs (None if not a patched norm)."""
    return NORM_OPS.get(patched_function(module))


def norm_summary(model: nn.Module) -> Dict[str, int]:
    """``{"rms_norm": n, "layer_norm": m, "group_norm": k}`` for the patched norms of ``model`` (ops that run none
    are omitted)."""
    return dict(Counter(op for op in map(patched_norm_op, model.modules()) if op is not None))


__all__ = ["RMS_NORM_CLASSES", "norm_summary", "patch_norms", "patched_norm_op"]
