"""What ``apply_to_model`` patched and what it left to transformers, with the reason: ``patch_report(model)``.

While a model is being patched, the recognisers (norms, MLPs, experts, rotary functions, losses) record here what
they patched (``patched``) and what they saw but left alone (``leave``, which also warns where a patch would have
been expected). After the pass ``apply_to_model`` scans the model for modules that look patchable by name (norms,
MLPs, experts, causal LMs) but were not patched and records them too, so nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

LOGGER = logging.getLogger("npu_liger.transformers")
KINDS = ("norm", "mlp", "experts", "rope", "loss", "embedding", "attention")


@dataclass
class PatchReport:
    """``patched[kind]``: Counter of ``"Class -> op"`` (rope: ``"module.function -> op"``); ``left[kind]``:
    ``{"Class": reason}``; ``families``: the families of the table found in the model (others were patched by
    structure alone)."""

    model: str = ""
    families: List[str] = field(default_factory=list)
    patched: Dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    left: Dict[str, Dict[str, str]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def add_patched(self, kind: str, what: str, op: str) -> None:
        self.patched[kind][f"{what} -> {op}"] += 1

    def add_left(self, kind: str, what: str, reason: str) -> None:
        self.left.setdefault(kind, {}).setdefault(what, reason)

    def is_patched(self, kind: str, what: str) -> bool:
        return any(key.split(" -> ")[0] == what for key in self.patched[kind])

    def summary(self) -> str:
        done = "; ".join(f"{kind}: " + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(c.items()))
                         for kind, c in self.patched.items() if c) or "nothing"
        left = "; ".join(f"{kind}: " + ", ".join(f"{k} ({why})" for k, why in sorted(d.items()))
                         for kind, d in self.left.items() if d) or "nothing"
        families = ", ".join(self.families) or "none of the family table (patched by module structure)"
        return f"npu_liger: {self.model} [families: {families}] patched {done}. Left to transformers: {left}"

    def __str__(self) -> str:
        return self.summary()


_ACTIVE: List[PatchReport] = []
_REPORTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def collecting(report: PatchReport):
    _ACTIVE.append(report)
    try:
        yield report
    finally:
        _ACTIVE.pop()


def active() -> Optional[PatchReport]:
    return _ACTIVE[-1] if _ACTIVE else None


def patched(kind: str, what: str, op: str) -> None:
    report = active()
    if report is not None:
        report.add_patched(kind, what, op)


def leave(kind: str, what: str, reason: str, *, warn: bool = True, stacklevel: int = 3) -> None:
    """Record that ``what`` is left to transformers (and, with ``warn``, say so as a UserWarning)."""
    report = active()
    if report is not None:
        report.add_left(kind, what, reason)
    if warn:
        warnings.warn(f"npu_liger: {what} {reason}; left unpatched", stacklevel=stacklevel + 1)


def store(model, report: PatchReport) -> None:
    _REPORTS[model] = report


def patch_report(model) -> Optional[PatchReport]:
    """The report of the last ``apply_to_model(model)`` (None if it was never patched)."""
    return _REPORTS.get(model)


__all__ = ["PatchReport", "patch_report"]
