"""Gated MLPs, ``down_proj(gate(gate_proj(x), up_proj(x)))``, and the down projection that recomputes the gate
product instead of keeping it.

``down_proj(c)`` with ``c = gate(a, b)`` keeps ``c`` for its weight gradient: an (tokens, intermediate_size)
tensor per layer, on top of ``a`` and ``b``, which the gate's own backward keeps anyway. ``gated_down_proj``
keeps only ``a`` and ``b`` and recomputes ``c`` in the backward pass (one elementwise kernel, a few tens of
microseconds per layer). Per decoder layer of the training-step benchmark (4x2048 tokens, intermediate 8192,
bf16) that is 128 MiB less activation memory. The gradients are the same computations as autograd's (the same
matmuls in the same dtype).

It applies to plain eager training (``eager_call_allowed``: no tracing, no tensor subclass such as DTensor, no
dispatch mode), with a plain ``nn.Linear`` without hooks, no autocast, and one dtype throughout. While
torch.compile traces, the same product and linear run inside a non-reentrant ``torch.utils.checkpoint`` region:
AOTAutograd's partitioner keeps the outputs of our opaque gate op rather than recompute them on its own (the
H200 step: 0.9 GiB more compiled than eager, BENCHMARKS round twelve), and a checkpointed region tells it to
recompute. Everything else runs ``down_proj(gate(a, b))``. ``NPU_LIGER_MLP_RECOMPUTE=0`` in the environment
turns the recomputation off.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch
import torch.utils.checkpoint
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


def _gate_linear(gate_name: str, a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor,
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(GATES[gate_name][0](a, b), weight, bias)


def gated_down_proj(gate_name: str, a: torch.Tensor, b: torch.Tensor, down_proj: nn.Module) -> torch.Tensor:
    """``down_proj(gate(a, b))`` for ``gate_name`` in ``GATES``, recomputing the gate product in backward where
    that is safe (module docstring); the same result and gradients either way."""
    gate = GATES[gate_name][0]
    if recompute_enabled() and torch.is_grad_enabled() and plain_linear(down_proj):
        weight, bias = down_proj.weight, down_proj.bias
        if torch.compiler.is_compiling():
            return torch.utils.checkpoint.checkpoint(_gate_linear, gate_name, a, b, weight, bias,
                                                     use_reentrant=False)
        # eager_call_allowed first: it turns away meta tensors, a device type autocast does not know
        if (eager_call_allowed(a, b, weight, bias) and a.dtype == b.dtype == weight.dtype
                and (bias is None or bias.dtype == weight.dtype) and not torch.is_autocast_enabled(a.device.type)
                and (a.requires_grad or b.requires_grad or weight.requires_grad)):
            return _RecomputedGateLinear.apply(a, b, weight, bias, gate_name)
    return down_proj(gate(a, b))


# gate name -> the config activations (``hidden_act`` / ``hidden_activation``) it computes. GEGLU is the tanh
# approximation; "gelu" is accepted as Liger-Kernel accepts it: Gemma's legacy value, which transformers itself
# reads as the tanh approximation (GemmaConfig rewrites it).
CONFIG_ACTIVATIONS = {"swiglu": ("silu", "swish"), "geglu": ("gelu_pytorch_tanh", "gelu")}


def _config_activation(config):
    for name in ("hidden_activation", "hidden_act"):  # Gemma 2/3 name it hidden_activation
        value = getattr(config, name, None)
        if value is not None:
            return name, value
    return None, None


class GatedMLP(nn.Module):
    """``down_proj(gate(gate_proj(x), up_proj(x)))`` with the gate product fused into one npu_liger kernel and
    recomputed in backward rather than kept (``gated_down_proj``). Parameter names match Hugging Face's gated
    MLPs, so their state dicts load unchanged.

    Built from sizes, ``Cls(hidden_size, intermediate_size, bias=False, device=None, dtype=None)``, or from a
    transformers config as Liger-Kernel's ``LigerSwiGLUMLP(config)`` / ``LigerGEGLUMLP(config)`` are:
    ``Cls(config)`` (or ``config=``) reads ``hidden_size``, ``intermediate_size`` (a second argument overrides
    it, as ``LigerQwen3MoeSwiGLUMLP(config, intermediate_size)`` does), ``mlp_bias`` (as Hugging Face's MLPs do;
    absent: no bias) and checks the activation (``hidden_act`` / ``hidden_activation``): one this gate does not
    compute raises ValueError instead of silently computing another."""

    gate_name: str  # a key of GATES, set by each subclass
    gate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # its public function

    def __init__(self, hidden_size=None, intermediate_size: Optional[int] = None, bias: Optional[bool] = None,
                 device=None, dtype=None, *, config=None):
        super().__init__()
        cls = type(self).__name__
        usage = (f"{cls}(hidden_size, intermediate_size, bias=False, device=None, dtype=None) or {cls}(config) "
                 "with a transformers config (hidden_size, intermediate_size, hidden_act)")
        if config is None and hidden_size is not None and not isinstance(hidden_size, int):
            config, hidden_size = hidden_size, None  # Cls(config), Liger-Kernel's form
        if config is not None:
            if hidden_size is not None:
                raise TypeError(f"{usage}: got both a config and hidden_size={hidden_size!r}")
            hidden_size = getattr(config, "hidden_size", None)
            if intermediate_size is None:
                intermediate_size = getattr(config, "intermediate_size", None)
            if bias is None:
                bias = bool(getattr(config, "mlp_bias", False))
            attr, act = _config_activation(config)
            if act is not None and act not in CONFIG_ACTIVATIONS[self.gate_name]:
                raise ValueError(f"{cls} computes {self.gate_name} ({' / '.join(CONFIG_ACTIVATIONS[self.gate_name])}"
                                 f"), but the config's {attr} is {act!r}")
        for name, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"{usage}: {name} must be a non-negative int"
                                f"{' (the config has none)' if config is not None and value is None else ''}, "
                                f"got {value!r}")
        bias = bool(bias) if bias is not None else False
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_down_proj(self.gate_name, self.gate_proj(x), self.up_proj(x), self.down_proj)
