from __future__ import annotations

import torch
from torch import nn

from ..npu_ops.kl_div import check_kl_div_options
from ..registrations.kl_div import kl_div

__all__ = ["KLDivLoss"]


class KLDivLoss(nn.KLDivLoss):
    """``torch.nn.KLDivLoss`` on the ``kl_div`` op, with Liger-Kernel's ``LigerKLDIVLoss`` constructor: ``eps`` first,
    then torch's arguments (``reduction`` defaults to torch's ``"mean"``; ``"batchmean"`` is the KL divergence).
    Inputs are (BT, V): y_pred log-probabilities, y_true probabilities (log-probabilities with ``log_target``)."""

    def __init__(self, eps: float = 1e-10, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_kl_div_options(self.reduction, self.log_target, eps)
        self.eps = eps

    def forward(self, y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.Tensor:
        return kl_div(y_pred, y_true, self.reduction, self.log_target, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, reduction={self.reduction!r}, log_target={self.log_target}"
