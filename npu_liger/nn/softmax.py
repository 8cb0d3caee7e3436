from __future__ import annotations

import torch
from torch import nn

from ..registrations.softmax import softmax

__all__ = ["Softmax"]


class Softmax(nn.Module):
    """``torch.softmax(x, -1)`` through ``npu_liger.softmax`` (fp32 math, the result in x's dtype). Over the last
    dim only, with Liger-Kernel's ``LigerSoftmax`` constructor (no arguments)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x)
