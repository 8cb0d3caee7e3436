"""Preference losses as ``nn.Module``s with Liger-Kernel's ``liger_kernel.chunked_loss`` constructor arguments and
forward signatures, so TRL code switches by changing an import. Each returns ``(loss, metrics)`` like Liger's:
``metrics`` is the tuple of the op's other outputs (chosen and rejected log-probabilities, their logits' means,
the NLL, the rewards, and ORPO's log-odds; KTO's sums). The modules hold no parameters.

Arguments accepted for compatibility and not used: ``chunk_size`` (the chunking follows our memory policy, see
docs/DESIGN.md) and ``compiled`` (nothing is compiled inside; the ops are torch.library custom ops and may be
compiled from outside).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..registrations.fused_linear_cpo import fused_linear_cpo
from ..registrations.fused_linear_dpo import fused_linear_dpo
from ..registrations.fused_linear_kto import fused_linear_kto
from ..registrations.fused_linear_orpo import fused_linear_orpo
from ..registrations.fused_linear_simpo import fused_linear_simpo

__all__ = ["FusedLinearCPOLoss", "FusedLinearDPOLoss", "FusedLinearKTOLoss", "FusedLinearORPOLoss",
           "FusedLinearSimPOLoss"]


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")


def _check_chunk_size(chunk_size) -> None:
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (accepted and ignored), got {chunk_size!r}")


def _keep(module: nn.Module, **options) -> None:
    """The constructor's options as attributes of the same names (what forward and repr read)."""
    for name, value in options.items():
        setattr(module, name, value)


def _split(outputs) -> tuple:
    return outputs[0], tuple(outputs[1:])


class FusedLinearDPOLoss(nn.Module):
    """DPO's sigmoid loss fused with the last linear layer (the ``fused_linear_dpo`` op), with Liger-Kernel's
    ``LigerFusedLinearDPOLoss`` arguments and ``forward(lin_weight, _input, target, bias, ref_input, ref_weight,
    ref_bias)``; ``_input`` holds the chosen sequences first, then the rejected. Only ``loss_type="sigmoid"`` is
    computed (label smoothing gives cDPO); the other Liger variants raise ValueError. ``use_ref_model=False``
    ignores the reference inputs (the log-ratios are to 0, as Liger's). Returns ``(loss, (chosen_logps,
    rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards, rejected_rewards))``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
                 compute_nll_loss: bool = False, compiled: bool = True, use_ref_model: bool = True,
                 average_log_prob: bool = False, chunk_size: int = 1, loss_type: str = "sigmoid",
                 label_smoothing: float = 0.0, discopop_tau: float = 0.05):
        super().__init__()
        if loss_type != "sigmoid":
            raise ValueError(f"loss_type {loss_type!r} is not supported: FusedLinearDPOLoss computes only "
                             "loss_type='sigmoid' (with label_smoothing: cDPO)")
        _check_flags(compute_nll_loss=compute_nll_loss, compiled=compiled, use_ref_model=use_ref_model,
                     average_log_prob=average_log_prob)
        _check_chunk_size(chunk_size)
        _keep(self, ignore_index=ignore_index, beta=beta, alpha=alpha, compute_nll_loss=compute_nll_loss,
              compiled=compiled, use_ref_model=use_ref_model, average_log_prob=average_log_prob, chunk_size=chunk_size,
              loss_type=loss_type, label_smoothing=label_smoothing, discopop_tau=discopop_tau)

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None):
        if self.use_ref_model and (ref_input is None) != (ref_weight is None):
            raise ValueError("use_ref_model=True needs both ref_input and ref_weight (or neither)")
        if not self.use_ref_model:
            ref_input = ref_weight = ref_bias = None
        return _split(fused_linear_dpo(_input, lin_weight, target, bias, ref_input, ref_weight, ref_bias, None, None,
                                       self.ignore_index, self.beta, self.label_smoothing, self.compute_nll_loss,
                                       self.alpha, self.average_log_prob))

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, alpha={self.alpha}, label_smoothing={self.label_smoothing}, "
                f"compute_nll_loss={self.compute_nll_loss}, use_ref_model={self.use_ref_model}, "
                f"average_log_prob={self.average_log_prob}, ignore_index={self.ignore_index}")


class FusedLinearORPOLoss(nn.Module):
    """ORPO's loss fused with the last linear layer (the ``fused_linear_orpo`` op), with Liger-Kernel's
    ``LigerFusedLinearORPOLoss`` arguments and ``forward(lin_weight, _input, target, bias, nll_target)``.
    ``nll_target`` (a separate target for the NLL term) is not supported: give None. Returns ``(loss,
    (chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards, log_odds_ratio, log_odds_chosen))``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compute_nll_loss: bool = True,
                 compiled: bool = True, chunk_size: int = 1):
        super().__init__()
        _check_flags(compute_nll_loss=compute_nll_loss, compiled=compiled)
        _check_chunk_size(chunk_size)
        _keep(self, ignore_index=ignore_index, beta=beta, compute_nll_loss=compute_nll_loss, compiled=compiled,
              chunk_size=chunk_size)

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None, nll_target: Optional[torch.Tensor] = None):
        if nll_target is not None:
            raise ValueError("nll_target is not supported by FusedLinearORPOLoss: the NLL uses target")
        return _split(fused_linear_orpo(_input, lin_weight, target, bias, self.ignore_index, self.beta,
                                        self.compute_nll_loss))

    def extra_repr(self) -> str:
        return f"beta={self.beta}, compute_nll_loss={self.compute_nll_loss}, ignore_index={self.ignore_index}"


