"""Which npu_liger ops a piece of code really runs, observed at the dispatcher (not inferred from patches).

``count_npu_liger_ops()`` counts ``torch.ops.npu_liger.*`` calls (backward ops included) while the block runs:

- ``compiled=False`` (default): a ``TorchDispatchMode``, which sees every op call below autograd. Eager code
  only: ``torch.compile`` refuses to trace under a user dispatch mode.
- ``compiled=True``: the autograd profiler's dispatcher records, which also see the calls that
  Inductor-generated code makes; use it around compiled models. (Not for eager code: there the functional
  API's eager fast path calls the kernels without the dispatcher, except under a dispatch mode.)

    with count_npu_liger_ops() as ops:
        model(input_ids=ids, labels=ids).loss.backward()
    ops  # Counter({'npu_liger::swiglu': 2, 'npu_liger::swiglu_backward': 2, ...})
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from ..registrations._op import NAMESPACE


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for the block (only around the profiler's start and stop)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _OpCounter(TorchDispatchMode):
    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == NAMESPACE:
            self.counts[f"{NAMESPACE}::{func._opname}"] += 1
        return func(*args, **(kwargs or {}))


class count_npu_liger_ops(contextlib.AbstractContextManager):
    """Context manager counting ``torch.ops.npu_liger.*`` calls; ``with`` gives the Counter, also kept as
    ``.counts`` (keys like ``"npu_liger::rope"``)."""

    def __init__(self, compiled: bool = False):
        self.compiled = compiled
        self.counts: Counter = Counter()
        self._context = None

    def __enter__(self) -> Counter:
        if self.compiled:
            from torch.profiler import ProfilerActivity, profile

            self._context = profile(activities=[ProfilerActivity.CPU])
            with _quiet_stderr():  # kineto prints a start/stop banner on the C++ stderr
                self._context.__enter__()
        else:
            self._context = _OpCounter(self.counts)
            self._context.__enter__()
        return self.counts

    def __exit__(self, *exc):
        context, self._context = self._context, None
        if self.compiled:
            with _quiet_stderr():
                context.__exit__(*exc)
        else:
            context.__exit__(*exc)
        if self.compiled:
            for event in context.key_averages():
                name = event.key.replace(".default", "").replace(".", "::", 1)
                if name.startswith(f"{NAMESPACE}::"):
                    self.counts[name] += event.count
        return False


__all__ = ["count_npu_liger_ops"]
