from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..npu_ops._divergence import check_beta
from ..npu_ops.fused_linear_jsd import check_fused_linear_jsd_options
from ..registrations.fused_linear_jsd import fused_linear_jsd
from ..registrations.jsd import jsd

__all__ = ["JSD", "FusedLinearJSD"]


class JSD(nn.Module):
    """Generalised Jensen-Shannon divergence (the ``jsd`` op) with Liger-Kernel's ``LigerJSD`` arguments:
    ``forward(log_q, log_p, shift_labels=None)``, the student's log-probabilities first, the teacher's second."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100):
        super().__init__()
        check_beta("beta", beta)
        self.beta = beta
        self.ignore_index = ignore_index

    def forward(self, log_q: torch.Tensor, log_p: torch.Tensor,
                shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return jsd(log_q, log_p, shift_labels, self.beta, self.ignore_index)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class FusedLinearJSD(nn.Module):
    """The last linear layer of a student and a teacher fused with the JSD (the ``fused_linear_jsd`` op), with
    Liger-Kernel's ``LigerFusedLinearJSD`` arguments. ``accum_dtype`` is accepted for compatibility and not used:
    grad_weight accumulates chunk by chunk in the weight's dtype (each chunk's matmul sums in fp32)."""

    def __init__(self, jsd_beta: float = 0.5, ignore_index: int = -100, temperature: float = 1.0,
                 accum_dtype: Optional[torch.dtype] = None):
        super().__init__()
        check_fused_linear_jsd_options(jsd_beta, temperature)
        self.jsd_beta = jsd_beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.accum_dtype = accum_dtype

    def forward(self, student_input: torch.Tensor, student_weight: torch.Tensor, teacher_input: torch.Tensor,
                teacher_weight: torch.Tensor, shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                self.jsd_beta, self.ignore_index, self.temperature)

    def extra_repr(self) -> str:
        return f"jsd_beta={self.jsd_beta}, ignore_index={self.ignore_index}, temperature={self.temperature}"
