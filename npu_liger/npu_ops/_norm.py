"""What the norm kernels (rms_norm.py, layer_norm.py) share: the row tiling plan and the input checks.

A norm reduces over the last dim of x viewed as (n_rows, n_cols). Two kernel paths, chosen by ``plan_rows``:
- whole rows: a row fits one tile, so a program takes a (BLOCK_R, BLOCK_N) tile of BLOCK_R whole rows, reads x
  once and writes y once (several narrow rows per tile, e.g. Qwen3's q/k norm over head_dim 128);
- looped rows (BLOCK_R = 1): a row wider than one tile is walked in BLOCK_N chunks, once per statistic and once
  more to normalise (the Ascend UB holds ~8K fp32 values of each live tensor; hidden 8192 and beyond loop).

Backward kernels produce the weight (and bias) gradient without atomics: each program accumulates its rows'
share in fp32 and writes one row of a (programs, n_cols) buffer; the host sums that buffer over programs (a
fixed-order reduction, so results are deterministic). The grid is therefore persistent on every backend: the
vector cores on Ascend, ``CUDA_PROGRAMS_PER_SM`` programs per SM on CUDA.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..tiling import TileRequest, plan_launch
from ._triton import COMPUTE_DTYPE_SIZE, check_float_tensor

# CUDA keeps rows up to this many elements whole in one program (registers, 8-16 warps): one read of x per
# norm instead of one per pass. Wider rows loop as on Ascend.
CUDA_WHOLE_ROW_MAX = 16384
# CUDA backward grid: enough resident programs to hide latency, few enough that the (programs, n_cols) fp32
# weight-gradient buffer stays small (264 x 8192 x 4 B = 8.6 MB on an H200).
CUDA_PROGRAMS_PER_SM = 2
# CUDA warps for a one-row tile of at least this many columns: 16 (32 values of each live tensor per thread at
# 16384 instead of 64, which would spill).
CUDA_WIDE_ROW = 8192


class RowTiles(NamedTuple):
    block_rows: int  # BLOCK_R: rows per tile (1 when the row loops)
    block_cols: int  # BLOCK_N: columns per tile (a power of two >= n_cols for whole rows)
    whole_row: bool
    grid: int  # programs to launch
    options: dict  # launch options (num_warps on CUDA)


def plan_rows(device_type: str, n_rows: int, n_cols: int, memory_multiplier: float, persistent: bool) -> RowTiles:
    """Tiles and grid for a norm kernel whose memory analysis gives ``memory_multiplier`` live fp32 values per
    tile element. ``persistent``: the kernel keeps a per-program partial (backward), so the CUDA grid is capped
    too. Two requests: the columns first (does a whole row fit?), then how many whole rows fit one tile."""
    cuda = {"cuda_programs_per_sm": CUDA_PROGRAMS_PER_SM} if persistent else {}
    cols = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=CUDA_WHOLE_ROW_MAX, **cuda))
    block_cols = cols.block
    if block_cols < n_cols:
        return RowTiles(1, block_cols, False, cols.grid(n_rows), cols.launch_options())
    # Whole rows: as many per tile as the budget allows, but with a persistent grid no more than keeps every
    # program busy (8 rows over 40 vector cores must not become one tile of 8).
    wanted = n_rows if cols.max_programs is None else math.ceil(n_rows / cols.max_programs)
    warps = 16 if block_cols >= CUDA_WIDE_ROW else None  # None: the default rule by tile size
    rows = plan_launch(device_type, TileRequest(memory_multiplier, ((wanted, block_cols),), (0,),
                                                COMPUTE_DTYPE_SIZE, cuda_num_warps=warps, **cuda))
    block_rows = rows.block
    return RowTiles(block_rows, block_cols, True, rows.grid(math.ceil(n_rows / block_rows)), rows.launch_options())


def as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as (n_rows, n_cols) with unit column stride (a view when the layout allows, else a copy); rows are
    addressed through the row stride, which may be 0 (a gradient broadcast over rows)."""
    rows = t.reshape(-1, n_cols)
    return rows if rows.stride(1) == 1 else rows.contiguous()


def check_norm_input(name: str, x: torch.Tensor) -> None:
    check_float_tensor(name, x)
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (the normalised one), got a 0-d tensor")


def check_norm_param(name: str, param, x: torch.Tensor) -> None:
    """A weight or bias: 1-D of x's last size, a float dtype (may differ from x's), on x's device."""
    check_float_tensor(name, param)
    if param.dim() != 1 or param.shape[0] != x.shape[-1]:
        raise ValueError(f"{name} must have shape ({x.shape[-1]},) (x's last dim), got {tuple(param.shape)}")
    if param.device != x.device:
        raise RuntimeError(f"{name} must be on the device of x ({x.device}), got {param.device}")


def check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, torch.SymFloat, torch.SymInt)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if isinstance(eps, (int, float)) and not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_grad(name: str, grad: torch.Tensor, shape, dtype: torch.dtype, device: torch.device) -> None:
    check_float_tensor(name, grad)
    if grad.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(grad.shape)}")
    if grad.dtype != dtype:
        raise TypeError(f"{name} must be {dtype} (the forward output's dtype), got {grad.dtype}")
    if grad.device != device:
        raise RuntimeError(f"{name} must be on device {device}, got {grad.device}")
