"""How sparsemax's kernels see x: the tile layouts and the launch plan (``npu_ops/sparsemax.py`` holds the kernels).

x is viewed as (pre, n, post) around the reduced dim n. Every tile's last axis has unit stride, because
triton-ascend turns a load along a strided axis into a gather (the Ascend check measured 256 UB bytes per element
for one) and pads a last axis narrower than 32 bytes to 32 (a 4-wide fp32 axis doubled the tile):
- rows (``rows_last`` False): (BLOCK_R rows, BLOCK_N columns) of a (rows, n) view with unit column stride, as the
  norms' tiles. The last dim (post == 1) is this; so is any dim whose trailing size is below ``SPLIT_MIN_RUN`` or
  whose layout already puts n innermost: ``kernel_view`` then moves n last (a view when the layout allows, else a
  copy) and the launcher writes the result back into x's layout;
- split (``rows_last`` True, post >= ``SPLIT_MIN_RUN``): (BLOCK_N columns of stride post, BLOCK_R >= 16 consecutive
  positions of the trailing dims, stride 1); a task is (index in pre, block of positions); reductions along axis 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._norm import CUDA_WHOLE_ROW_MAX, CudaWideRows, plan_rows
from ._triton import COMPUTE_DTYPE_SIZE, cdiv

# CUDA whole rows of 8192+ columns: one row per program on 8 warps (softmax's choice; not measured for sparsemax).
CUDA_WIDE_ROWS = (CudaWideRows(min_cols=8192, rows=1, warps=8),)
# The split layout: trailing dims of at least this many elements, tiles at least this wide (64 bytes in fp32).
SPLIT_MIN_RUN = 16


@triton.jit
def tile_offsets(rows, cols, row_stride, col_stride, ROWS_LAST: tl.constexpr):
    """Element offsets of a tile: (BLOCK_R, BLOCK_N) with the columns last, or (BLOCK_N, BLOCK_R) with the rows last
    (``ROWS_LAST``: the reduced dim is not the last one, and consecutive rows are adjacent in memory)."""
    if ROWS_LAST:
        offsets = cols[:, None] * col_stride + rows[None, :] * row_stride
    else:
        offsets = rows[:, None] * row_stride + cols[None, :] * col_stride
    return offsets


@triton.jit
def tile_mask(rows, cols, n_rows, n_cols, ROWS_LAST: tl.constexpr):
    if ROWS_LAST:
        mask = (cols[:, None] < n_cols) & (rows[None, :] < n_rows)
    else:
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return mask


@triton.jit
def tile_zeros(BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ROWS_LAST: tl.constexpr):
    if ROWS_LAST:
        zeros = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
    else:
        zeros = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    return zeros


@triton.jit
def row_zeros(BLOCK_R: tl.constexpr, ROWS_LAST: tl.constexpr):
    """A per-row value shaped to broadcast against the tile (what a reduction with keep_dims gives)."""
    if ROWS_LAST:
        zeros = tl.zeros((1, BLOCK_R), dtype=tl.float32)
    else:
        zeros = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    return zeros


class SparsemaxTiles(NamedTuple):
    block_rows: int  # BLOCK_R
    block_cols: int  # BLOCK_N (a power of two >= n_cols for whole rows)
    whole_row: bool
    rows_last: bool  # the split layout: tiles (BLOCK_N, BLOCK_R), rows adjacent in memory
    grid: int
    n_tasks: int
    tasks_per_outer: int
    options: dict


@memoised_plan
def plan_sparsemax(device_type: str, pre: int, n_cols: int, post: int, memory_multiplier: float) -> SparsemaxTiles:
    """Tiles for a kernel view (pre, n_cols, post) (module docstring). post == 1: the norms' row plan
    (``plan_rows``) over pre rows. post >= SPLIT_MIN_RUN: the split layout, BLOCK_R >= SPLIT_MIN_RUN."""
    if post == 1:
        tiles = plan_rows(device_type, pre, n_cols, memory_multiplier, persistent=False, cuda_wide_rows=CUDA_WIDE_ROWS)
        tasks = cdiv(pre, tiles.block_rows)
        return SparsemaxTiles(tiles.block_rows, tiles.block_cols, tiles.whole_row, False, tiles.grid, tasks, tasks,
                              tiles.options)
    run = SPLIT_MIN_RUN
    plan = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols, run),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=CUDA_WHOLE_ROW_MAX // run))
    block_cols, block_rows = plan.block, run
    if block_cols >= n_cols:  # whole rows: more of them per tile where the budget allows and every program stays busy
        wanted = pre * post if plan.max_programs is None else cdiv(pre * post, plan.max_programs)
        plan = plan_launch(device_type, TileRequest(memory_multiplier, ((min(max(wanted, run), post), block_cols),),
                                                    (0,), COMPUTE_DTYPE_SIZE))
        block_rows = max(plan.block, run)
    tasks_per_outer = cdiv(post, block_rows)
    n_tasks = pre * tasks_per_outer
    return SparsemaxTiles(block_rows, block_cols, block_cols >= n_cols, True, plan.grid(n_tasks), n_tasks,
                          tasks_per_outer, plan.launch_options())


def kernel_view(t: torch.Tensor, dim: int, as_rows: bool) -> torch.Tensor:
    """``t`` as the kernels read it: (pre, n, post) around ``dim`` in the split layout, or (rows, n, 1) with n moved
    last for the rows layout (``as_rows``); the tile's last axis with unit stride (a view whenever the layout allows,
    else a copy)."""
    if t.dim() == 0:
        return t.reshape(1, 1, 1)
    t3 = t.reshape(math.prod(t.shape[:dim]), t.shape[dim], math.prod(t.shape[dim + 1:]))
    if as_rows:
        pre, n, post = t3.shape
        t3 = t3.transpose(1, 2).reshape(pre * post, n, 1)
        fast = 1
    else:
        fast = 2
    return t3 if t3.stride(fast) == 1 or t3.shape[fast] == 1 else t3.contiguous()


def uses_rows(t: torch.Tensor, dim: int, by_layout: bool) -> bool:
    """Whether the rows layout serves the reduction of ``t`` over ``dim``: the last dim, trailing dims smaller than
    ``SPLIT_MIN_RUN``, or (``by_layout``) a tensor stored with ``dim`` innermost."""
    if t.dim() == 0:
        return True
    post = math.prod(t.shape[dim + 1:])
    if post < SPLIT_MIN_RUN:
        return True
    return by_layout and t.stride(dim) == 1 and t.stride(-1) != 1


def strides(t3: torch.Tensor, tiles: SparsemaxTiles) -> Tuple[int, int, int]:
    """(outer, row, column) strides of a kernel view for the kernels' tasks."""
    if tiles.rows_last:
        return t3.stride(0), t3.stride(2), t3.stride(1)
    return 0, t3.stride(0), t3.stride(1)
