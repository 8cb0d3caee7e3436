"""GroupNorm: ``F.group_norm(x, num_groups, weight, bias, eps)`` for x (N, C, *), statistics in fp32.

x is viewed as N * G group rows of L = (C / G) * HW elements (HW: the product of the dims after C), each row a
(C / G, HW) block of channels; per group row, with K its first element,

    d = sum(x - K) / L,  xc = (x - K) - d  (= x - mean),  var = sum(xc^2) / L  (centred),
    y = xc * rsqrt(var + eps) * weight[c] + bias[c]   (weight 1 / bias 0 when absent), rounded once.

The shift by K keeps the statistics accurate when |mean| >> std: x - K is exact for x within a factor 2 of K,
and the mean is never rounded to fp32 on its own (at mean 1000, std 1 the result is within 2e-7 of float64,
where an fp32 mean, torch's own included, leaves 4e-5).

Backward, with xhat = (x - mean) * rstd and g = dy * weight[c], means over the group:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight[c] = sum over n and HW of dy * xhat,  dbias[c] = sum
    of dy
mean and rstd are recomputed from x. Each group row (n, g) writes its channels' shares of dweight and dbias to
row n of an (N, C) fp32 buffer (every element written exactly once: no atomics, no read-modify-write); the host
sums it over n in a fixed order (deterministic). That buffer holds N * C floats, at most x's element count.

Tiles are (BLOCK_C channels, BLOCK_HW positions) of one group (``plan_groups``): a weight/bias chunk is a BLOCK_C
vector broadcast along the positions. A group that fits one tile is read once (forward) / once each of x and dy
(backward). A larger group is walked in chunks twice: once for its statistics, once to normalise (forward) / for
dx and the parameter gradients (backward). The statistics pass stays centred without a second walk: each chunk,
held in full, gives its own mean m_c (of x - K) and centred sum sum((x - K - m_c)^2) (and, backward, sum(g) and
sum(g * (x - K - m_c))), and these merge into the running ones exactly (Chan et al.'s pairwise update):

    n' = n + n_c,  mean' = mean + (m_c - mean) n_c / n',  M2' = M2 + M2_c + (m_c - mean)^2 n n_c / n',
    T' = T - (mean' - mean) G + T_c + (m_c - mean') G_c,  G' = G + G_c   (T = sum(g * (x - K - mean)), G = sum(g)),

every term a centred quantity (no E[x^2] - E[x]^2 cancellation, whatever K is).

CUDA: groups up to ``CUDA_WHOLE_GROUP_MAX`` elements (per direction) stay whole in registers; larger ones are
walked in the tiles of ``CUDA_GROUP_PLANS`` on a grid of a few programs per SM (persistent: a group's second walk
may then find it in L2), and the walks load the next chunk before computing this one (``PREFETCH``: Triton does
not pipeline these loops). The NPU and CPU take the UB manager's tiles, one program per vector core, no prefetch.

Memory analysis (fp32 elements per (BLOCK_C x BLOCK_HW) tile; the channel parameters are BLOCK_C vectors):
- forward: x as loaded, x - K, x - mean, its square, y before the cast (the looped path: the statistics walk holds
  x, x - K, x - m_c and its square) -> 5.0 (Ascend910B3: 192 KiB * 0.8 / (5 * 4 B) = 7864 -> 4096 elements);
- backward: x, dy, xhat, g, g * xhat, dy * xhat, dx (the statistics walk: x, dy, x - K, g, x - K - m_c, its
  square, g times it) -> 8.0 (4915 -> 4096 elements).
The CUDA-only prefetch holds one more tile of each input as stored (CUDA's tile budget is registers, not a UB).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._norm import as_rows, check_eps, check_grad, load_param, param_row, sum_partials
from ._triton import (COMPUTE_DTYPE_SIZE, check_float_tensor, grid_stride, launched_kernel, new_like, program_start,
                      require_launchable)

FORWARD_MEMORY_MULTIPLIER = 5.0
BACKWARD_MEMORY_MULTIPLIER = 8.0
MAX_GROUP_ELEMENTS = 2**31 - 1  # offsets inside a group row are int32

# CUDA: groups of up to this many elements are one tile (registers, 16 warps from 8192 elements): x read once.
# The backward holds about twice the live tensors (x, dy, g, xhat, dx), so half the elements (16 fp32 values of
# each per thread on 16 warps, as _norm's wide backward rows).
CUDA_WHOLE_GROUP_MAX = {"forward": 16384, "backward": 8192}


class CudaGroupPlan(NamedTuple):
    """CUDA launch of a kernel's looped path (groups larger than ``CUDA_WHOLE_GROUP_MAX``): ``tile`` elements per
    chunk (positions first), ``warps``, ``programs_per_sm`` (None: one program per group row) and ``prefetch``."""
    tile: int
    warps: int
    programs_per_sm: Optional[int]
    prefetch: bool


# Measured on an H100 (benchmarks/results/round19/group_norm_probe.py: x (32, 512, 64, 64) bf16, 32 groups of
# 65536 elements; kernels alone): forward 8192-element chunks on 8 warps, one program per SM, 127 us (0.72 of
# copy; the old three walks 199 us, the 4096/8-warp/2-per-SM first guess 165 us, torch.compile's whole call
# 158 us); backward 2048-element chunks on 4 warps, 4 programs per SM, 250 us (the old kernels 306 us; 4096 on 8
# warps 301 us). A few programs per SM keep few groups in flight, so a group's second walk finds it in L2; the
# prefetch keeps two chunks of loads in flight per program.
CUDA_GROUP_PLANS = {
    "forward": CudaGroupPlan(tile=8192, warps=8, programs_per_sm=1, prefetch=True),
    "backward": CudaGroupPlan(tile=2048, warps=4, programs_per_sm=4, prefetch=True),
}


class GroupTiles(NamedTuple):
    block_c: int  # BLOCK_C: channels per tile
    block_hw: int  # BLOCK_HW: positions per tile
    whole: bool  # a group fits one tile
    grid: int
    options: dict
    prefetch: bool  # looped path: load the next chunk while computing this one (CUDA)


@memoised_plan
def plan_groups(device_type: str, n_groups: int, channels: int, positions: int,
                memory_multiplier: float) -> GroupTiles:
    """Tiles and grid for ``n_groups`` group rows of ``channels`` x ``positions``: the positions first (as many as
    fit, up to all of them), then as many channels of that width as fit. One group row per program at a time."""
    if device_type == "cuda":
        return _plan_groups_cuda(n_groups, channels, positions, memory_multiplier)
    spatial = plan_launch(device_type, TileRequest(memory_multiplier, ((positions,),), (0,), COMPUTE_DTYPE_SIZE))
    block_hw = spatial.block
    chans = plan_launch(device_type, TileRequest(memory_multiplier, ((channels, block_hw),), (0,),
                                                 COMPUTE_DTYPE_SIZE))
    block_c = chans.block
    whole = block_hw >= positions and block_c >= channels
    return GroupTiles(block_c, block_hw, whole, chans.grid(n_groups), chans.launch_options(), False)


def _plan_groups_cuda(n_groups: int, channels: int, positions: int, memory_multiplier: float) -> GroupTiles:
    """Whole groups up to ``CUDA_WHOLE_GROUP_MAX`` elements (padded to powers of two), else the looped path's
    ``CUDA_GROUP_PLANS`` entry; forward or backward by the multiplier."""
    direction = "backward" if memory_multiplier == BACKWARD_MEMORY_MULTIPLIER else "forward"
    pow_hw, pow_c = triton.next_power_of_2(positions), triton.next_power_of_2(channels)
    if pow_hw * pow_c <= CUDA_WHOLE_GROUP_MAX[direction]:
        spatial = plan_launch("cuda", TileRequest(memory_multiplier, ((positions,),), (0,), COMPUTE_DTYPE_SIZE,
                                                  cuda_max_block=pow_hw))
        chans = plan_launch("cuda", TileRequest(memory_multiplier, ((channels, pow_hw),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=pow_c))
        return GroupTiles(chans.block, spatial.block, True, chans.grid(n_groups), chans.launch_options(), False)
    entry = CUDA_GROUP_PLANS[direction]
    block_hw = min(pow_hw, entry.tile)
    block_c = min(pow_c, max(1, entry.tile // block_hw))
    # the plan's tiles are the ones above (cuda_max_block lifts the budget's), its warps and grid the entry's
    plan = plan_launch("cuda", TileRequest(memory_multiplier, ((channels, block_hw),), (0,), COMPUTE_DTYPE_SIZE,
                                           cuda_num_warps=entry.warps, cuda_max_block=block_c,
                                           cuda_programs_per_sm=entry.programs_per_sm))
    return GroupTiles(min(plan.block, block_c), block_hw, False, plan.grid(n_groups), plan.launch_options(),
                      entry.prefetch)


@triton.jit
def _total(t):
    return tl.sum(tl.sum(t, axis=1), axis=0)


@triton.jit
def _chunk(t, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """Chunk ``t`` of a group row walked channels-major: (offsets in the row, mask, channel ids, element count).
    Past the last chunk every channel id is past ``channels``: all masked."""
    c = (t // n_hw) * BLOCK_C
    h = (t % n_hw) * BLOCK_HW
    chans = c + ch_ids
    mask = (chans < channels) & (h + hw_ids < positions)
    count = tl.minimum(channels - c, BLOCK_C) * tl.minimum(positions - h, BLOCK_HW)
    return chans * positions + h + hw_ids, mask, chans, count


@triton.jit
def _group_moments(x_row, dy_row, w_ptr, ch0, shift, ch_ids, hw_ids, channels, positions, HAS_WEIGHT: tl.constexpr,
                   GRAD: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """One walk over a group row's chunks: (mean of x - K, sum((x - mean)^2), and with ``GRAD`` sum(g) and
    sum(g * (x - mean)), g = dy * weight), each chunk's centred sums merged into the running ones (module
    docstring)."""
    n_hw = tl.cdiv(positions, BLOCK_HW)
    n_chunks = tl.cdiv(channels, BLOCK_C) * n_hw
    mean = 0.0
    m2 = 0.0
    sum_g = 0.0
    sum_gxc = 0.0
    seen = tl.program_id(0) * 0  # an int32 tensor on every flavour (the interpreter too)
    if PREFETCH:  # chunk 0's loads (each iteration then starts the next chunk's)
        offs, mask, chans, count = _chunk(0, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
        x_next = tl.load(x_row + offs, mask=mask, other=0.0)
        if GRAD:
            dy_next = tl.load(dy_row + offs, mask=mask, other=0.0)
    for t in tl.range(0, n_chunks):
        offs, mask, chans, count = _chunk(t, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
        if PREFETCH:
            x = x_next.to(tl.float32)
            n_offs, n_mask, n_chans, n_count = _chunk(t + 1, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C,
                                                      BLOCK_HW)
            x_next = tl.load(x_row + n_offs, mask=n_mask, other=0.0)  # all masked past the last chunk
            if GRAD:
                dy = dy_next.to(tl.float32)
                dy_next = tl.load(dy_row + n_offs, mask=n_mask, other=0.0)
        else:
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            if GRAD:
                dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
        xs = tl.where(mask, x - shift, 0.0)
        total = seen + count
        weight_c = count.to(tl.float32) / total.to(tl.float32)  # n_c / n'
        mean_c = _total(xs) / count.to(tl.float32)
        xc = tl.where(mask, xs - mean_c, 0.0)
        delta = mean_c - mean
        new_mean = mean + delta * weight_c
        m2 += _total(xc * xc) + delta * delta * (seen.to(tl.float32) * weight_c)
        if GRAD:
            g = dy * load_param(w_ptr, ch0 + chans, chans < channels, 1.0, HAS_WEIGHT)
            g_c = _total(g)
            sum_gxc += _total(g * xc) + (mean_c - new_mean) * g_c - (new_mean - mean) * sum_g
            sum_g += g_c
        mean = new_mean
        seen = total
    return mean, m2, sum_g, sum_gxc


@launched_kernel(do_not_specialize=["n_rows"])
def _group_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, num_groups, channels, positions, x_stride, eps,
                           HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, WHOLE: tl.constexpr,
                           PREFETCH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """``channels``: channels per group; ``positions``: HW; one group row (n, g) per iteration."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    ch_ids = tl.arange(0, BLOCK_C)[:, None]
    hw_ids = tl.arange(0, BLOCK_HW)[None, :]
    size = channels * positions
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride
        y_row = y_ptr + row * size
        ch0 = (row % num_groups) * channels
        shift = tl.load(x_row).to(tl.float32)
        if WHOLE:  # the group in one tile: x read once
            ch_ok = ch_ids < channels
            mask = ch_ok & (hw_ids < positions)
            offs = ch_ids * positions + hw_ids
            xs = tl.where(mask, tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
            xc = tl.where(mask, xs - _total(xs) / size, 0.0)
            rstd = 1.0 / tl.sqrt(_total(xc * xc) / size + eps)
            w = load_param(w_ptr, ch0 + ch_ids, ch_ok, 1.0, HAS_WEIGHT)
            b = load_param(b_ptr, ch0 + ch_ids, ch_ok, 0.0, HAS_BIAS)
            tl.store(y_row + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        else:  # the statistics in one walk over the group's chunks, then a walk to normalise
            d, m2, unused_g, unused_gxc = _group_moments(x_row, x_row, w_ptr, ch0, shift, ch_ids, hw_ids, channels,
                                                         positions, HAS_WEIGHT, False, PREFETCH, BLOCK_C, BLOCK_HW)
            rstd = 1.0 / tl.sqrt(m2 / size + eps)
            n_hw = tl.cdiv(positions, BLOCK_HW)
            n_chunks = tl.cdiv(channels, BLOCK_C) * n_hw
            if PREFETCH:
                offs, mask, chans, count = _chunk(0, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
                x_next = tl.load(x_row + offs, mask=mask, other=0.0)
            for t in tl.range(0, n_chunks):
                offs, mask, chans, count = _chunk(t, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    n_offs, n_mask, n_chans, n_count = _chunk(t + 1, n_hw, ch_ids, hw_ids, channels, positions,
                                                              BLOCK_C, BLOCK_HW)
                    x_next = tl.load(x_row + n_offs, mask=n_mask, other=0.0)
                else:
                    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                ch_ok = chans < channels
                w = load_param(w_ptr, ch0 + chans, ch_ok, 1.0, HAS_WEIGHT) * rstd
                b = load_param(b_ptr, ch0 + chans, ch_ok, 0.0, HAS_BIAS)
                tl.store(y_row + offs, (((x - shift) - d) * w + b).to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "dy_stride"])
def _group_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, num_groups, channels, positions,
                           dy_stride, x_stride, eps, HAS_WEIGHT: tl.constexpr, WHOLE: tl.constexpr,
                           PREFETCH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """dx (module docstring), and group row (n, g)'s shares of dweight and dbias into row n of dw_ptr / db_ptr
    (N, C) at the group's channels, fp32."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    ch_ids = tl.arange(0, BLOCK_C)[:, None]
    hw_ids = tl.arange(0, BLOCK_HW)[None, :]
    p_ids = tl.arange(0, BLOCK_C)
    size = channels * positions
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride
        dy_row = dy_ptr + row * dy_stride
        dx_row = dx_ptr + row * size
        ch0 = (row % num_groups) * channels
        p_off = (row // num_groups) * (num_groups * channels) + ch0  # (n, first channel of g) in the (N, C) buffers
        shift = tl.load(x_row).to(tl.float32)
        if WHOLE:
            ch_ok = ch_ids < channels
            mask = ch_ok & (hw_ids < positions)
            offs = ch_ids * positions + hw_ids
            xs = tl.where(mask, tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, xs - _total(xs) / size, 0.0)
            rstd = 1.0 / tl.sqrt(_total(xc * xc) / size + eps)
            xhat = xc * rstd
            g = dy * load_param(w_ptr, ch0 + ch_ids, ch_ok, 1.0, HAS_WEIGHT)
            mean_g = _total(g) / size
            mean_gx = _total(g * xhat) / size
            dx = (g - mean_g - xhat * mean_gx) * rstd
            tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            tl.store(dw_ptr + p_off + p_ids, tl.sum(dy * xhat, axis=1), mask=p_ids < channels)
            tl.store(db_ptr + p_off + p_ids, tl.sum(dy, axis=1), mask=p_ids < channels)
        else:  # the statistics and sum(g), sum(g * (x - mean)) in one walk, then dx and the parameter gradients
            d, m2, sum_g, sum_gxc = _group_moments(x_row, dy_row, w_ptr, ch0, shift, ch_ids, hw_ids, channels,
                                                   positions, HAS_WEIGHT, True, PREFETCH, BLOCK_C, BLOCK_HW)
            rstd = 1.0 / tl.sqrt(m2 / size + eps)
            mean_g = sum_g / size
            mean_gx = sum_gxc * rstd / size
            n_hw = tl.cdiv(positions, BLOCK_HW)
            n_chunks = tl.cdiv(channels, BLOCK_C) * n_hw
            dw_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
            db_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
            if PREFETCH:
                offs, mask, chans, count = _chunk(0, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
                x_next = tl.load(x_row + offs, mask=mask, other=0.0)
                dy_next = tl.load(dy_row + offs, mask=mask, other=0.0)
            for t in tl.range(0, n_chunks):
                offs, mask, chans, count = _chunk(t, n_hw, ch_ids, hw_ids, channels, positions, BLOCK_C, BLOCK_HW)
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    dy = dy_next.to(tl.float32)
                    n_offs, n_mask, n_chans, n_count = _chunk(t + 1, n_hw, ch_ids, hw_ids, channels, positions,
                                                              BLOCK_C, BLOCK_HW)
                    x_next = tl.load(x_row + n_offs, mask=n_mask, other=0.0)
                    dy_next = tl.load(dy_row + n_offs, mask=n_mask, other=0.0)
                else:
                    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                    dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
                w = load_param(w_ptr, ch0 + chans, chans < channels, 1.0, HAS_WEIGHT)
                xhat = tl.where(mask, (x - shift) - d, 0.0) * rstd
                dx = (dy * w - mean_g - xhat * mean_gx) * rstd
                tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                dw_acc += tl.sum(dy * xhat, axis=1)
                db_acc += tl.sum(dy, axis=1)
                # the channel block's last chunk: its shares are complete
                c = (t // n_hw) * BLOCK_C
                last = (p_ids * 0 + t % n_hw) == n_hw - 1  # as a vector: a scalar mask is no mask to the interpreter
                tl.store(dw_ptr + p_off + c + p_ids, dw_acc, mask=(c + p_ids < channels) & last)
                tl.store(db_ptr + p_off + c + p_ids, db_acc, mask=(c + p_ids < channels) & last)
                dw_acc = tl.where(last, 0.0, dw_acc)
                db_acc = tl.where(last, 0.0, db_acc)


def check_group_norm_inputs(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                            num_groups, eps) -> None:
    check_float_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must have at least 2 dimensions (N, C, *), got shape {tuple(x.shape)}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, torch.SymInt)):
        raise TypeError(f"num_groups must be an int, got {type(num_groups).__name__}")
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    channels = x.shape[1]
    if channels % num_groups != 0:
        raise ValueError(f"x's channel count {channels} (dim 1) must be divisible by num_groups={num_groups}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        check_float_tensor(name, param)
        if param.dim() != 1 or param.shape[0] != channels:
            raise ValueError(f"{name} must have shape ({channels},) (x's dim 1), got {tuple(param.shape)}")
        if param.device != x.device:
            raise RuntimeError(f"{name} must be on the device of x ({x.device}), got {param.device}")
    check_eps(eps)


def _group_rows(x: torch.Tensor, num_groups: int) -> Tuple[int, int]:
    """(channels per group, positions per channel) of x (N, C, *)."""
    positions = math.prod(x.shape[2:])
    size = x.shape[1] // num_groups * positions
    if size > MAX_GROUP_ELEMENTS:
        raise ValueError(f"a group of {size} elements is larger than group_norm supports ({MAX_GROUP_ELEMENTS})")
    return x.shape[1] // num_groups, positions


def group_norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                       num_groups: int = 1, eps: float = 1e-5) -> torch.Tensor:
    check_group_norm_inputs(x, weight, bias, num_groups, eps)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    channels, positions = _group_rows(x, num_groups)
    x2, weight, bias = as_rows(x, channels * positions), param_row(weight), param_row(bias)
    n_rows = x2.shape[0]
    tiles = plan_groups(x.device.type, n_rows, channels, positions, FORWARD_MEMORY_MULTIPLIER)
    _group_norm_fwd_kernel[(tiles.grid,)](
        x2, weight if weight is not None else x2, bias if bias is not None else x2, y, n_rows, num_groups, channels,
        positions, x2.stride(0), float(eps), HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        WHOLE=tiles.whole, PREFETCH=tiles.prefetch, BLOCK_C=tiles.block_c, BLOCK_HW=tiles.block_hw, **tiles.options
    )
    return y


def group_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                        bias: Optional[torch.Tensor], num_groups: int,
                        eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight, grad_bias); the parameter gradients are computed even for an absent parameter (the
    autograd formula drops them), in the parameter's dtype, or x's when it is absent."""
    check_group_norm_inputs(x, weight, bias, num_groups, eps)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    return launch_group_norm_backward(grad_out, x, weight, bias, num_groups, eps)


def launch_group_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                               bias: Optional[torch.Tensor], num_groups: int,
                               eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``group_norm_backward`` without its input checks, for the autograd formula's plain eager calls."""
    n_channels = x.shape[1]
    dx = new_like(x)
    w_dtype = weight.dtype if weight is not None else x.dtype
    b_dtype = bias.dtype if bias is not None else x.dtype
    if x.numel() == 0:  # sums over nothing
        return (dx, torch.zeros(n_channels, dtype=w_dtype, device=x.device),
                torch.zeros(n_channels, dtype=b_dtype, device=x.device))
    require_launchable(x.device)
    channels, positions = _group_rows(x, num_groups)
    x2, dy2, weight = as_rows(x, channels * positions), as_rows(grad_out, channels * positions), param_row(weight)
    n_rows = x2.shape[0]
    tiles = plan_groups(x.device.type, n_rows, channels, positions, BACKWARD_MEMORY_MULTIPLIER)
    partials = torch.empty((2, x.shape[0], n_channels), dtype=torch.float32, device=x.device)
    _group_norm_bwd_kernel[(tiles.grid,)](
        dy2, x2, weight if weight is not None else x2, dx, partials[0], partials[1], n_rows, num_groups, channels,
        positions, dy2.stride(0), x2.stride(0), float(eps), HAS_WEIGHT=weight is not None, WHOLE=tiles.whole,
        PREFETCH=tiles.prefetch, BLOCK_C=tiles.block_c, BLOCK_HW=tiles.block_hw, **tiles.options
    )
    return (dx, *sum_partials(partials, (w_dtype, b_dtype)))
