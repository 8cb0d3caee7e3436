"""npu_liger::fused_moe (public: the experts' output) on top of the internal ops npu_liger::fused_moe_with_saved
(the output and the (T*K, 2I) gate/up projections the backward reads) and the backward's two steps,
npu_liger::fused_moe_backward_down and npu_liger::fused_moe_backward_gate_up:
schema -> fake -> device kernels -> autograd. ``fused_moe`` is a composite of ``fused_moe_with_saved`` (so that
the autograd formula can keep the projections without the public schema returning them); under torch.compile it
decomposes into that op and, for the backward, the two steps, all opaque."""

from __future__ import annotations

import torch

from ..npu_ops.fused_moe import (check_fused_moe_inputs, fused_moe_backward_down, fused_moe_backward_gate_up,
                                 fused_moe_forward, recompute_gate_up)
from ._op import EagerPath, call_op, define_autograd, define_composite, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["fused_moe"]

_ARGS = "Tensor x, Tensor gate_up_proj, Tensor down_proj, Tensor top_k_index, Tensor top_k_weights"


def _with_saved_fake(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    n_slots = top_k_index.shape[0] * top_k_index.shape[1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty((n_slots, gate_up_proj.shape[1]), dtype=x.dtype, device=x.device))


def _backward_down_fake(grad_out, x, gate_up_proj, down_proj, top_k_index, top_k_weights, gate_up_out,
                        grad_experts):
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    n_slots = top_k_index.shape[0] * top_k_index.shape[1]
    return (torch.empty((n_slots, gate_up_proj.shape[1]), dtype=x.dtype, device=x.device),
            _grad_like(down_proj, grad_experts),
            torch.empty(top_k_weights.shape, dtype=top_k_weights.dtype, device=x.device))


def _backward_gate_up_fake(grad_h, x, gate_up_proj, top_k_index, grad_x, grad_experts):
    return _grad_like(x, grad_x), _grad_like(gate_up_proj, grad_experts)


def _grad_like(t, wanted):
    return torch.empty(t.shape if wanted else (0,), dtype=t.dtype, device=t.device)


# The launchers choose torch._grouped_mm or our kernel from the operands' data pointers (16-byte alignment),
# which a traced graph's tensors do not have.
_OPAQUE = "its grouped-matmul choice reads the operands' data pointers"
with_saved_op = define_op(f"fused_moe_with_saved({_ARGS}) -> (Tensor, Tensor)", kernel=fused_moe_forward,
                          fake=_with_saved_fake, opaque_in_graphs=_OPAQUE)
# The backward's two steps (npu_ops.fused_moe): h, the saved gate/up projections, is read by the first only.
backward_down_op = define_op(
    f"fused_moe_backward_down(Tensor grad_out, {_ARGS}, Tensor gate_up_out, bool grad_experts) "
    "-> (Tensor, Tensor, Tensor)",
    kernel=fused_moe_backward_down, fake=_backward_down_fake, opaque_in_graphs=_OPAQUE)
backward_gate_up_op = define_op(
    "fused_moe_backward_gate_up(Tensor grad_h, Tensor x, Tensor gate_up_proj, Tensor top_k_index, bool grad_x, "
    "bool grad_experts) -> (Tensor, Tensor)",
    kernel=fused_moe_backward_gate_up, fake=_backward_gate_up_fake, opaque_in_graphs=_OPAQUE)
forbid_double_backward(backward_down_op, "fused_moe")
forbid_double_backward(backward_gate_up_op, "fused_moe")


def _backward_steps(needs_input_grad, grad_out, inputs, gate_up_out_box):
    """The formula's backward, both ops. ``gate_up_out_box``: a one-element list holding h, emptied here so that,
    where the caller keeps no other reference (the eager path), h is freed between the two steps."""
    x, gate_up_proj, down_proj, top_k_index, top_k_weights = inputs
    need_x, need_gate_up, need_down, _, need_weights = needs_input_grad
    need_experts = need_gate_up or need_down
    grad_h, grad_down, grad_weights = call_op(backward_down_op, grad_out, x, gate_up_proj, down_proj, top_k_index,
                                              top_k_weights, gate_up_out_box.pop(), need_experts)
    grad_x, grad_gate_up = call_op(backward_gate_up_op, grad_h, x, gate_up_proj, top_k_index, need_x, need_experts)
    return (grad_x if need_x else None, grad_gate_up if need_gate_up else None, grad_down if need_down else None,
            None, grad_weights if need_weights else None)


def _saved_gate_up(gate_up_out):
    """What the backward keeps of h: h, or under NPU_LIGER_MOE_RECOMPUTE=1 an empty tensor (recomputed)."""
    return gate_up_out.new_empty((0,)) if recompute_gate_up() else gate_up_out


def _setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs, _saved_gate_up(output[1]))


