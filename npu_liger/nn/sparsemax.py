from __future__ import annotations

import torch
from torch import nn

from ..registrations.sparsemax import sparsemax

__all__ = ["Sparsemax"]


class Sparsemax(nn.Module):
    """Sparsemax along ``dim`` through ``npu_liger.sparsemax``: the projection of each slice onto the probability
    simplex (Liger-Kernel's ``LigerSparsemax(dim=-1)`` constructor)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {type(dim).__name__}")
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
