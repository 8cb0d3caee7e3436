"""The cross-entropy row kernel both losses launch (cross_entropy.py on the logits, fused_linear_cross_entropy.py on
each chunk's logits): per-row losses and, when asked, the gradient, in one launch.

Per row with target t (rows whose target equals ignore_index count for nothing), eps = label_smoothing, w the
class weights (1 without), W = sum(w), s = lse_square_scale:

    z    = softcap * tanh(x / softcap)               (x itself without softcap, or with softcap = inf)
    lse  = logsumexp(z),  p = softmax(z)
    loss = (1 - eps) * w_t * (lse - z_t) + eps / V * sum_c w_c (lse - z_c)      F.cross_entropy(weight, smoothing)
           + w_t * s * lse**2                                                   the z-loss, weighted as its row
    dz_c = p_c * ((1 - eps) * w_t + eps * W / V + 2 s w_t lse) - (1 - eps) * w_t * [c == t] - eps / V * w_c
    dx   = dz * (1 - (z / softcap)**2)                (dz itself without softcap)

With token scaling (Liger's ``use_token_scaling``) the row's loss and gradient are multiplied by p_t, detached.
Every row's loss and gradient is then multiplied by the row's ``scale``: 1 / the valid rows' summed w_t for
``mean`` (their count without class weights; ``_loss.target_scale``), 1, or a per-row incoming gradient.

One program walks whole rows (persistent grid-stride loop over rows). Pass 1 loops over V in UB-sized blocks
with an online log-sum-exp (running max m and sum d of exp(z - m)), the running sum of z (w z with class weights)
for label smoothing and, with statistics, the running argmax; the target's logit is one scalar load. Pass 2 (only
when a gradient is wanted) walks the row again and writes ``dx * scale`` into ``grad``: a new buffer for the op,
or the logits buffer itself for the fused linear cross entropy, whose chunk logits are private (each block is
read before the same program overwrites it, so in place is safe).

Out-of-range targets (not ignore_index, outside [0, V)): the kernel never reads outside the row (the target's
column is clamped before its load) and writes a NaN loss for that row; ``_loss.target_scale`` reports them.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._loss import LossOptions
from ._triton import COMPUTE_DTYPE_SIZE, grid_stride, launched_kernel, program_start, require_launchable, tanh

# Memory analysis (fp32 arithmetic: tiles sized in fp32 elements). One row at a time, V tiled by BLOCK_V.
# Pass 1, per element: x (upcast), z (softcapped), exp(z - m), and the masked z for the smoothing sum: ~4 live.
# Pass 2, per element: x, z, softmax, the one-hot compare, dz and the softcap derivative: ~6 live.
# Loss only (pass 1): memory_multiplier 6.0 (Ascend910B3: 192 KiB * 0.8 / (6.0 * 4 B) = 6553 -> BLOCK_V 4096).
# With the gradient both passes share BLOCK_V. The Ascend compile check found that kernel (softcap, smoothing and
#   z-loss on) at BLOCK_V 4096 8% over the 910B UB (1704960 of 1572864 bits): GRAD_MEMORY_MULTIPLIER 10.0
#   (192 KiB * 0.8 / (10.0 * 4 B) = 3932 -> BLOCK_V 2048).
# Class weights with label smoothing add w and w * z per element (+2), statistics the argmax's index and compare
#   (+2): at most 10.0 / 14.0 (BLOCK_V 2048 either way on the 910B: 3932 / 2808 elements).
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims.
MEMORY_MULTIPLIER = 6.0
GRAD_MEMORY_MULTIPLIER = 10.0
WEIGHTED_SMOOTHING_MULTIPLIER = 2.0
STATS_MULTIPLIER = 2.0
# CUDA tiles (H200, bf16 8192x128256, measured per kernel alone): loss only 8192 columns on 4 warps (538 us, 0.92
# of copy, against 662 us for the tile budget's 2048); with the gradient 4096 columns on 8 warps (1542 us, 0.96 of
# copy for its two reads and one write, against 1820 us for 1024 on 4 warps). Other sizes measured slower.
CUDA_BLOCK, CUDA_WARPS = 8192, 4
CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS = 4096, 8


@triton.jit
def _softcapped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:  # softcap * tanh(x / softcap)
        x = tanh(x / softcap) * softcap
    return x


@launched_kernel(do_not_specialize=["n_rows", "ignore_index"])
def _cross_entropy_fwd_kernel(logits_ptr, target_ptr, weight_ptr, weight_sum_ptr, loss_ptr, z_loss_ptr, argmax_ptr,
                              grad_ptr, scale_ptr, n_rows, n_cols, logits_stride_row, logits_stride_col,
                              target_stride, weight_stride, grad_stride_row, scale_stride, ignore_index,
                              label_smoothing, softcap, lse_square_scale,
                              HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_Z_LOSS: tl.constexpr,
                              HAS_WEIGHT: tl.constexpr, TOKEN_SCALING: tl.constexpr, STATS: tl.constexpr,
                              COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
                              ORDER_TARGET_STORE: tl.constexpr = False):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    label_smoothing = tl.cast(label_smoothing, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    lse_square_scale = tl.cast(lse_square_scale, tl.float32)
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        row_ptr = logits_ptr + row * logits_stride_row
        target = tl.load(target_ptr + row * target_stride).to(tl.int64)
        valid = target != ignore_index
        in_range = (target >= 0) & (target < n_cols)
        read_cols = tl.where(valid, n_cols, 0)  # an ignored row reads nothing
        # Pass 1: online log-sum-exp. m starts finite so exp(m - m_new) never sees inf - inf.
        m = -1e30
        d = 0.0
        z_sum = 0.0  # sum of z (of w z with class weights), for label smoothing
        best = -float("inf")  # the running argmax, for the statistics
        best_col = 0
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
                if HAS_WEIGHT:
                    w = tl.load(weight_ptr + cols.to(tl.int64) * weight_stride, mask=load_mask, other=0.0)
                    z_sum += tl.sum(tl.where(load_mask, w.to(tl.float32) * z, 0.0), axis=0)
                else:
                    z_sum += tl.sum(tl.where(load_mask, z, 0.0), axis=0)
            if STATS:  # the first column holding the row's maximum, as torch.argmax
                block_best = tl.max(z, axis=0)
                better = block_best > best
                # min over the columns holding it rather than tl.argmax, which bishengir-compile-a5 (Ascend950)
                # refuses ("Failed to run BiShengHIR pipeline"; found by the Ascend check)
                first = tl.min(tl.where(z == block_best, cols, 2147483647), axis=0)
                best_col = tl.where(better, first, best_col)
                best = tl.where(better, block_best, best)
        # An ignored row has d = 0: log(1) keeps it finite. No clamp on d itself: a NaN or +inf logit makes d NaN
        # and must reach the loss (a clamp through maximum() drops NaN on GPUs and hid a diverged run as a finite
        # loss); -inf logits only add 0 to d.
        log_d = tl.log(tl.where(valid, d, 1.0))
        lse = tl.where(valid, m + log_d, 0.0)
        # The target's logit: its column clamped into the row, so a bad target never reads outside it.
        safe_target = tl.where(in_range, target, 0)
        z_target = _softcapped(tl.load(row_ptr + safe_target * logits_stride_col).to(tl.float32), softcap,
                               HAS_SOFTCAP)
        if HAS_WEIGHT:
            w_target = tl.load(weight_ptr + safe_target * weight_stride).to(tl.float32)
            weight_sum = tl.load(weight_sum_ptr)
        else:
            w_target = 1.0
        # lse - z_target as (m - z_target) + log(d): a confident row's loss is small next to lse, and rounding
        # lse = m + log(d) first would cost it ulp(lse) of absolute error (3-7x eager's error on such rows);
        # m - z_target is exact when the target holds the maximum (0 for a one-class row).
        loss = (m - z_target + log_d) * w_target * (1.0 - label_smoothing)
        if HAS_SMOOTHING:
            if HAS_WEIGHT:
                loss += (weight_sum * (m + log_d) - z_sum) / n_cols * label_smoothing
            else:
                loss += (m - z_sum / n_cols + log_d) * label_smoothing
        z_loss = lse * lse * lse_square_scale * w_target
        p_target = tl.exp(z_target - lse)
        if TOKEN_SCALING:  # each row's loss (and gradient) times its target's probability, a constant to autograd
            loss = loss * p_target
            z_loss = z_loss * p_target
        if HAS_Z_LOSS:
            loss += z_loss
        loss = tl.where(in_range, loss, float("nan"))  # a bad target poisons the loss
        tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
        if STATS:
            tl.store(z_loss_ptr + row, tl.where(valid, z_loss, 0.0))
            tl.store(argmax_ptr + row, tl.where(valid, best_col, -1).to(tl.int64))
        if COMPUTE_GRAD:
            # Pass 2: the gradient of the row, scaled; exact zeros for an ignored row.
            # 1 / valid rows (mean), 1, or the row's incoming gradient (stride 1): read on the device
            scale = tl.load(scale_ptr + row * scale_stride)
            if TOKEN_SCALING:
                scale = scale * p_target
            z_loss_scale = lse * lse_square_scale * w_target * 2.0  # d(w_t s lse^2)/dz = 2 w_t s lse softmax
            if HAS_SMOOTHING and HAS_WEIGHT:
                p_factor = w_target * (1.0 - label_smoothing) + weight_sum / n_cols * label_smoothing
            elif HAS_SMOOTHING:
                p_factor = 1.0
            else:
                p_factor = w_target
            grad_row = grad_ptr + row * grad_stride_row
            for start in tl.range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                load_mask = cols < read_cols
                x = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_col, mask=load_mask,
                            other=0.0).to(tl.float32)
                z = _softcapped(x, softcap, HAS_SOFTCAP)
                softmax = tl.exp(z - lse)
                dz = softmax * p_factor  # the target's column is written again below, with its one-hot term
                if HAS_SMOOTHING and HAS_WEIGHT:
                    w = tl.load(weight_ptr + cols.to(tl.int64) * weight_stride, mask=load_mask, other=0.0)
                    dz -= w.to(tl.float32) * (label_smoothing / n_cols)
                elif HAS_SMOOTHING:
                    dz -= label_smoothing / n_cols
                if HAS_Z_LOSS:  # added apart from the cross-entropy term so that neither cancels the other
                    dz += softmax * z_loss_scale
                if HAS_SOFTCAP:
                    tanh = z / softcap
                    dz = dz * (1.0 - tanh * tanh)
                dz = tl.where(load_mask, dz * scale, 0.0)
                tl.store(grad_row + cols.to(tl.int64), dz.to(grad_ptr.dtype.element_ty), mask=cols < n_cols)
            # The target's column: (p - 1) + eps * (1 - 1/V) (+ z-loss) without class weights, no cancellation
            # between the terms. A scalar store after the loop rather than a per-element compare with the target
            # (bishengir-compile-a5 fails on that compare), computed from fp32 values, so the column is rounded once.
            if HAS_WEIGHT:
                dz_target = (p_target - 1.0) * w_target * (1.0 - label_smoothing)
                if HAS_SMOOTHING:
                    dz_target += (weight_sum * p_target - w_target) * (label_smoothing / n_cols)
            else:
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


@memoised_plan
def _rows_plan(device_type: str, n_cols: int, compute_grad: bool, weighted_smoothing: bool, stats: bool):
    """BLOCK_V plan of the row kernel (see the memory multipliers and CUDA tiles above)."""
    multiplier, cuda_block, cuda_warps = ((GRAD_MEMORY_MULTIPLIER, CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS) if compute_grad
                                          else (MEMORY_MULTIPLIER, CUDA_BLOCK, CUDA_WARPS))
    multiplier += WEIGHTED_SMOOTHING_MULTIPLIER * weighted_smoothing + STATS_MULTIPLIER * stats
    return plan_launch(device_type, TileRequest(multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=cuda_block, cuda_num_warps=cuda_warps))


def launch_rows(logits: torch.Tensor, target: torch.Tensor, class_weight: Optional[torch.Tensor],
                weight_sum: Optional[torch.Tensor], row_losses: torch.Tensor, grad: Optional[torch.Tensor],
                scale: torch.Tensor, options: LossOptions, z_rows: Optional[torch.Tensor] = None,
                argmax_rows: Optional[torch.Tensor] = None) -> None:
    """Run the kernel over ``logits`` rows: per-row fp32 losses into ``row_losses`` and, with ``grad`` (a
    unit-column-stride buffer of logits' shape, possibly ``logits`` itself), the gradient times ``scale`` (an
    fp32 0-d tensor, or one value per row). ``class_weight`` (V,) with ``weight_sum`` its fp32 0-d sum; with
    ``z_rows`` (fp32) and ``argmax_rows`` (int64), the statistics per row."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    stats = z_rows is not None
    if n_cols == 0:
        row_losses.fill_(float("nan"))  # no class to be right about: every valid row is out of range
        row_losses.masked_fill_(target == options.ignore_index, 0.0)
        if stats:
            z_rows.zero_()
            argmax_rows.fill_(-1)
        return
    require_launchable(logits.device)
    compute_grad = grad is not None
    has_weight, smoothing = class_weight is not None, options.label_smoothing > 0.0
    # Tiles and memory multipliers: see MEMORY_MULTIPLIER and GRAD_MEMORY_MULTIPLIER above.
    plan = _rows_plan(logits.device.type, n_cols, compute_grad, has_weight and smoothing, stats)
    if compute_grad and grad.stride(1) != 1:
        raise RuntimeError("cross entropy: the gradient buffer must have unit column stride")
    unused = row_losses  # pointers of switched-off features are never read or written
    _cross_entropy_fwd_kernel[(plan.grid(n_rows),)](
        logits, target, class_weight if has_weight else unused, weight_sum if has_weight else unused, row_losses,
        z_rows if stats else unused, argmax_rows if stats else unused, grad if compute_grad else unused, scale,
        n_rows, n_cols, logits.stride(0), logits.stride(1), target.stride(0),
        class_weight.stride(0) if has_weight else 0, grad.stride(0) if compute_grad else 0,
        scale.stride(0) if scale.dim() else 0, options.ignore_index, float(options.label_smoothing),
        float(options.softcap) if options.capped else 1.0, float(options.lse_square_scale),
        HAS_SOFTCAP=options.capped, HAS_SMOOTHING=smoothing, HAS_Z_LOSS=options.lse_square_scale > 0.0,
        HAS_WEIGHT=has_weight, TOKEN_SCALING=options.use_token_scaling, STATS=stats, COMPUTE_GRAD=compute_grad,
        BLOCK_V=plan.block, ORDER_TARGET_STORE=logits.is_cuda, **plan.launch_options()
    )
