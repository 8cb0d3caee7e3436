"""npu_liger::swiglu and npu_liger::swiglu_backward (schema, fakes and autograd from ``_gated.py``)."""

from __future__ import annotations

import torch

from ..npu_ops.swiglu import swiglu_backward, swiglu_forward
from ._gated import define_gated_op

__all__ = ["swiglu"]

swiglu_op, swiglu_backward_op, _swiglu_entry = define_gated_op("swiglu", swiglu_forward, swiglu_backward)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b``: ``torch.ops.npu_liger.swiglu`` (eager calls skip the dispatcher)."""
    return _swiglu_entry(a, b)
