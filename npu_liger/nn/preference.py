"""Preference losses as ``nn.Module``s with Liger-Kernel's ``liger_kernel.chunked_loss`` constructor arguments and
forward signatures, so TRL code switches by changing an import. Each returns ``(loss, metrics)`` like Liger's:
``metrics`` is the tuple of the op's other outputs (chosen and rejected log-probabilities, their logits' means,
the NLL, the rewards, and ORPO's log-odds; KTO's sums; GRPO's KL mean and clip ratio). The modules hold no
parameters.

Arguments accepted for compatibility and not used: ``chunk_size`` (the chunking follows our memory policy, see
docs/DESIGN.md) and ``compiled`` (nothing is compiled inside; the ops are torch.library custom ops and may be
compiled from outside).
"""

from __future__ import annotations

import warnings
from typing import Optional, Union

import torch
from torch import nn

from ..registrations.fused_linear_cpo import fused_linear_cpo
from ..npu_ops.grpo_loss import LOSS_TYPES as _GRPO_LOSS_TYPES
from ..npu_ops.grpo_loss import check_grpo_options
from ..registrations.fused_linear_dpo import fused_linear_dpo
from ..registrations.fused_linear_grpo import fused_linear_grpo
from ..registrations.fused_linear_kto import fused_linear_kto
from ..registrations.fused_linear_orpo import fused_linear_orpo
from ..registrations.fused_linear_simpo import fused_linear_simpo

__all__ = ["FusedLinearCPOLoss", "FusedLinearDPOLoss", "FusedLinearGRPOLoss", "FusedLinearKTOLoss",
           "FusedLinearORPOLoss", "FusedLinearSimPOLoss"]


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