class FusedLinearSimPOLoss(nn.Module):
    """SimPO's loss fused with the last linear layer (the ``fused_linear_simpo`` op), with Liger-Kernel's
    ``LigerFusedLinearSimPOLoss`` arguments and ``forward(lin_weight, _input, target, bias)``. Returns ``(loss,
    (chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards))``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
                 label_smoothing: float = 0.0, compute_nll_loss: bool = True, compiled: bool = True,
                 gamma: float = 0.5, chunk_size: int = 1):
        super().__init__()
        _check_flags(compute_nll_loss=compute_nll_loss, compiled=compiled)
        _check_chunk_size(chunk_size)
        _keep(self, ignore_index=ignore_index, beta=beta, alpha=alpha, label_smoothing=label_smoothing,
              compute_nll_loss=compute_nll_loss, compiled=compiled, gamma=gamma, chunk_size=chunk_size)

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None):
        return _split(fused_linear_simpo(_input, lin_weight, target, bias, self.ignore_index, self.beta, self.alpha,
                                         self.label_smoothing, self.compute_nll_loss, self.gamma))

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, alpha={self.alpha}, gamma={self.gamma}, label_smoothing={self.label_smoothing}, "
                f"compute_nll_loss={self.compute_nll_loss}, ignore_index={self.ignore_index}")


class FusedLinearCPOLoss(nn.Module):
    """CPO's loss fused with the last linear layer (the ``fused_linear_cpo`` op), with Liger-Kernel's
    ``LigerFusedLinearCPOLoss`` arguments and ``forward(lin_weight, _input, target, bias)``. Returns ``(loss,
    (chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
    rejected_rewards))``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
                 label_smoothing: float = 0.0, compute_nll_loss: bool = True, compiled: bool = True,
                 average_log_prob: bool = False, chunk_size: int = 1):
        super().__init__()
        _check_flags(compute_nll_loss=compute_nll_loss, compiled=compiled, average_log_prob=average_log_prob)
        _check_chunk_size(chunk_size)
        _keep(self, ignore_index=ignore_index, beta=beta, alpha=alpha, label_smoothing=label_smoothing,
              compute_nll_loss=compute_nll_loss, compiled=compiled, average_log_prob=average_log_prob,
              chunk_size=chunk_size)

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None):
        return _split(fused_linear_cpo(_input, lin_weight, target, bias, self.ignore_index, self.beta, self.alpha,
                                       self.label_smoothing, self.compute_nll_loss, self.average_log_prob))

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, alpha={self.alpha}, label_smoothing={self.label_smoothing}, "
                f"compute_nll_loss={self.compute_nll_loss}, average_log_prob={self.average_log_prob}, "
                f"ignore_index={self.ignore_index}")


class FusedLinearKTOLoss(nn.Module):
    """KTO's loss fused with the last linear layer (the ``fused_linear_kto`` op), with Liger-Kernel's
    ``LigerFusedLinearKTOLoss`` arguments and ``forward(_input, lin_weight, target, bias, preference_labels,
    ref_input, ref_weight, ref_bias, kl)`` (the input first here, as Liger's). ``use_ref_model=False`` ignores the
    reference inputs. Returns ``(loss, (chosen_logps_sum, rejected_logps_sum, chosen_logits_sum,
    rejected_logits_sum, chosen_rewards_sum, rejected_rewards_sum))``."""

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compiled: bool = True,
                 use_ref_model: bool = False, average_log_prob: bool = False, chunk_size: int = 1):
        super().__init__()
        _check_flags(compiled=compiled, use_ref_model=use_ref_model, average_log_prob=average_log_prob)
        _check_chunk_size(chunk_size)
        _keep(self, ignore_index=ignore_index, beta=beta, compiled=compiled, use_ref_model=use_ref_model,
              average_log_prob=average_log_prob, chunk_size=chunk_size)

    def forward(self, _input: torch.Tensor, lin_weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None, preference_labels: Optional[torch.Tensor] = None,
                ref_input: Optional[torch.Tensor] = None, ref_weight: Optional[torch.Tensor] = None,
                ref_bias: Optional[torch.Tensor] = None, kl: Optional[torch.Tensor] = None):
        if preference_labels is None:
            raise ValueError("preference_labels (N,) bool is required: True marks a desirable sequence")
        if self.use_ref_model and (ref_input is None) != (ref_weight is None):
            raise ValueError("use_ref_model=True needs both ref_input and ref_weight (or neither)")
        if not self.use_ref_model:
            ref_input = ref_weight = ref_bias = None
        return _split(fused_linear_kto(_input, lin_weight, target, preference_labels, bias, ref_input, ref_weight,
                                       ref_bias, None, kl, self.ignore_index, self.beta, self.average_log_prob))

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, use_ref_model={self.use_ref_model}, average_log_prob={self.average_log_prob}, "
                f"ignore_index={self.ignore_index}")
