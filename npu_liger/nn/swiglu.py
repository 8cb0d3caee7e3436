from __future__ import annotations

import torch
from torch import nn

from ..registrations.swiglu import swiglu

__all__ = ["SwiGLUMLP"]


class SwiGLUMLP(nn.Module):
    """The gated MLP of Llama-style models (HF ``LlamaMLP`` with ``hidden_act="silu"``):
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``, the gate product fused into one kernel."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
