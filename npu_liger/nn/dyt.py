"""``DyT``: Dynamic Tanh (``npu_liger.dyt``) with Liger-Kernel's ``LigerDyT`` constructor and parameter names."""

from __future__ import annotations

import torch
from torch import nn

from ..registrations.dyt import dyt

__all__ = ["DyT"]


class DyT(nn.Module):
    """``gamma * tanh(alpha * x) + beta`` over the last dim (Zhu et al., "Transformers without Normalization"):
    ``DyT(hidden_size, beta=True, init_alpha=0.5)`` as ``LigerDyT``; parameters ``alpha`` (1,), ``gamma`` (ones)
    and ``beta`` (zeros, or None without ``beta``), so LigerDyT's state dicts load unchanged."""

    def __init__(self, hidden_size: int, beta: bool = True, init_alpha: float = 0.5, device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.init_alpha = init_alpha
        self.alpha = nn.Parameter(torch.full((1,), float(init_alpha), **factory))
        self.gamma = nn.Parameter(torch.ones(hidden_size, **factory))
        self.beta = nn.Parameter(torch.zeros(hidden_size, **factory)) if beta else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta is not None}"
