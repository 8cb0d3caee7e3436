from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class GatedMLP(nn.Module):
    """``down_proj(gate(gate_proj(x), up_proj(x)))`` with the gate product fused into one npu_liger kernel.
    Parameter names match Hugging Face's gated MLPs, so their state dicts load unchanged."""

    gate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # set by each subclass

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate(self.gate_proj(x), self.up_proj(x)))
