"""npu_liger::llama4_rope and npu_liger::llama4_rope_backward (schema, fakes and autograd from ``_rotary.py``)."""

from __future__ import annotations

import functools
from typing import Tuple

import torch

from ..npu_ops.llama4_rope import (check_llama4_inputs, launch_llama4, llama4_rope_backward, llama4_rope_forward,
                                   new_llama4_output)
from ._rotary import define_rotary_op

__all__ = ["llama4_rope"]

llama4_rope_op, llama4_rope_backward_op, _llama4_rope_entry = define_rotary_op(
    "llama4_rope", "Tensor freqs_cis", forward=llama4_rope_forward, backward=llama4_rope_backward,
    launch_backward=functools.partial(launch_llama4, backward=True), check=check_llama4_inputs,
    new_output=new_llama4_output, qk_dims=(0, 2, 1), table_batch_dim=0,
)


def llama4_rope(q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF Llama-4 ``apply_rotary_emb(xq, xk, freqs_cis)`` through ``torch.ops.npu_liger.llama4_rope``.
    q/k (bsz, seq, heads, head_dim) with interleaved (real, imag) pairs; freqs_cis complex64
    (bsz or 1, seq, head_dim // 2) or (seq, head_dim // 2). Eager calls skip the dispatcher (``define_autograd``'s
    eager bypass)."""
    return _llama4_rope_entry(q, k, freqs_cis)
