"""npu_liger::rms_norm, npu_liger::fused_add_rms_norm and their backward ops: schema -> fake -> device kernels ->
autograd."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..npu_ops.rms_norm import (check_fused_add_rms_norm_backward_inputs, check_rms_norm_grad,
                                check_rms_norm_inputs, fused_add_rms_norm_backward, fused_add_rms_norm_forward,
                                launch_fused_add_rms_norm_backward, launch_rms_norm_backward, rms_norm_backward,
                                rms_norm_forward, rms_norm_output_dtype, weight_dtype)
from ..npu_ops._triton import new_like
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule


__all__ = ["rms_norm", "fused_add_rms_norm"]


def _new_grad(weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if weight is None else new_like(weight)


def _rms_norm_fake(x, weight=None, eps=1e-6, offset=0.0, casting_mode="llama"):
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode)
    return new_like(x, rms_norm_output_dtype(x.dtype, weight_dtype(weight), casting_mode))


def _rms_norm_backward_fake(grad_out, x, weight, eps, offset, casting_mode):
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode)
    check_rms_norm_grad("grad_out", grad_out, x, weight, casting_mode)
    return new_like(x), _new_grad(weight)


def _fused_add_rms_norm_fake(x, residual, weight=None, eps=1e-6, offset=0.0, casting_mode="llama"):
    check_rms_norm_inputs(x, weight, eps, offset, casting_mode, residual)
    return new_like(x, rms_norm_output_dtype(x.dtype, weight_dtype(weight), casting_mode)), new_like(x)


def _fused_add_rms_norm_backward_fake(grad_normed, grad_sum, s, weight, eps, offset, casting_mode):
    check_fused_add_rms_norm_backward_inputs(grad_normed, grad_sum, s, weight, eps, offset, casting_mode)
    return new_like(s), _new_grad(weight)


# The weight is optional (Tensor?): without one the result is the normalised x, and the backward ops return no
# weight gradient (None).
_ARGS = 'float eps=1e-06, float offset=0.0, str casting_mode="llama"'
rms_norm_op = define_op(f"rms_norm(Tensor x, Tensor? weight, {_ARGS}) -> Tensor", kernel=rms_norm_forward,
                        fake=_rms_norm_fake)
rms_norm_backward_op = define_op(
    "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps, float offset, str casting_mode)"
    " -> (Tensor, Tensor?)",
    kernel=rms_norm_backward, fake=_rms_norm_backward_fake, trusted_kernel=launch_rms_norm_backward)
fused_add_rms_norm_op = define_op(
    f"fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, {_ARGS}) -> (Tensor, Tensor)",
    kernel=fused_add_rms_norm_forward, fake=_fused_add_rms_norm_fake)
fused_add_rms_norm_backward_op = define_op(
    "fused_add_rms_norm_backward(Tensor grad_normed, Tensor? grad_sum, Tensor s, Tensor? weight, float eps,"
    " float offset, str casting_mode) -> (Tensor, Tensor?)",
    kernel=fused_add_rms_norm_backward, fake=_fused_add_rms_norm_backward_fake,
    trusted_kernel=launch_fused_add_rms_norm_backward)


def _grads(p, grad_x, weight):
    """The backward ops' output placements: grad_x's, and the weight gradient's when there is a weight (None)."""
    return [grad_x, None if weight is None else (p.R if grad_x == p.R else p.P)]


# Rows may be sharded, the normalised (last) dim may not: x (and residual) S(d) for d < ndim - 1 with the weight R
# (or absent) -> S(d); all R -> R. Backward: grad and x S(d) -> grad_x S(d), grad_weight P (each rank sums its own
# rows); all R -> R; the incoming gradients P with x R -> P throughout (linear in them). No weight: no
# grad_weight output (its placement None); an absent weight gets None from ``p.case``.
@sharding_rule(rms_norm_op)
def _rms_norm_sharding(p, x, *args):
    return [p.case(p.R)] + [p.case(p.S(d), x=p.S(d)) for d in range(x.ndim - 1)]


