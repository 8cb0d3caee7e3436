"""npu_liger::qwen2vl_mrope and npu_liger::qwen2vl_mrope_backward (schema, fakes and autograd from ``_rotary.py``)."""

from __future__ import annotations

import functools
from typing import Sequence, Tuple

import torch

from ..npu_ops._rotary import new_rope_output
from ..npu_ops.qwen2vl_mrope import check_mrope_inputs, launch_mrope, qwen2vl_mrope_backward, qwen2vl_mrope_forward
from ._rotary import define_rotary_op

__all__ = ["qwen2vl_mrope"]

qwen2vl_mrope_op, qwen2vl_mrope_backward_op, _qwen2vl_mrope_entry = define_rotary_op(
    "qwen2vl_mrope", "Tensor cos, Tensor sin, int[] mrope_section", forward=qwen2vl_mrope_forward,
    backward=qwen2vl_mrope_backward, launch_backward=functools.partial(launch_mrope, backward=True),
    check=check_mrope_inputs, new_output=new_rope_output, qk_dims=(0, 1, 2), table_batch_dim=1,
)


def qwen2vl_mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mrope_section: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF Qwen2-VL ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1)`` through
    ``torch.ops.npu_liger.qwen2vl_mrope``. q/k (bsz, heads, seq, head_dim); cos/sin (3, bsz or 1, seq, head_dim).
    Eager calls skip the dispatcher (``define_autograd``'s eager bypass)."""
    return _qwen2vl_mrope_entry(q, k, cos, sin, list(mrope_section))
