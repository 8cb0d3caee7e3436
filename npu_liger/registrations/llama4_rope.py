"""npu_liger::llama4_rope and npu_liger::llama4_rope_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Tuple

import torch

from ..npu_ops.llama4_rope import (check_llama4_inputs, launch_llama4, llama4_rope_backward, llama4_rope_forward,
                                   new_llama4_output)
from ._op import define_autograd, define_op, forbid_double_backward
from .rope import eager_kernels_allowed

__all__ = ["llama4_rope"]


def _llama4_rope_fake(q, k, freqs_cis):
    check_llama4_inputs(q, k, freqs_cis)
    return new_llama4_output(q), new_llama4_output(k)


def _llama4_rope_backward_fake(grad_q, grad_k, freqs_cis):
    check_llama4_inputs(grad_q, grad_k, freqs_cis, names=("grad_q", "grad_k"))
    return new_llama4_output(grad_q), new_llama4_output(grad_k)


llama4_rope_op = define_op(
    "llama4_rope(Tensor q, Tensor k, Tensor freqs_cis) -> (Tensor, Tensor)",
    kernel=llama4_rope_forward,
    fake=_llama4_rope_fake,
)
llama4_rope_backward_op = define_op(
    "llama4_rope_backward(Tensor grad_q, Tensor grad_k, Tensor freqs_cis) -> (Tensor, Tensor)",
    kernel=llama4_rope_backward,
    fake=_llama4_rope_backward_fake,
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _backward(ctx, grad_q, grad_k):
    (freqs_cis,) = ctx.saved_tensors
    if eager_kernels_allowed(grad_q, grad_k, freqs_cis):  # see registrations/rope.py
        return (*launch_llama4(grad_q, grad_k, freqs_cis, backward=True), None)
    return (*llama4_rope_backward_op(grad_q, grad_k, freqs_cis), None)


_llama4_rope_entry = define_autograd(llama4_rope_op, backward=_backward, setup_context=_setup_context,
                                     kernel=llama4_rope_forward)
forbid_double_backward(llama4_rope_backward_op, "llama4_rope")


def llama4_rope(q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF Llama-4 ``apply_rotary_emb(xq, xk, freqs_cis)`` through ``torch.ops.npu_liger.llama4_rope``.
    q/k (bsz, seq, heads, head_dim) with interleaved (real, imag) pairs; freqs_cis complex64
    (bsz or 1, seq, head_dim // 2) or (seq, head_dim // 2). Eager calls skip the dispatcher (``define_autograd``'s
    eager bypass)."""
    return _llama4_rope_entry(q, k, freqs_cis)
