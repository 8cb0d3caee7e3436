"""The loss modules, with Liger-Kernel's constructor arguments in Liger's order (``LigerCrossEntropyLoss``,
``LigerFusedLinearCrossEntropyLoss``), so code switches by changing an import. docs/SWITCHING.md lists what each
option does here."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..npu_ops._loss import LossOptions, check_loss_options
from ..registrations.cross_entropy import cross_entropy
from ..registrations.fused_linear_cross_entropy import fused_linear_cross_entropy

__all__ = ["CrossEntropyLoss", "FusedLinearCrossEntropyLoss"]


class _LossModule(nn.Module):
    """The options both modules share (checked when the module is built, as Liger asserts them)."""

    def __init__(self, class_weight: Optional[torch.Tensor], ignore_index: int, lse_square_scale: float,
                 label_smoothing: float, reduction: str, softcap: Optional[float], return_z_loss: bool,
                 return_token_accuracy: bool, return_predicted_tokens: bool, use_token_scaling: bool):
        super().__init__()
        self.options = LossOptions(ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
                                   use_token_scaling)
        check_loss_options(self.options)
        self.flags = {"return_z_loss": return_z_loss, "return_token_accuracy": return_token_accuracy,
                      "return_predicted_tokens": return_predicted_tokens}
        self.class_weight = class_weight  # a plain attribute, as Liger keeps it (not a buffer: no state-dict key)

    def extra_repr(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options._asdict().items())
        flags = "".join(f", {k}=True" for k, v in self.flags.items() if v)
        return options + flags + (", with class weights" if self.class_weight is not None else "")


class CrossEntropyLoss(_LossModule):
    """``loss(logits (BT, V), target (BT,))``: ``npu_liger.cross_entropy`` as a module, constructed as Liger's
    ``LigerCrossEntropyLoss(weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
    reduction="mean", softcap=None, return_z_loss=False, return_token_accuracy=False,
    return_predicted_tokens=False)``. Returns the loss (in logits' dtype), or a ``CrossEntropyOutput`` when a
    ``return_*`` flag is set."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100, lse_square_scale: float = 0.0,
                 label_smoothing: float = 0.0, reduction: str = "mean", softcap: Optional[float] = None,
                 return_z_loss: bool = False, return_token_accuracy: bool = False,
                 return_predicted_tokens: bool = False, use_token_scaling: bool = False):
        super().__init__(weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
                         return_token_accuracy, return_predicted_tokens, use_token_scaling)

    @property
    def weight(self) -> Optional[torch.Tensor]:
        return self.class_weight

    def forward(self, logits: torch.Tensor, target: torch.Tensor):
        return cross_entropy(logits, target, self.class_weight, *self.options, **self.flags)


class FusedLinearCrossEntropyLoss(_LossModule):
    """``loss(lin_weight (V, H), x (BT, H), target (BT,), bias=None)``, Liger's argument order (the lm_head weight
    first): ``npu_liger.fused_linear_cross_entropy`` as a module, without materialising the logits, constructed as
    Liger's ``LigerFusedLinearCrossEntropyLoss(ce_weight=None, ignore_index=-100, lse_square_scale=0.0,
    label_smoothing=0.0, reduction="mean", softcap=None, return_z_loss=False, accum_dtype=None,
    use_token_scaling=False, return_token_accuracy=False, return_predicted_tokens=False)``. Returns the fp32 loss,
    or a ``CrossEntropyOutput`` when a ``return_*`` flag is set."""

    def __init__(self, ce_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 lse_square_scale: float = 0.0, label_smoothing: float = 0.0, reduction: str = "mean",
                 softcap: Optional[float] = None, return_z_loss: bool = False,
                 accum_dtype: Optional[torch.dtype] = None, use_token_scaling: bool = False,
                 return_token_accuracy: bool = False, return_predicted_tokens: bool = False):
        super().__init__(ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap,
                         return_z_loss, return_token_accuracy, return_predicted_tokens, use_token_scaling)
        self.accum_dtype = accum_dtype

    @property
    def ce_weight(self) -> Optional[torch.Tensor]:
        return self.class_weight

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None):
        if isinstance(lin_weight, torch.Tensor) and isinstance(_input, torch.Tensor) and lin_weight.dim() == 2 \
                and _input.dim() == 2 and target.dim() == 1 and lin_weight.shape[0] == target.shape[0] \
                and _input.shape[0] != target.shape[0]:
            raise ValueError(
                f"FusedLinearCrossEntropyLoss takes (lin_weight (V, H), x (BT, H), target (BT,)): the first argument "
                f"has {lin_weight.shape[0]} rows like target ({target.shape[0]}), so x and lin_weight look swapped")
        return fused_linear_cross_entropy(_input, lin_weight, target, bias, self.class_weight, *self.options,
                                          self.accum_dtype, **self.flags)