def _dapo_normalizer(attention_mask: torch.Tensor, num_items_in_batch) -> Optional[torch.Tensor]:
    """Liger's ``_compute_dapo_normalizer`` where it differs from the op's (the batch's own token count): the
    global count ``num_items_in_batch / world_size``, or, under torch.distributed without it, the token count summed
    over the processes over world_size; None where the op's count is Liger's (one process, no num_items_in_batch)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_items_in_batch is None and not distributed:
        return None
    world_size = torch.distributed.get_world_size() if distributed else 1
    if num_items_in_batch is not None:
        normalizer = torch.as_tensor(num_items_in_batch, dtype=torch.float32).to(attention_mask.device)
    else:
        normalizer = (attention_mask != 0).sum().to(torch.float32)
        torch.distributed.all_reduce(normalizer, op=torch.distributed.ReduceOp.SUM)
    return (normalizer / world_size).clamp_min(1.0)


class FusedLinearGRPOLoss(nn.Module):
    """GRPO's per-token clipped policy loss with a k3 KL penalty, fused with the last linear layer (the
    ``fused_linear_grpo`` op), with Liger-Kernel's ``LigerFusedLinearGRPOLoss`` arguments and ``forward(_input,
    lin_weight, selected_token_ids, attention_mask, advantages, bias, ref_per_token_logps, old_per_token_logps,
    ref_input, ref_weight, ref_bias, vllm_is_ratio, num_items_in_batch)`` (the input first, as Liger's; _input
    (B, T, H), attention_mask read as 0/1: nonzero is a completion token). Computed: ``loss_type`` "grpo", "bnpo",
    "dr_grpo" (max_completion_length required, as Liger's) and "dapo" (its normaliser Liger's: num_items_in_batch /
    world_size, or the token count over the processes, applied as a factor on the op's loss), token-level
    importance sampling, ``temperature``. Raise ValueError: the other loss types ("cispo", "sapo", "luspo",
    "vespo"), ``importance_sampling_level="sequence"``, ``delta``, ``use_bias_correction_kl=True`` with beta != 0,
    a ``vllm_is_ratio``. ``sapo_temperature_*`` (validated as Liger's) and ``vespo_*`` only serve those loss types:
    kept, unused. ``use_ref_model=False`` ignores the reference inputs (the KL is 0, as Liger's); with it, the
    reference is ref_per_token_logps, else ref_input / ref_weight / ref_bias. Returns ``(loss, (kl_mean,
    clip_ratio))``, or ``(loss, (clip_ratio,))`` when beta == 0, as Liger's."""

    def __init__(self, beta: float = 0.04, compiled: bool = True, use_ref_model: bool = True, chunk_size: int = 1,
                 epsilon_low: float = 0.2, epsilon_high: float = 0.2, loss_type: str = "dapo",
                 max_completion_length: Optional[int] = None, importance_sampling_level: str = "token",
                 sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05, temperature: float = 1.0,
                 delta: Optional[float] = None, use_bias_correction_kl: bool = False, vespo_k_pos: float = 2.0,
                 vespo_lambda_pos: float = 3.0, vespo_k_neg: float = 3.0, vespo_lambda_neg: float = 2.0):
        super().__init__()
        if loss_type not in _GRPO_LOSS_TYPES:
            raise ValueError(f"loss_type {loss_type!r} is not supported: FusedLinearGRPOLoss computes only "
                             f"loss_type in {_GRPO_LOSS_TYPES} (not Liger's 'cispo', 'sapo', 'luspo', 'vespo')")
        if importance_sampling_level != "token":
            raise ValueError(f"importance_sampling_level {importance_sampling_level!r} is not supported: "
                             "FusedLinearGRPOLoss computes only importance_sampling_level='token' (no GSPO)")
        if delta is not None:
            raise ValueError(f"delta={delta!r} is not supported: FusedLinearGRPOLoss computes only delta=None "
                             "(no two-sided clipping)")
        _check_flags(compiled=compiled, use_ref_model=use_ref_model, use_bias_correction_kl=use_bias_correction_kl)
        if use_bias_correction_kl and beta != 0.0:
            raise ValueError("use_bias_correction_kl=True is not supported: FusedLinearGRPOLoss computes only "
                             "use_bias_correction_kl=False (the KL term is not importance-weighted)")
        if loss_type == "dr_grpo" and max_completion_length is None:
            raise ValueError("max_completion_length must be provided for loss_type 'dr_grpo'")
        if sapo_temperature_pos <= 0:
            raise ValueError(f"sapo_temperature_pos must be positive, got {sapo_temperature_pos}")
        if sapo_temperature_neg <= 0:
            raise ValueError(f"sapo_temperature_neg must be positive, got {sapo_temperature_neg}")
        _check_chunk_size(chunk_size)
        check_grpo_options(temperature, beta, epsilon_low, epsilon_high, loss_type, max_completion_length)
        _keep(self, beta=beta, compiled=compiled, use_ref_model=use_ref_model, chunk_size=chunk_size,
              epsilon_low=epsilon_low, epsilon_high=epsilon_high, loss_type=loss_type,
              max_completion_length=max_completion_length, importance_sampling_level=importance_sampling_level,
              sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg,
              temperature=temperature, delta=delta, use_bias_correction_kl=use_bias_correction_kl,
              vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg,
              vespo_lambda_neg=vespo_lambda_neg)

    def forward(self, _input: torch.Tensor, lin_weight: torch.Tensor, selected_token_ids: torch.Tensor,
                attention_mask: torch.Tensor, advantages: torch.Tensor, bias: Optional[torch.Tensor] = None,
                ref_per_token_logps: Optional[torch.Tensor] = None,
                old_per_token_logps: Optional[torch.Tensor] = None, ref_input: Optional[torch.Tensor] = None,
                ref_weight: Optional[torch.Tensor] = None, ref_bias: Optional[torch.Tensor] = None,
                vllm_is_ratio: Optional[torch.Tensor] = None,
                num_items_in_batch: Union[torch.Tensor, int, float, None] = None):
        if vllm_is_ratio is not None:
            raise ValueError("vllm_is_ratio is not supported by FusedLinearGRPOLoss: give None (no vLLM "
                             "importance-sampling correction)")
        if self.use_ref_model:
            if ref_per_token_logps is None and ref_input is None:
                raise ValueError("use_ref_model=True needs ref_per_token_logps or ref_input (with ref_weight)")
            if ref_per_token_logps is not None and ref_input is not None:
                warnings.warn("Both ref_per_token_logps and ref_input are provided. Using ref_per_token_logps.",
                              stacklevel=2)
                ref_input = ref_weight = ref_bias = None
            if ref_input is not None and ref_weight is None:
                raise ValueError("use_ref_model=True with ref_input needs ref_weight")
        else:
            ref_per_token_logps = ref_input = ref_weight = ref_bias = None
        beta = self.beta if self.use_ref_model else 0.0  # without a reference Liger's KL is 0 (ref = logp)
        loss, kl_mean, clip_ratio = fused_linear_grpo(
            _input, lin_weight, selected_token_ids, attention_mask, advantages, bias, ref_input, ref_weight,
            ref_bias, ref_per_token_logps, old_per_token_logps, beta, self.epsilon_low, self.epsilon_high,
            self.temperature, self.loss_type, self.max_completion_length)
        if self.loss_type == "dapo":
            normalizer = _dapo_normalizer(attention_mask, num_items_in_batch)
            if normalizer is not None:  # the op divides by the batch's own count: rescale to Liger's
                loss = loss * ((attention_mask != 0).sum().clamp_min(1).to(torch.float32) / normalizer)
        return loss, ((kl_mean, clip_ratio) if self.beta != 0.0 else (clip_ratio,))

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, epsilon_low={self.epsilon_low}, epsilon_high={self.epsilon_high}, "
                f"loss_type={self.loss_type!r}, max_completion_length={self.max_completion_length}, "
                f"temperature={self.temperature}, use_ref_model={self.use_ref_model}")
