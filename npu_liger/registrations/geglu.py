"""npu_liger::geglu and npu_liger::geglu_backward (schema, fakes and autograd from ``_gated.py``)."""

from __future__ import annotations

import torch

from ..npu_ops.geglu import geglu_backward, geglu_forward
from ._gated import define_gated_op

__all__ = ["geglu"]

geglu_op, geglu_backward_op, _geglu_entry = define_gated_op("geglu", geglu_forward, geglu_backward)


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(a, approximate="tanh") * b``: ``torch.ops.npu_liger.geglu`` (eager calls skip the dispatcher)."""
    return _geglu_entry(a, b)