def _backward(ctx, grad_out, _grad_gate_up_out):
    *inputs, gate_up_out = ctx.saved_tensors
    return _backward_steps(ctx.needs_input_grad, grad_out, inputs, [gate_up_out])


def _eager_forward(ctx, *inputs):
    """The plain eager path keeps h on ctx rather than in saved_tensors, so that its backward can let it go
    halfway (autograd releases saved tensors only after the whole backward)."""
    out, gate_up_out = fused_moe_forward(*inputs)
    ctx.mark_non_differentiable(gate_up_out)
    ctx.save_for_backward(*inputs)
    ctx.gate_up_out = _saved_gate_up(gate_up_out)
    return out, gate_up_out


def _eager_backward(ctx, grad_out, _grad_gate_up_out):
    inputs = ctx.saved_tensors
    # A second backward over a retained graph finds h gone and recomputes it (an empty tensor asks for that).
    box = [ctx.gate_up_out if ctx.gate_up_out is not None else inputs[0].new_empty((0,))]
    ctx.gate_up_out = None
    return _backward_steps(ctx.needs_input_grad, grad_out, inputs, box)


_with_saved_entry = define_autograd(with_saved_op, backward=_backward, setup_context=_setup_context,
                                    kernel=fused_moe_forward, eager=EagerPath(_eager_forward, _eager_backward))


def _composite(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    return with_saved_op(x, gate_up_proj, down_proj, top_k_index, top_k_weights)[0]


fused_moe_op = define_composite(f"fused_moe({_ARGS}) -> Tensor", _composite)


# DTensor (docs/DISTRIBUTED.md): all R, or tokens S(0) (x, index and weights; the experts R). gate_up_out S(0)
# holds each rank's own slots in its own sorted order, read back only by the backward under the same placement.
# Not listed (DTensor gathers first, exact): tensor parallel on the intermediate dim (a Shard(1) of the
# concatenated [gate; up] rows gives rank 0 the gates and rank 1 the ups, not each rank its gate/up pairs; Shard(2)
# of down_proj would need gate_up_proj as two interleaved halves, which no plain Shard describes) and expert
# parallel Shard(0) on E (the local op would need the indices remapped to its own experts, E for the others,
# which a rule cannot do; transformers' expert-parallel dispatch does that before calling the experts).
_TOKEN_ARGS = ("x", "top_k_index", "top_k_weights")


def _tokens(p, *extra):
    return {name: p.S(0) for name in (*_TOKEN_ARGS, *extra)}


@sharding_rule(fused_moe_op)
def _fused_moe_sharding(p, *args):
    return [p.case(p.R), p.case(p.S(0), **_tokens(p))]


@sharding_rule(with_saved_op)
def _fused_moe_with_saved_sharding(p, *args):
    return [p.case([p.R, p.R]), p.case([p.S(0), p.S(0)], **_tokens(p))]


@sharding_rule(backward_down_op)
def _fused_moe_backward_down_sharding(p, *args):
    """grad_h and the routing weights' gradient follow the tokens (grad_h, like gate_up_out, in each rank's own
    sorted order); the down_proj gradient is P (each rank sums its own tokens)."""
    return [p.case([p.R] * 3), p.case([p.S(0), p.P, p.S(0)], **_tokens(p, "grad_out", "gate_up_out"))]


@sharding_rule(backward_gate_up_op)
def _fused_moe_backward_gate_up_sharding(p, *args):
    return [p.case([p.R] * 2), p.case([p.S(0), p.P], x=p.S(0), top_k_index=p.S(0), grad_h=p.S(0))]


def fused_moe(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, top_k_index: torch.Tensor,
              top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of a MoE block as Hugging Face's ``MixtralExperts.forward`` computes them:
    ``out[t] = sum_k top_k_weights[t, k] * down_proj[e] @ (silu(g) * u)`` with ``[g; u] = gate_up_proj[e] @ x[t]``
    and ``e = top_k_index[t, k]``; an index equal to E (the number of experts) contributes nothing.

    x (T, H); gate_up_proj (E, 2I, H), gate rows first; down_proj (E, H, I); top_k_index (T, K) int32/int64;
    top_k_weights (T, K). Returns (T, H) in x's dtype: ``torch.ops.npu_liger.fused_moe``. Gradients for x, both
    weight tensors and top_k_weights; routing stays on the device (no host synchronisation: fullgraph
    torch.compile and CUDA graphs work). See ``npu_liger.npu_ops.fused_moe`` for what the backward keeps.
    """
    return _with_saved_entry(x, gate_up_proj, down_proj, top_k_index, top_k_weights)[0]
