"""npu_liger::rope and npu_liger::rope_backward: schema -> fake -> device kernels -> autograd."""

from __future__ import annotations

from typing import Tuple

import torch

from ..npu_ops.rope import check_rope_inputs, launch_rope, new_rope_output, rope_backward, rope_forward
from ._op import define_autograd, define_op, forbid_double_backward

__all__ = ["rope"]

_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def eager_kernels_allowed(*tensors) -> bool:
    """Whether a backward formula may launch its kernels directly instead of calling its backward op: plain
    eager tensors only (the same conditions as the forward's eager bypass in ``_op.py``), none of them needing a
    graph (create_graph=True must reach the backward op's double-backward error). Under torch.compile, dispatch
    modes, functorch or tensor subclasses (DTensor, FakeTensor, ...) the backward op must be seen.
    Saves the dispatcher round trip and the op's Python autograd wrapper on every backward (tens of µs)."""
    if _is_compiling() or _dispatch_stack_len() > 0 or _functorch_active():
        return False
    grad_mode = _grad_enabled()
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS or (grad_mode and t.requires_grad):
            return False
    return True


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
    if eager_kernels_allowed(grad_q, grad_k, cos, sin):
        # autograd hands gradients of the outputs' shape, dtype and device; cos/sin were checked by the forward
        return (*launch_rope(grad_q, grad_k, cos, sin, backward=True), None, None)
    return (*rope_backward_op(grad_q, grad_k, cos, sin), None, None)


_rope_entry = define_autograd(rope_op, backward=_backward, setup_context=_setup_context, kernel=rope_forward)
forbid_double_backward(rope_backward_op, "rope")


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through ``torch.ops.npu_liger.rope``.
    q/k (bsz, heads, seq, head_dim); cos/sin (1 or bsz, seq, rotary_dim) or (seq, rotary_dim).
    Eager calls skip the dispatcher (``define_autograd``'s eager bypass)."""
    return _rope_entry(q, k, cos, sin)
