from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..npu_ops.tvd import REDUCTIONS
from ..registrations.tvd import tvd

__all__ = ["TVDLoss"]


class TVDLoss(nn.Module):
    """Total variation distance between two (BT, V) distributions, ``0.5 * |p - q|`` reduced as ``reduction``
    says (``"none"``, ``"sum"``, ``"mean"``, ``"batchmean"``); rows whose ``shift_labels`` entry equals
    ``ignore_index`` count for nothing."""

    def __init__(self, reduction: str = "batchmean", ignore_index: int = -100):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return tvd(p, q, shift_labels, self.reduction, self.ignore_index)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"
