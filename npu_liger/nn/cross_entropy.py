from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..npu_ops.cross_entropy import check_loss_options
from ..registrations.cross_entropy import cross_entropy
from ..registrations.fused_linear_cross_entropy import fused_linear_cross_entropy

__all__ = ["CrossEntropyLoss", "FusedLinearCrossEntropyLoss"]


class _LossOptions(nn.Module):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, lse_square_scale: float = 0.0):
        super().__init__()
        check_loss_options(reduction, label_smoothing, softcap, lse_square_scale)
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing
        self.softcap, self.lse_square_scale = softcap, lse_square_scale

    def _options(self) -> tuple:
        return self.ignore_index, self.reduction, self.label_smoothing, self.softcap, self.lse_square_scale

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing="
                f"{self.label_smoothing}, softcap={self.softcap}, lse_square_scale={self.lse_square_scale}")


class CrossEntropyLoss(_LossOptions):
    """``npu_liger.cross_entropy`` as a module: ``loss(logits (BT, V), target (BT,))``; the loss is float32."""

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, target, *self._options())


class FusedLinearCrossEntropyLoss(_LossOptions):
    """``npu_liger.fused_linear_cross_entropy`` as a module: ``loss(weight (V, H), x (BT, H), target (BT,),
    bias=None)`` (Liger's argument order: the lm_head weight first), without materialising the logits."""

    def forward(self, weight: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return fused_linear_cross_entropy(x, weight, target, bias, *self._options())
