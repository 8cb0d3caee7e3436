"""What the cross-entropy losses (cross_entropy.py, fused_linear_cross_entropy.py) share: their options as one
named type, the checks, the targets' statistics (how many rows count, what ``mean`` divides by, whether every
target is in range: one launch, no host synchronisation), the reductions and the statistics users log.

The row kernel itself, which both losses launch on (BT, V) logit rows (the whole logits, or one chunk of them),
is in ``_cross_entropy_rows.py``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton.language as tl

from ._triton import (cdiv, check_float_tensor, flat_plan, grid_stride, launched_kernel, program_start,
                      require_launchable)

REDUCTIONS = ("none", "sum", "mean")
TARGET_DTYPES = (torch.int32, torch.int64)


class LossOptions(NamedTuple):
    """The scalar options of both losses, in their schemas' order (after the tensors)."""
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    softcap: Optional[float] = None
    lse_square_scale: float = 0.0
    use_token_scaling: bool = False

    @property
    def capped(self) -> bool:
        """Whether the logits are softcapped: ``softcap=inf`` is the limit of c * tanh(x / c), no cap."""
        return self.softcap is not None and self.softcap != float("inf")


class LossStats(NamedTuple):
    """What users log beside the loss (Liger's ``CrossEntropyOutput`` fields): the z-loss term as it enters the loss
    (reduced like it), the token accuracy (the mean over valid rows; per row for ``none``) and the predicted tokens
    (argmax per row, -1 for ignored rows)."""
    z_loss: torch.Tensor
    token_accuracy: torch.Tensor
    predicted_tokens: torch.Tensor


def check_loss_options(options: LossOptions) -> None:
    """The scalar options (also checked when an ``nn`` loss module is built)."""
    if options.reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {options.reduction!r}")
    if isinstance(options.ignore_index, bool) or not isinstance(options.ignore_index, (int, torch.SymInt)):
        raise TypeError(f"ignore_index must be an int, got {type(options.ignore_index).__name__}")
    if not 0.0 <= options.label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {options.label_smoothing}")
    if options.softcap is not None and not options.softcap > 0.0:
        raise ValueError(f"softcap must be None or > 0, got {options.softcap}")
    if not options.lse_square_scale >= 0.0:
        raise ValueError(f"lse_square_scale must be >= 0, got {options.lse_square_scale}")
    if not isinstance(options.use_token_scaling, bool):
        raise TypeError(f"use_token_scaling must be a bool, got {type(options.use_token_scaling).__name__}")


