"""npu_liger::rope and npu_liger::rope_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Tuple

import torch

from ..npu_ops.rope import check_rope_inputs, new_rope_output, rope_backward, rope_forward
from ._op import define_autograd, define_op, forbid_double_backward

__all__ = ["rope"]


def _rope_fake(q, k, cos, sin):
    check_rope_inputs(q, k, cos, sin)
    return new_rope_output(q), new_rope_output(k)


def _rope_backward_fake(grad_q, grad_k, cos, sin):
    check_rope_inputs(grad_q, grad_k, cos, sin, names=("grad_q", "grad_k"))
    return new_rope_output(grad_q), new_rope_output(grad_k)


rope_op = define_op(
    "rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)", kernel=rope_forward, fake=_rope_fake
)
rope_backward_op = define_op(
    "rope_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    kernel=rope_backward,
    fake=_rope_backward_fake,
)


def _setup_context(ctx, inputs, output):
    _, _, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    return (*rope_backward_op(grad_q, grad_k, cos, sin), None, None)


define_autograd(rope_op, backward=_backward, setup_context=_setup_context)
forbid_double_backward(rope_backward_op, "rope")


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through ``torch.ops.npu_liger.rope``.
    q/k (bsz, heads, seq, head_dim); cos/sin (1 or bsz, seq, rotary_dim) or (seq, rotary_dim)."""
    return rope_op(q, k, cos, sin)
