"""Cross entropy over (BT, V) logit rows: ``F.cross_entropy`` (class weights, label smoothing) with Gemma-2's
softcap, the z-loss, Liger's token scaling and its logged statistics, loss and gradient in one launch of the row
kernel (``_cross_entropy_rows.py``, whose docstring has the math and the memory analysis).

``mean`` divides by the valid rows' summed class weights (their count without weights), computed on the device
(no host synchronisation); no valid row gives 0 and zero gradients. The loss is in the logits' dtype, as
``F.cross_entropy`` returns it (computed in fp32); the gradient is in the logits' dtype.

Out-of-range targets (not ignore_index, outside [0, V)): the kernel never reads outside the row and writes a NaN
loss for that row; besides, the launcher raises ``ValueError`` on CPU (a host check, no cost there) and queues
``torch._assert_async`` on CUDA (a device-side assert, as ``F.cross_entropy`` does; no host synchronisation).
Other devices rely on the NaN loss.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._cross_entropy_rows import launch_rows
from ._loss import (LossOptions, check_loss_options, check_targets, empty_stats, loss_stats, reduce_rows,
                    target_scale)
from ._triton import check_float_tensor, new_like


def check_cross_entropy_inputs(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
                               options: LossOptions) -> None:
    check_float_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (BT, V), got shape {tuple(logits.shape)}")
    check_targets(target, logits.shape[0], weight, logits.shape[1], "logits", logits)
    check_loss_options(options)


def class_weight_sum(weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """W = sum of the class weights, a 0-d fp32 device tensor (no sync), which label smoothing needs."""
    return None if weight is None else weight.sum(dtype=torch.float32)


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                          ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                          softcap: Optional[float] = None, lse_square_scale: float = 0.0,
                          use_token_scaling: bool = False, compute_grad: bool = False, stats: bool = False
                          ) -> Tuple[torch.Tensor, ...]:
    """(loss, grad_logits, z_loss, token_accuracy, predicted_tokens): the loss ((BT,) for ``none``, else 0-d, in
    logits' dtype); with ``compute_grad`` the gradient of the loss w.r.t. logits for an incoming gradient of 1 (a
    new (BT, V) tensor in logits' dtype), else an empty (0,) tensor; with ``stats`` the ``_loss.LossStats``, else
    empty tensors."""
    options = LossOptions(ignore_index, reduction, label_smoothing, softcap, lse_square_scale, use_token_scaling)
    check_cross_entropy_inputs(logits, target, weight, options)
    n_rows, n_cols = logits.shape
    scale = target_scale(target, weight, ignore_index, reduction, n_cols)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)  # the kernel writes every row
    grad = new_like(logits) if compute_grad else logits.new_empty((0,))
    z_rows = torch.empty((n_rows,), dtype=torch.float32, device=logits.device) if stats else None
    argmax_rows = torch.empty((n_rows,), dtype=torch.int64, device=logits.device) if stats else None
    launch_rows(logits, target, weight, class_weight_sum(weight), row_losses, grad if compute_grad else None, scale,
                options, z_rows, argmax_rows)
    loss = reduce_rows(row_losses, scale, reduction).to(logits.dtype)
    extra = loss_stats(z_rows, argmax_rows, target, scale, options, logits.dtype) if stats else empty_stats(logits)
    return (loss, grad, *extra)
