"""npu_liger::fused_moe (public: the experts' output) on top of the internal ops npu_liger::fused_moe_with_saved
(the output and the (T*K, 2I) gate/up projections the backward reads) and npu_liger::fused_moe_backward:
schema -> fake -> device kernels -> autograd. ``fused_moe`` is a composite of ``fused_moe_with_saved`` (so that
the autograd formula can keep the projections without the public schema returning them); under torch.compile it
decomposes into that op and, for the backward, ``fused_moe_backward``, both opaque."""

from __future__ import annotations

import torch

from ..npu_ops.fused_moe import check_fused_moe_inputs, fused_moe_backward, fused_moe_forward, recompute_gate_up
from ._op import call_op, define_autograd, define_composite, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["fused_moe"]

_ARGS = "Tensor x, Tensor gate_up_proj, Tensor down_proj, Tensor top_k_index, Tensor top_k_weights"


def _with_saved_fake(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    n_slots = top_k_index.shape[0] * top_k_index.shape[1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty((n_slots, gate_up_proj.shape[1]), dtype=x.dtype, device=x.device))


def _backward_fake(grad_out, x, gate_up_proj, down_proj, top_k_index, top_k_weights, gate_up_out, grad_x,
                   grad_experts):
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)

    def grad_like(t, wanted):
        return torch.empty(t.shape if wanted else (0,), dtype=x.dtype, device=x.device)

    return (grad_like(x, grad_x), grad_like(gate_up_proj, grad_experts), grad_like(down_proj, grad_experts),
            torch.empty(top_k_weights.shape, dtype=top_k_weights.dtype, device=x.device))


# The launchers choose torch._grouped_mm or our kernel from the operands' data pointers (16-byte alignment),
# which a traced graph's tensors do not have.
_OPAQUE = "its grouped-matmul choice reads the operands' data pointers"
with_saved_op = define_op(f"fused_moe_with_saved({_ARGS}) -> (Tensor, Tensor)", kernel=fused_moe_forward,
                          fake=_with_saved_fake, opaque_in_graphs=_OPAQUE)
backward_op = define_op(
    f"fused_moe_backward(Tensor grad_out, {_ARGS}, Tensor gate_up_out, bool grad_x, bool grad_experts) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    kernel=fused_moe_backward, fake=_backward_fake, opaque_in_graphs=_OPAQUE)
forbid_double_backward(backward_op, "fused_moe")


def _setup_context(ctx, inputs, output):
    x, gate_up_proj, down_proj, top_k_index, top_k_weights = inputs
    gate_up_out = output[1]
    ctx.mark_non_differentiable(gate_up_out)
    if recompute_gate_up():  # NPU_LIGER_MOE_RECOMPUTE=1: the backward recomputes the projections
        gate_up_out = gate_up_out.new_empty((0,))
    ctx.save_for_backward(x, gate_up_proj, down_proj, top_k_index, top_k_weights, gate_up_out)


def _backward(ctx, grad_out, _grad_gate_up_out):
    x, gate_up_proj, down_proj, top_k_index, top_k_weights, gate_up_out = ctx.saved_tensors
    need_x, need_gate_up, need_down, _, need_weights = ctx.needs_input_grad
    grad_x, grad_gate_up, grad_down, grad_weights = call_op(
        backward_op, grad_out, x, gate_up_proj, down_proj, top_k_index, top_k_weights, gate_up_out, need_x,
        need_gate_up or need_down)
    return (grad_x if need_x else None, grad_gate_up if need_gate_up else None, grad_down if need_down else None,
            None, grad_weights if need_weights else None)


_with_saved_entry = define_autograd(with_saved_op, backward=_backward, setup_context=_setup_context,
                                    kernel=fused_moe_forward)


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


@sharding_rule(backward_op)
def _fused_moe_backward_sharding(p, *args):
    """grad_x and the routing weights' gradient follow the tokens; both expert gradients are P (each rank sums its
    own tokens)."""
    return [p.case([p.R] * 4), p.case([p.S(0), p.P, p.P, p.S(0)], **_tokens(p, "grad_out", "gate_up_out"))]


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
