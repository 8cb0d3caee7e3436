"""npu_liger::qwen2vl_mrope and npu_liger::qwen2vl_mrope_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ..npu_ops.qwen2vl_mrope import check_mrope_inputs, launch_mrope, qwen2vl_mrope_backward, qwen2vl_mrope_forward
from ..npu_ops.rope import new_rope_output
from ._op import define_autograd, define_op, forbid_double_backward
from .rope import eager_kernels_allowed

__all__ = ["qwen2vl_mrope"]


def _qwen2vl_mrope_fake(q, k, cos, sin, mrope_section):
    check_mrope_inputs(q, k, cos, sin, mrope_section)
    return new_rope_output(q), new_rope_output(k)


def _qwen2vl_mrope_backward_fake(grad_q, grad_k, cos, sin, mrope_section):
    check_mrope_inputs(grad_q, grad_k, cos, sin, mrope_section, names=("grad_q", "grad_k"))
    return new_rope_output(grad_q), new_rope_output(grad_k)


qwen2vl_mrope_op = define_op(
    "qwen2vl_mrope(Tensor q, Tensor k, Tensor cos, Tensor sin, int[] mrope_section) -> (Tensor, Tensor)",
    kernel=qwen2vl_mrope_forward,
    fake=_qwen2vl_mrope_fake,
)
qwen2vl_mrope_backward_op = define_op(
    "qwen2vl_mrope_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int[] mrope_section)"
    " -> (Tensor, Tensor)",
    kernel=qwen2vl_mrope_backward,
    fake=_qwen2vl_mrope_backward_fake,
)


def _setup_context(ctx, inputs, output):
    _, _, cos, sin, mrope_section = inputs
    ctx.save_for_backward(cos, sin)
    ctx.mrope_section = list(mrope_section)


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    if eager_kernels_allowed(grad_q, grad_k, cos, sin):  # see registrations/rope.py
        return (*launch_mrope(grad_q, grad_k, cos, sin, ctx.mrope_section, backward=True), None, None, None)
    return (*qwen2vl_mrope_backward_op(grad_q, grad_k, cos, sin, ctx.mrope_section), None, None, None)


_qwen2vl_mrope_entry = define_autograd(qwen2vl_mrope_op, backward=_backward, setup_context=_setup_context,
                                       kernel=qwen2vl_mrope_forward)
forbid_double_backward(qwen2vl_mrope_backward_op, "qwen2vl_mrope")


def qwen2vl_mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mrope_section: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF Qwen2-VL ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1)`` through
    ``torch.ops.npu_liger.qwen2vl_mrope``. q/k (bsz, heads, seq, head_dim); cos/sin (3, bsz or 1, seq, head_dim).
    Eager calls skip the dispatcher (``define_autograd``'s eager bypass)."""
    return _qwen2vl_mrope_entry(q, k, cos, sin, list(mrope_section))