@sharding_rule(rms_norm_backward_op)
def _rms_norm_backward_sharding(p, grad_out, x, weight, *args):
    S, P = p.S, p.P
    return ([p.case(_grads(p, p.R, weight)), p.case(_grads(p, P, weight), grad_out=P)]
            + [p.case(_grads(p, S(d), weight), grad_out=S(d), x=S(d)) for d in range(x.ndim - 1)])


@sharding_rule(fused_add_rms_norm_op)
def _fused_add_rms_norm_sharding(p, x, *args):
    S = p.S
    return [p.case([p.R, p.R])] + [p.case([S(d), S(d)], x=S(d), residual=S(d)) for d in range(x.ndim - 1)]


@sharding_rule(fused_add_rms_norm_backward_op)
def _fused_add_rms_norm_backward_sharding(p, grad_normed, grad_sum, s, weight, *args):
    S, P = p.S, p.P
    return ([p.case(_grads(p, p.R, weight)), p.case(_grads(p, P, weight), grad_normed=P, grad_sum=P)]
            + [p.case(_grads(p, S(d), weight), grad_normed=S(d), grad_sum=S(d), s=S(d)) for d in range(s.ndim - 1)])


def _setup_context(ctx, inputs, output):
    x, weight, eps, offset, casting_mode = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (eps, offset, casting_mode)


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    grad_x, grad_w = call_op(rms_norm_backward_op, grad_out, x, weight, *ctx.args)
    return grad_x, grad_w, None, None, None


def _fused_setup_context(ctx, inputs, output):
    _, _, weight, eps, offset, casting_mode = inputs
    ctx.save_for_backward(output[1], weight)  # s: the normalised input, all the backward needs of x and residual
    ctx.args = (eps, offset, casting_mode)


def _fused_backward(ctx, grad_normed, grad_sum):
    s, weight = ctx.saved_tensors
    grad_s, grad_w = call_op(fused_add_rms_norm_backward_op, grad_normed, grad_sum, s, weight, *ctx.args)
    return grad_s, grad_s, grad_w, None, None, None  # s = x + residual: both get grad_s


_rms_norm_entry = define_autograd(rms_norm_op, backward=_backward, setup_context=_setup_context,
                                  kernel=rms_norm_forward)
_fused_add_rms_norm_entry = define_autograd(fused_add_rms_norm_op, backward=_fused_backward,
                                            setup_context=_fused_setup_context, kernel=fused_add_rms_norm_forward)
forbid_double_backward(rms_norm_backward_op, "rms_norm")
forbid_double_backward(fused_add_rms_norm_backward_op, "fused_add_rms_norm")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-6, offset: float = 0.0,
             casting_mode: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dim, ``x * rsqrt(mean(x^2) + eps) * (offset + weight)``:
    ``torch.ops.npu_liger.rms_norm``. ``casting_mode`` reproduces Hugging Face's rounding: ``"llama"``
    (LlamaRMSNorm, Qwen, Mistral, Llama-4; the result has ``promote_types(x, weight)``'s dtype), ``"gemma"``
    (GemmaRMSNorm with ``offset=1.0``; x's dtype), ``"none"`` (rstd taken in x's dtype, x's dtype result).
    ``weight=None`` (a norm without elementwise affine): ``x * rsqrt(mean(x^2) + eps)`` in x's dtype, ``offset``
    unused. Rows wider than one tile are walked in chunks; grads for x and weight (the incoming gradient is never
    written)."""
    return _rms_norm_entry(x, weight, eps, offset, casting_mode)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-6,
                       offset: float = 0.0, casting_mode: str = "llama") -> Tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (in x's dtype) and ``(rms_norm(s, weight, ...), s)`` in one kernel, as a decoder
    layer's ``residual + hidden`` followed by its norm: ``torch.ops.npu_liger.fused_add_rms_norm``. ``weight``
    may be None, as for ``rms_norm``."""
    return _fused_add_rms_norm_entry(x, residual, weight, eps, offset, casting_mode)
