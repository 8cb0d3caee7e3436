"""``PolyNorm`` (``npu_liger.poly_norm``) with Liger-Kernel's ``LigerPolyNorm`` constructor and parameters."""

from __future__ import annotations

import torch
from torch import nn

from ..registrations.poly_norm import poly_norm

__all__ = ["PolyNorm"]


class PolyNorm(nn.Module):
    """``w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` over the last dim, ``norm(u) = u / sqrt(mean(u^2) +
    eps)``: ``PolyNorm(eps=1e-6, in_place=True)`` as ``LigerPolyNorm``, weight (1/3, 1/3, 1/3) and a 0-d bias 1.0
    (PolyCom's initialisation), so LigerPolyNorm's state dicts load unchanged. ``in_place`` is accepted for
    compatibility and changes nothing: npu_liger never writes into the incoming gradient."""

    def __init__(self, eps: float = 1e-6, in_place: bool = True, device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0, **factory))
        self.bias = nn.Parameter(torch.full((), 1.0, **factory))
        self.variance_epsilon = float(eps)
        self.in_place = in_place

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return poly_norm(hidden_states, self.weight, self.bias, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"weight_shape={tuple(self.weight.shape)}, eps={self.variance_epsilon}"
