from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..npu_ops.grpo_loss import check_grpo_options
from ..registrations.grpo_loss import grpo_loss

__all__ = ["GRPOLoss"]


class GRPOLoss(nn.Module):
    """TRL's GRPO policy loss from logits (the ``grpo_loss`` op). The constructor takes the arguments of
    Liger-Kernel's ``LigerFusedLinearGRPOLoss`` that apply to a loss over logits, by the same names and defaults
    (``beta``, ``epsilon_low``, ``epsilon_high``, ``loss_type``, ``max_completion_length``, ``temperature``; only
    ``importance_sampling_level="token"``). ``forward`` returns ``(loss, per_token_kl, is_clipped, clip_ratio)``."""

    def __init__(self, beta: float = 0.04, epsilon_low: float = 0.2, epsilon_high: float = 0.2,
                 loss_type: str = "dapo", max_completion_length: Optional[int] = None,
                 importance_sampling_level: str = "token", temperature: float = 1.0):
        super().__init__()
        if importance_sampling_level != "token":
            raise NotImplementedError(f"importance_sampling_level={importance_sampling_level!r}: only 'token' is "
                                      "supported")
        check_grpo_options(temperature, beta, epsilon_low, epsilon_high, loss_type, max_completion_length)
        self.beta, self.epsilon_low, self.epsilon_high = beta, epsilon_low, epsilon_high
        self.loss_type, self.max_completion_length, self.temperature = loss_type, max_completion_length, temperature

    def forward(self, logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor,
                completion_mask: Optional[torch.Tensor] = None, old_logp: Optional[torch.Tensor] = None,
                ref_logp: Optional[torch.Tensor] = None,
                num_items_in_batch: Union[torch.Tensor, int, float, None] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return grpo_loss(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, self.temperature,
                         self.beta, self.epsilon_low, self.epsilon_high, self.loss_type, self.max_completion_length,
                         num_items_in_batch)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, epsilon_low={self.epsilon_low}, epsilon_high={self.epsilon_high}, "
                f"loss_type={self.loss_type!r}, temperature={self.temperature}")
