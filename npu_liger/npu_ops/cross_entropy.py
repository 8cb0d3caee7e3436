"""Cross entropy over (BT, V) logit rows, loss and gradient in one launch.

Per row with target t (rows whose target equals ignore_index count for nothing):

    z    = softcap * tanh(x / softcap)               (x itself without softcap, or with softcap = inf)
    lse  = logsumexp(z)
    loss = lse - (1 - eps) * z[t] - eps / V * sum(z) + lse_square_scale * lse**2
    dz   = softmax(z) * (1 + 2 * lse_square_scale * lse) - (1 - eps) * onehot(t) - eps / V
    dx   = dz * (1 - (z / softcap)**2)                (dz itself without softcap)

which is ``F.cross_entropy(z, t, label_smoothing=eps)`` per row plus the z-loss. ``mean`` divides by the number
of valid rows, counted on the device (no host synchronisation) and clamped to 1, so no valid row gives 0 and
zero gradients. The loss is fp32 for any logits dtype; the gradient is in the logits' dtype.

One program walks whole rows (persistent grid-stride loop over rows). Pass 1 loops over V in UB-sized blocks
with an online log-sum-exp (running max m and sum d of exp(z - m)) and the running sum of z for label
smoothing; the target's logit is one scalar load. Pass 2 (only when a gradient is wanted) walks the row again
and writes ``dx * scale`` (scale = 1 / valid rows for ``mean``, else 1) into ``grad``: a new buffer for the op,
or the logits buffer itself for the fused linear cross entropy, whose chunk logits are private (each block is
read before the same program overwrites it, so in place is safe).

Out-of-range targets (not ignore_index, outside [0, V)): the kernel never reads outside the row (the target's
column is clamped before its load) and writes a NaN loss for that row. Besides, a one-program kernel that also
counts the valid rows flags them, and the launcher raises ``ValueError`` on CPU (a host check, no cost there)
and queues ``torch._assert_async`` on CUDA (a device-side assert, as ``F.cross_entropy`` does; no host
synchronisation). Other devices rely on the NaN loss.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._triton import (COMPUTE_DTYPE_SIZE, cdiv, check_float_tensor, flat_plan, grid_stride, launched_kernel,
                     new_like, program_start, require_launchable)

REDUCTIONS = ("none", "sum", "mean")
TARGET_DTYPES = (torch.int32, torch.int64)

# Memory analysis (fp32 arithmetic: tiles sized in fp32 elements). One row at a time, V tiled by BLOCK_V.
# Pass 1, per element: x (upcast), z (softcapped), exp(z - m), and the masked z for the smoothing sum: ~4 live.
# Pass 2, per element: x, z, softmax, the one-hot compare, dz and the softcap derivative: ~6 live.
# Loss only (pass 1): memory_multiplier 6.0 (Ascend910B3: 192 KiB * 0.8 / (6.0 * 4 B) = 6553 -> BLOCK_V 4096).
# With the gradient both passes share BLOCK_V. The Ascend compile check found that kernel (softcap, smoothing and
#   z-loss on) at BLOCK_V 4096 8% over the 910B UB (1704960 of 1572864 bits): GRAD_MEMORY_MULTIPLIER 10.0
#   (192 KiB * 0.8 / (10.0 * 4 B) = 3932 -> BLOCK_V 2048).
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims.
MEMORY_MULTIPLIER = 6.0
GRAD_MEMORY_MULTIPLIER = 10.0
# CUDA tiles (H200, bf16 8192x128256, measured per kernel alone): loss only 8192 columns on 4 warps (538 us, 0.92
# of copy, against 662 us for the tile budget's 2048); with the gradient 4096 columns on 8 warps (1542 us, 0.96 of
# copy for its two reads and one write, against 1820 us for 1024 on 4 warps). Other sizes measured slower.
CUDA_BLOCK, CUDA_WARPS = 8192, 4
CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS = 4096, 8
# scale_in_place, per element of a column tile: the value (upcast) and its scaled copy: ~2 live fp32 values; 3.0
#   leaves room (Ascend910B3: 192 KiB * 0.8 / (3.0 * 4 B) = 13107 -> BLOCK 8192). shapes ((cols,),), dim 0 tiled.
SCALE_MEMORY_MULTIPLIER = 3.0
# _target_stats_kernel, per target of a block: the target as int64 (2 fp32 slots), the valid and bad flags, two
#   int32 counters: ~6 slots, but the Ascend compile check measured 48 UB bytes per element single-buffered (the
#   int64 compares and casts), so 6.0 (BLOCK 4096 on A2/A3) fitted only with multi-buffer off; 10.0 (192 KiB *
#   0.8 / 40 B = 3932 -> BLOCK 2048) fits double-buffered. shapes ((BT,),), dim 0 tiled.
TARGET_STATS_MEMORY_MULTIPLIER = 10.0


@triton.jit
def _tanh(y):
    """tanh without libdevice, to ~3e-7 relative error everywhere: (1 - e^-2|y|) / (1 + e^-2|y|) loses digits to
    cancellation near 0, so |y| < 0.25 takes the Taylor series to y^7 (remainder below 1e-7 there)."""
    a = tl.abs(y)
    e = tl.exp(a * -2.0)
    far = (1.0 - e) / (1.0 + e)
    a2 = a * a
    near = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))))
    t = tl.where(a < 0.25, near, far)
    return tl.where(y < 0.0, -t, t)


@triton.jit
def _softcapped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:  # softcap * tanh(x / softcap)
        x = _tanh(x / softcap) * softcap
    return x


@launched_kernel(do_not_specialize=["n_rows", "ignore_index"])
def _cross_entropy_fwd_kernel(logits_ptr, target_ptr, loss_ptr, grad_ptr, scale_ptr, n_rows, n_cols,
                              logits_stride_row, logits_stride_col, target_stride, grad_stride_row, scale_stride,
                              ignore_index, label_smoothing, softcap, lse_square_scale,
                              HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_Z_LOSS: tl.constexpr,
                              COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
                              ORDER_TARGET_STORE: tl.constexpr = False):
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        row_ptr = logits_ptr + row * logits_stride_row
        target = tl.load(target_ptr + row * target_stride).to(tl.int64)
        valid = target != ignore_index
        in_range = (target >= 0) & (target < n_cols)
        read_cols = tl.where(valid, n_cols, 0)  # an ignored row reads nothing
        # Pass 1: online log-sum-exp. m starts finite so exp(m - m_new) never sees inf - inf.
        m = -1e30
        d = 0.0
        z_sum = 0.0
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            load_mask = cols < read_cols
            if HAS_SOFTCAP:  # masked columns must be -inf after the softcap too
                x = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_col, mask=load_mask, other=0.0)
                z = tl.where(load_mask, _softcapped(x.to(tl.float32), softcap, HAS_SOFTCAP), float("-inf"))
            else:  # no select per element: -8% time at 8192x128256 on the H200
                z = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_col, mask=load_mask,
                            other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
            if HAS_SMOOTHING:
                z_sum += tl.sum(tl.where(load_mask, z, 0.0), axis=0)
        # An ignored row has d = 0: log(1) keeps it finite. No clamp on d itself: a NaN or +inf logit makes d NaN
        # and must reach the loss (a clamp through maximum() drops NaN on GPUs and hid a diverged run as a finite
        # loss); -inf logits only add 0 to d.
        log_d = tl.log(tl.where(valid, d, 1.0))
        lse = tl.where(valid, m + log_d, 0.0)
        # The target's logit: its column clamped into the row, so a bad target never reads outside it.
        safe_target = tl.where(in_range, target, 0)
        z_target = _softcapped(tl.load(row_ptr + safe_target * logits_stride_col).to(tl.float32), softcap,
                               HAS_SOFTCAP)
        # lse - z_target as (m - z_target) + log(d): a confident row's loss is small next to lse, and rounding
        # lse = m + log(d) first would cost it ulp(lse) of absolute error (3-7x eager's error on such rows);
        # m - z_target is exact when the target holds the maximum (0 for a one-class row).
        loss = (m - z_target + log_d) * (1.0 - label_smoothing)
        if HAS_SMOOTHING:
            loss += (m - z_sum / n_cols + log_d) * label_smoothing
        if HAS_Z_LOSS:
            loss += lse * lse * lse_square_scale
        loss = tl.where(in_range, loss, float("nan"))  # a bad target poisons the loss
        tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
        if COMPUTE_GRAD:
            # Pass 2: the gradient of the row, scaled; exact zeros for an ignored row.
            # 1 / valid rows (mean), 1, or the row's incoming gradient (stride 1): read on the device
            scale = tl.load(scale_ptr + row * scale_stride)
            z_loss_scale = lse * lse_square_scale * 2.0  # d(z * lse^2)/dz = 2 z lse softmax
            grad_row = grad_ptr + row * grad_stride_row
            for start in tl.range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                load_mask = cols < read_cols
                x = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_col, mask=load_mask,
                            other=0.0).to(tl.float32)
                z = _softcapped(x, softcap, HAS_SOFTCAP)
                softmax = tl.exp(z - lse)
                dz = softmax  # the target's column is written again below, with its one-hot term
                if HAS_SMOOTHING:
                    dz -= label_smoothing / n_cols
                if HAS_Z_LOSS:  # added apart from the cross-entropy term so that neither cancels the other
                    dz += softmax * z_loss_scale
                if HAS_SOFTCAP:
                    tanh = z / softcap
                    dz = dz * (1.0 - tanh * tanh)
                dz = tl.where(load_mask, dz * scale, 0.0)
                tl.store(grad_row + cols.to(tl.int64), dz.to(grad_ptr.dtype.element_ty), mask=cols < n_cols)
            # The target's column: (p - 1) + eps * (1 - 1/V) (+ z-loss), no cancellation between the terms. A
            # scalar store after the loop rather than a per-element compare with the target (bishengir-compile-a5
            # fails on that compare), computed from fp32 values, so the column is rounded once.
            p_target = tl.exp(z_target - lse)
            dz_target = p_target - 1.0
            if HAS_SMOOTHING:
                dz_target += (1.0 - 1.0 / n_cols) * label_smoothing
            if HAS_Z_LOSS:
                dz_target += p_target * z_loss_scale
            if HAS_SOFTCAP:
                tanh_target = z_target / softcap
                dz_target = dz_target * (1.0 - tanh_target * tanh_target)
            if ORDER_TARGET_STORE:
                # CUDA: the block store above wrote this column too, from another thread of the program; without
                # a barrier the two stores race (measured on the H200: target-column gradients ~10% off at
                # 1024+ rows). triton-ascend and the interpreter run a program's stores in order.
                tl.debug_barrier()
            tl.store(grad_row + safe_target, (dz_target * scale).to(grad_ptr.dtype.element_ty), mask=valid & in_range)


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


def check_cross_entropy_args(target: torch.Tensor, n_rows, ignore_index: int, reduction: str,
                             label_smoothing: float, softcap: Optional[float], lse_square_scale: float,
                             ref_name: str, ref: torch.Tensor) -> None:
    """Checks shared by cross_entropy and fused_linear_cross_entropy (``ref``: the tensor whose rows the
    targets label)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be int32 or int64, got {target.dtype}")
    if target.dim() != 1 or target.shape[0] != n_rows:
        raise ValueError(f"target must have shape (BT,) = ({n_rows},) to match {ref_name}, "
                         f"got {tuple(target.shape)}")
    if target.device != ref.device:
        raise RuntimeError(f"target must be on the device of {ref_name} ({ref.device}), got {target.device}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, torch.SymInt)):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    check_loss_options(reduction, label_smoothing, softcap, lse_square_scale)


def check_loss_options(reduction: str, label_smoothing: float, softcap: Optional[float],
                       lse_square_scale: float) -> None:
    """The scalar options of both losses (also checked when an ``nn`` loss module is built)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not softcap > 0.0:
        raise ValueError(f"softcap must be None or > 0, got {softcap}")
    if not lse_square_scale >= 0.0:
        raise ValueError(f"lse_square_scale must be >= 0, got {lse_square_scale}")


def check_cross_entropy_inputs(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
                               label_smoothing: float, softcap: Optional[float], lse_square_scale: float) -> None:
    check_float_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (BT, V), got shape {tuple(logits.shape)}")
    check_cross_entropy_args(target, logits.shape[0], ignore_index, reduction, label_smoothing, softcap,
                             lse_square_scale, "logits", logits)


@launched_kernel(do_not_specialize=["n_rows", "ignore_index"])
def _target_stats_kernel(target_ptr, scale_ptr, ok_ptr, n_rows, n_cols, target_stride, ignore_index,
                         MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """One program over all targets: ``scale`` = 1 / max(valid rows, 1) for ``mean`` (else 1), and ``ok`` = 1
    when every target is ignore_index or in [0, n_cols). One launch where torch ops took ~10 small kernels."""
    valid_count = tl.zeros((BLOCK,), dtype=tl.int32)
    bad_count = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in tl.range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        target = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=rows < n_rows,
                         other=ignore_index).to(tl.int64)
        valid = target != ignore_index
        valid_count += valid.to(tl.int32)
        bad_count += (valid & ((target < 0) | (target >= n_cols))).to(tl.int32)
    if MEAN:
        scale = 1.0 / tl.maximum(tl.sum(valid_count, axis=0), 1).to(tl.float32)
    else:
        scale = 1.0
    tl.store(scale_ptr, scale)
    tl.store(ok_ptr, (tl.sum(bad_count, axis=0) == 0).to(tl.int32))


def target_scale(target: torch.Tensor, ignore_index: int, reduction: str, n_cols: int) -> torch.Tensor:
    """What each row's loss and gradient are multiplied by: 1 / valid rows for ``mean`` (a device scalar, no
    sync; clamped so that no valid row gives 0), else 1 (fp32, 0-d). Checks the targets on the way
    (``report_bad_targets``)."""
    scale = torch.empty((), dtype=torch.float32, device=target.device)
    ok = torch.empty((), dtype=torch.int32, device=target.device)
    require_launchable(target.device)
    # one program: a fixed-order count, no atomics (tiles: see TARGET_STATS_MEMORY_MULTIPLIER above)
    plan = flat_plan(target.device.type, max(target.numel(), 1), TARGET_STATS_MEMORY_MULTIPLIER)
    _target_stats_kernel[(1,)](target, scale, ok, target.numel(), n_cols, target.stride(0), ignore_index,
                               MEAN=reduction == "mean", BLOCK=plan.block, **plan.launch_options())
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


def reduce_rows(row_losses: torch.Tensor, scale: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return row_losses
    total = row_losses.sum()
    return total * scale if reduction == "mean" else total


@memoised_plan
def _rows_plan(device_type: str, n_cols: int, compute_grad: bool):
    """BLOCK_V plan of the cross-entropy kernel (see the memory multipliers and CUDA tiles above)."""
    multiplier, cuda_block, cuda_warps = ((GRAD_MEMORY_MULTIPLIER, CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS) if compute_grad
                                          else (MEMORY_MULTIPLIER, CUDA_BLOCK, CUDA_WARPS))
    return plan_launch(device_type, TileRequest(multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=cuda_block, cuda_num_warps=cuda_warps))


def launch_rows(logits: torch.Tensor, target: torch.Tensor, row_losses: torch.Tensor, grad: Optional[torch.Tensor],
                scale: torch.Tensor, ignore_index: int, label_smoothing: float, softcap: Optional[float],
                lse_square_scale: float) -> None:
    """Run the kernel over ``logits`` rows: per-row fp32 losses into ``row_losses`` and, with ``grad`` (a
    unit-column-stride buffer of logits' shape, possibly ``logits`` itself), the gradient times ``scale`` (an
    fp32 0-d tensor, or one value per row)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    if n_cols == 0:
        row_losses.fill_(float("nan"))  # no class to be right about: every valid row is out of range
        row_losses.masked_fill_(target == ignore_index, 0.0)
        return
    require_launchable(logits.device)
    compute_grad = grad is not None
    if softcap == float("inf"):  # the limit of c * tanh(x / c): no cap (computing it would give inf * 0 = NaN)
        softcap = None
    # Tiles and memory multipliers: see MEMORY_MULTIPLIER and GRAD_MEMORY_MULTIPLIER above.
    plan = _rows_plan(logits.device.type, n_cols, compute_grad)
    if grad is not None and grad.stride(1) != 1:
        raise RuntimeError("cross entropy: the gradient buffer must have unit column stride")
    grad_arg = grad if compute_grad else row_losses  # never written: COMPUTE_GRAD is off
    _cross_entropy_fwd_kernel[(plan.grid(n_rows),)](
        logits, target, row_losses, grad_arg, scale, n_rows, n_cols, logits.stride(0), logits.stride(1),
        target.stride(0), grad.stride(0) if compute_grad else 0, scale.stride(0) if scale.dim() else 0, ignore_index,
        float(label_smoothing),
        float(softcap) if softcap is not None else 1.0, float(lse_square_scale), HAS_SOFTCAP=softcap is not None,
        HAS_SMOOTHING=label_smoothing > 0.0, HAS_Z_LOSS=lse_square_scale > 0.0, COMPUTE_GRAD=compute_grad,
        BLOCK_V=plan.block, ORDER_TARGET_STORE=logits.is_cuda, **plan.launch_options()
    )


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                          reduction: str = "mean", label_smoothing: float = 0.0, softcap: Optional[float] = None,
                          lse_square_scale: float = 0.0, compute_grad: bool = False
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, grad_logits): the loss (fp32; (BT,) for ``none``, else 0-d) and, with ``compute_grad``, the
    gradient of the loss w.r.t. logits for an incoming gradient of 1 (a new (BT, V) tensor in logits' dtype);
    without, an empty (0,) tensor."""
    check_cross_entropy_inputs(logits, target, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
    n_rows, n_cols = logits.shape
    scale = target_scale(target, ignore_index, reduction, n_cols)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)  # the kernel writes every row
    grad = new_like(logits) if compute_grad else logits.new_empty((0,))
    launch_rows(logits, target, row_losses, grad if compute_grad else None, scale, ignore_index, label_smoothing,
                softcap, lse_square_scale)
    return reduce_rows(row_losses, scale, reduction), grad