def check_targets(target: torch.Tensor, n_rows, class_weight: Optional[torch.Tensor], n_classes, ref_name: str,
                  ref: torch.Tensor, weight_name: str = "weight") -> None:
    """The targets (BT,) labelling ``ref``'s rows, and the class weights (V,) if given."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be int32 or int64, got {target.dtype}")
    if target.dim() != 1 or target.shape[0] != n_rows:
        raise ValueError(f"target must have shape (BT,) = ({n_rows},) to match {ref_name}, "
                         f"got {tuple(target.shape)}")
    if target.device != ref.device:
        raise RuntimeError(f"target must be on the device of {ref_name} ({ref.device}), got {target.device}")
    if class_weight is not None:
        check_float_tensor(weight_name, class_weight)
        if class_weight.dim() != 1 or class_weight.shape[0] != n_classes:
            raise ValueError(f"{weight_name} (class weights) must have shape (V,) = ({n_classes},), "
                             f"got {tuple(class_weight.shape)}")
        if class_weight.device != ref.device:
            raise RuntimeError(f"{weight_name} must be on the device of {ref_name} ({ref.device}), "
                               f"got {class_weight.device}")


# _target_stats_kernel, per target of a block: the target as int64 (2 fp32 slots), the valid and bad flags, two
#   int32 counters, the gathered class weight and its sum: ~8 slots, but the Ascend compile check measured 48 UB
#   bytes per element single-buffered for the unweighted kernel (the int64 compares and casts), so 6.0 (BLOCK 4096
#   on A2/A3) fitted only with multi-buffer off; 10.0 (192 KiB * 0.8 / 40 B = 3932 -> BLOCK 2048) fits
#   double-buffered. shapes ((BT,),), dim 0 tiled.
TARGET_STATS_MEMORY_MULTIPLIER = 10.0
# scale_in_place, per element of a column tile: the value (upcast) and its scaled copy: ~2 live fp32 values; 3.0
#   leaves room (Ascend910B3: 192 KiB * 0.8 / (3.0 * 4 B) = 13107 -> BLOCK 8192). shapes ((cols,),), dim 0 tiled.
SCALE_MEMORY_MULTIPLIER = 3.0


@launched_kernel(do_not_specialize=["n_rows", "ignore_index"])
def _target_stats_kernel(target_ptr, weight_ptr, scale_ptr, ok_ptr, n_rows, n_cols, target_stride, weight_stride,
                         ignore_index, MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    """One program over all targets: ``scale`` = 1 / (the valid rows' summed class weights, or their count) for
    ``mean`` (no valid row: 1, so the loss is 0), else 1; ``ok`` = 1 when every target is ignore_index or in
    [0, n_cols). One launch where torch ops took ~10 small kernels."""
    valid_count = tl.zeros((BLOCK,), dtype=tl.int32)
    bad_count = tl.zeros((BLOCK,), dtype=tl.int32)
    valid_weight = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in tl.range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        target = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=rows < n_rows,
                         other=ignore_index).to(tl.int64)
        valid = target != ignore_index
        in_range = (target >= 0) & (target < n_cols)
        valid_count += valid.to(tl.int32)
        bad_count += (valid & ~in_range).to(tl.int32)
        if HAS_WEIGHT:
            weight = tl.load(weight_ptr + tl.where(in_range, target, 0) * weight_stride, mask=valid & in_range,
                             other=0.0)
            valid_weight += weight.to(tl.float32)
    if MEAN:
        n_valid = tl.sum(valid_count, axis=0)
        if HAS_WEIGHT:  # torch's weighted mean: 0 / 0 = NaN when the valid rows weigh nothing, as F.cross_entropy
            scale = 1.0 / tl.where(n_valid > 0, tl.sum(valid_weight, axis=0), 1.0)
        else:
            scale = 1.0 / tl.maximum(n_valid, 1).to(tl.float32)
    else:
        scale = 1.0
    tl.store(scale_ptr, scale)
    tl.store(ok_ptr, (tl.sum(bad_count, axis=0) == 0).to(tl.int32))


def target_scale(target: torch.Tensor, class_weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
                 n_cols: int) -> torch.Tensor:
    """What each row's loss and gradient are multiplied by: 1 / the valid rows' weight (their count without class
    weights) for ``mean`` (a device scalar, no sync; no valid row gives 0), else 1 (fp32, 0-d). Checks the targets
    on the way (``report_bad_targets``)."""
    scale = torch.empty((), dtype=torch.float32, device=target.device)
    ok = torch.empty((), dtype=torch.int32, device=target.device)
    require_launchable(target.device)
    # one program: a fixed-order count, no atomics (tiles: see TARGET_STATS_MEMORY_MULTIPLIER above)
    plan = flat_plan(target.device.type, max(target.numel(), 1), TARGET_STATS_MEMORY_MULTIPLIER)
    has_weight = class_weight is not None
    _target_stats_kernel[(1,)](target, class_weight if has_weight else scale, scale, ok, target.numel(), n_cols,
                               target.stride(0), class_weight.stride(0) if has_weight else 0, ignore_index,
                               MEAN=reduction == "mean", HAS_WEIGHT=has_weight, BLOCK=plan.block,
                               **plan.launch_options())
    report_bad_targets(ok, target, ignore_index, n_cols)
    return scale


def report_bad_targets(ok: torch.Tensor, target: torch.Tensor, ignore_index: int, n_cols: int) -> None:
    """Targets other than ignore_index must lie in [0, n_cols) (``ok`` = 0 when one does not): a ``ValueError``
    naming it on CPU (reading the flag costs nothing there), a device-side assert on CUDA (``torch._assert_async``,
    as ``F.cross_entropy`` does; no host synchronisation). Other devices rely on the kernel's NaN loss."""
    if target.device.type == "cpu":
        if not ok.item():
            bad = (target != ignore_index) & ((target < 0) | (target >= n_cols))
            raise ValueError(f"target {target[bad][0].item()} is out of range for {n_cols} classes: targets must be "
                             f"in [0, {n_cols}) or equal ignore_index ({ignore_index})")
    elif target.device.type == "cuda":
        torch._assert_async(ok, f"cross entropy: a target is outside [0, {n_cols}) and not ignore_index")


def reduce_rows(row_values: torch.Tensor, scale: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-row fp32 values (losses, z-loss terms) reduced as the loss is."""
    if reduction == "none":
        return row_values
    total = row_values.sum()
    return total * scale if reduction == "mean" else total


def loss_stats(z_rows: torch.Tensor, predicted: torch.Tensor, target: torch.Tensor, scale: torch.Tensor,
               options: LossOptions, dtype: torch.dtype) -> LossStats:
    """``LossStats`` from the kernel's per-row z-loss terms and argmaxes (-1 on ignored rows)."""
    correct = ((predicted == target) & (target != options.ignore_index)).to(torch.float32)
    if options.reduction != "none":
        n_valid = (target != options.ignore_index).sum().clamp_min(1)
        correct = correct.sum() / n_valid
    return LossStats(reduce_rows(z_rows, scale, options.reduction).to(dtype), correct, predicted)


def empty_stats(ref: torch.Tensor) -> LossStats:
    """What the with-stats outputs hold when no statistics were asked for."""
    return LossStats(ref.new_empty((0,), dtype=torch.float32), ref.new_empty((0,), dtype=torch.float32),
                     ref.new_empty((0,), dtype=torch.int64))


@launched_kernel(do_not_specialize=["n_rows", "n_elements"])
def _scale_rows_kernel(grad_ptr, scale_ptr, n_rows, n_cols, n_elements, grad_stride_row, scale_stride,
                       BLOCK: tl.constexpr):
    """grad[row] *= scale[row] in place; a row whose scale is exactly 1 (``loss.backward()``) is not touched, so
    the common case costs one scalar load per row instead of a pass over the gradient."""
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
        if scale != 1.0:
            for start in tl.range(0, n_cols, BLOCK):
                offsets = row * grad_stride_row + start + tl.arange(0, BLOCK)
                mask = (start + tl.arange(0, BLOCK) < n_cols) & (offsets < n_elements)
                g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
                tl.store(grad_ptr + offsets, (g * scale).to(grad_ptr.dtype.element_ty), mask=mask)


def scale_in_place(grad: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``grad *= scale`` for a contiguous ``grad`` and a 0-d ``scale`` or one per row of a 2-D ``grad``, skipping
    the work (decided on the device, no sync) where the scale is exactly 1. Returns ``grad``."""
    if grad.numel() == 0:
        return grad
    if not grad.is_contiguous():
        raise RuntimeError("scale_in_place: the gradient must be contiguous")
    require_launchable(grad.device)
    if scale.dim() == 0:  # one scale: rows of one block each over the flat gradient, so every program has work
        plan = flat_plan(grad.device.type, grad.numel(), SCALE_MEMORY_MULTIPLIER)
        n_cols = plan.block
        n_rows, row_stride, scale_stride = cdiv(grad.numel(), n_cols), n_cols, 0
    else:
        if grad.dim() != 2 or scale.shape != (grad.shape[0],):
            raise ValueError(f"scale must be 0-d or have one entry per row of a 2-D gradient, got {tuple(scale.shape)} "
                             f"for {tuple(grad.shape)}")
        n_rows, n_cols = grad.shape
        plan = flat_plan(grad.device.type, n_cols, SCALE_MEMORY_MULTIPLIER)
        row_stride, scale = n_cols, scale.contiguous()
        scale_stride = 1
    # Tiles: see SCALE_MEMORY_MULTIPLIER above.
    _scale_rows_kernel[(plan.grid(n_rows),)](grad, scale, n_rows, n_cols, grad.numel(), row_stride, scale_stride,
                                             BLOCK=plan.block, **plan.launch_options())
    return grad


__all__ = ["LossOptions", "LossStats", "REDUCTIONS", "check_loss_options", "check_targets", "empty_stats",
           "loss_stats", "reduce_rows", "scale_in_place", "target_scale"]
