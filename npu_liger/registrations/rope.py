"""npu_liger::rope and npu_liger::rope_backward (schema, fakes and autograd from ``_rotary.py``)."""

from __future__ import annotations

import functools
from typing import Tuple

import torch

from ..npu_ops._rotary import launch_half_split, new_rope_output
from ..npu_ops.rope import check_rope_inputs, rope_backward, rope_forward
from ._rotary import define_rotary_op

__all__ = ["rope"]

rope_op, rope_backward_op, _rope_entry = define_rotary_op(
    "rope", "Tensor cos, Tensor sin", forward=rope_forward, backward=rope_backward,
    launch_backward=functools.partial(launch_half_split, backward=True), check=check_rope_inputs,
    new_output=new_rope_output, qk_dims=(0, 1, 2), table_batch_dim=0,
)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through ``torch.ops.npu_liger.rope``.
    q/k (bsz, heads, seq, head_dim); cos/sin (1 or bsz, seq, rotary_dim) or (seq, rotary_dim).
    Eager calls skip the dispatcher (``define_autograd``'s eager bypass)."""
    return _rope_entry(q, k, cos, sin)
