"""Gated MLPs, ``down_proj(gate(gate_proj(x), up_proj(x)))``, and the down projection that recomputes the gate
product instead of keeping it.

``down_proj(c)`` with ``c = gate(a, b)`` keeps ``c`` for its weight gradient: an (tokens, intermediate_size)
tensor per layer, on top of ``a`` and ``b``, which the gate's own backward keeps anyway. ``gated_down_proj``
keeps only ``a`` and ``b`` and recomputes ``c`` in the backward pass (one elementwise kernel, a few tens of
microseconds per layer). Per decoder layer of the training-step benchmark (4x2048 tokens, intermediate 8192,
bf16) that is 128 MiB less activation memory. The gradients are the same computations as autograd's (the same
matmuls in the same dtype).

It applies to plain eager training (``eager_call_allowed``: no tracing, no tensor subclass such as DTensor, no
dispatch mode), with a plain ``nn.Linear`` without hooks, no autocast, and one dtype throughout. Everything else,
torch.compile included (whose partitioner makes its own recomputation choices), runs ``down_proj(gate(a, b))``.
``NPU_LIGER_MLP_RECOMPUTE=0`` in the environment turns the recomputation off.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as module_globals  # the global module hooks

from ..registrations._op import call_op, eager_call_allowed
from ..registrations.geglu import geglu, geglu_backward_op
from ..registrations.swiglu import swiglu, swiglu_backward_op

# gate name -> (the public function, the backward op)
GATES = {"swiglu": (swiglu, swiglu_backward_op), "geglu": (geglu, geglu_backward_op)}


def recompute_enabled() -> bool:
    return os.environ.get("NPU_LIGER_MLP_RECOMPUTE", "1") != "0"


class _RecomputedGateLinear(torch.autograd.Function):
    """``F.linear(gate(a, b), weight, bias)`` saving a, b and weight, not the gate product."""

    @staticmethod
    def forward(ctx, a, b, weight, bias, gate_name):
        ctx.gate_name = gate_name
        ctx.save_for_backward(a, b, weight)
        return F.linear(GATES[gate_name][0](a, b), weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        a, b, weight = ctx.saved_tensors
        gate, gate_backward = GATES[ctx.gate_name]
        need_a, need_b, need_weight, need_bias, _ = ctx.needs_input_grad
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])
        grad_a = grad_b = grad_weight = grad_bias = None
        if need_weight:  # the product, recomputed here instead of kept since the forward
            grad_weight = grad_rows.t().mm(gate(a, b).reshape(-1, a.shape[-1]))
        if need_bias:
            grad_bias = grad_rows.sum(0)
        if need_a or need_b:
            grad_a, grad_b = call_op(gate_backward, grad_out.matmul(weight), a, b)
        return grad_a, grad_b, grad_weight, grad_bias, None


def plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` (not a subclass: LoRA, quantised layers) whose forward nothing observes or replaces: calling
    it is exactly ``F.linear(x, weight, bias)``, so code may compute that from its parameters instead (the
    recomputed down projection here, the loss patch's fused lm_head)."""
    return (type(module) is nn.Linear and "forward" not in module.__dict__
            and not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                     or module._backward_pre_hooks)
            and not (module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks
                     or module_globals._global_backward_hooks or module_globals._global_backward_pre_hooks))


def gated_down_proj(gate_name: str, a: torch.Tensor, b: torch.Tensor, down_proj: nn.Module) -> torch.Tensor:
    """``down_proj(gate(a, b))`` for ``gate_name`` in ``GATES``, recomputing the gate product in backward where
    that is safe (module docstring); the same result and gradients either way."""
    gate = GATES[gate_name][0]
    if recompute_enabled() and torch.is_grad_enabled() and plain_linear(down_proj):
        weight, bias = down_proj.weight, down_proj.bias
        # eager_call_allowed first: it turns away meta tensors, a device type autocast does not know
        if (eager_call_allowed(a, b, weight, bias) and a.dtype == b.dtype == weight.dtype
                and (bias is None or bias.dtype == weight.dtype) and not torch.is_autocast_enabled(a.device.type)
                and (a.requires_grad or b.requires_grad or weight.requires_grad)):
            return _RecomputedGateLinear.apply(a, b, weight, bias, gate_name)
    return down_proj(gate(a, b))


class GatedMLP(nn.Module):
    """``down_proj(gate(gate_proj(x), up_proj(x)))`` with the gate product fused into one npu_liger kernel and
    recomputed in backward rather than kept (``gated_down_proj``). Parameter names match Hugging Face's gated
    MLPs, so their state dicts load unchanged."""

    gate_name: str  # a key of GATES, set by each subclass
    gate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # its public function

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_down_proj(self.gate_name, self.gate_proj(x), self.up_proj(x), self.down_proj)
