"""What the norm kernels (rms_norm.py, layer_norm.py) share: the row tiling plan and the input checks.

A norm reduces over the last dim of x viewed as (n_rows, n_cols). Two kernel paths, chosen by ``plan_rows``:
- whole rows: a row fits one tile, so a program takes a (BLOCK_R, BLOCK_N) tile of BLOCK_R whole rows, reads x
  once and writes y once (several narrow rows per tile, e.g. Qwen3's q/k norm over head_dim 128);
- looped rows (BLOCK_R = 1): a row wider than one tile is walked in BLOCK_N chunks, once per statistic and once
  more to normalise (the Ascend UB holds ~8K fp32 values of each live tensor; hidden 8192 and beyond loop).

Backward kernels produce the weight (and bias) gradient without atomics: each program accumulates its rows'
share in fp32 and writes one row of a (programs, n_cols) buffer; ``sum_partials`` sums those buffers over
programs in a fixed order (deterministic results) and casts them to the parameters' dtypes, one launch for both
buffers (the weight's and the bias's) instead of a torch sum and a cast per buffer: on a slow host each launch is
tens of µs of a host-bound backward. The grid is therefore persistent on every backend: the
vector cores on Ascend, ``cuda_programs_per_sm(n_cols)`` programs per SM on CUDA.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._triton import COMPUTE_DTYPE_SIZE, check_float_tensor, grid_stride, launched_kernel, program_start

# CUDA keeps rows up to this many elements whole in one program (registers, 8-16 warps): one read of x per
# norm instead of one per pass. Wider rows loop as on Ascend.
CUDA_WHOLE_ROW_MAX = 16384
# CUDA backward grid (persistent), in programs per SM by row width: enough resident programs to hide memory
# latency, few enough that the (programs, n_cols) fp32 weight-gradient buffer stays small (on an H200
# 264 x 8192 x 4 B = 8.6 MB at 8192 columns, at most 1056 x 1024 x 4 B = 4.3 MB for narrow rows). Measured
# there, bf16, backward alone, 2 against 8 per SM: narrow rows starve at 2 (a few rows of 128-1024 columns per
# tile leave too few loads in flight): rms_norm 131072x128 (Qwen3's q norm) 61 -> 37 us, 524288x128
# 210 -> 110 us (0.45 -> 0.87 of copy), 65536x256 63 -> 42 us, 32768x1024 100 -> 73 us; layer_norm
# 74 -> 61, 242 -> 169, 79 -> 75, 116 -> 89 us. From 4096 columns 2 is best (rms_norm 8192x4096 60 us
# against 69 at 8, 16384x8192 214 against 230). 2048 columns were not measured and keep 2.
CUDA_NARROW_ROWS_MAX = 1024
CUDA_PROGRAMS_PER_SM = {"narrow": 8, "wide": 2}


def cuda_programs_per_sm(n_cols: int) -> int:
    """Programs per SM of a CUDA backward norm kernel's persistent grid (see above)."""
    return CUDA_PROGRAMS_PER_SM["narrow" if n_cols <= CUDA_NARROW_ROWS_MAX else "wide"]


class CudaWideRows(NamedTuple):
    """CUDA tiles for whole rows of at least ``min_cols`` columns: ``rows`` rows per program on ``warps`` warps
    (each kernel's measured best; narrower rows take the tile budget's rows and the default warps rule). ``rows``
    lifts the budget's choice (``TileRequest.cuda_max_block`` never lowers a tile), which at these widths is one
    row: 64 KiB x 0.8 / (4 x 4 B) = 3276 fp32 elements at the smallest multiplier, fewer than 4096 columns."""
    min_cols: int
    rows: int
    warps: int


# The backward kernels' wide rows (H200, bf16, persistent grid of 2 programs per SM, prefetching): 4 warps from
# 4096 columns (layer_norm 32768x4096: 204 us against 283 us on 8 warps; rms_norm 200 vs 197), 16 from 8192 (16
# values of each live tensor per thread, 32 at 16384; on 4 warps 8192-wide rows spill: 3.5-4.7 ms).
CUDA_BACKWARD_WIDE_ROWS = (CudaWideRows(min_cols=4096, rows=1, warps=4), CudaWideRows(min_cols=8192, rows=1, warps=16))
# CUDA forward kernels load the weight (and bias) row for every tile rather than once before the row loop: with
# an fp32 parameter row live across the loop the H200 forward at 8192 columns ran 1.2-1.4x slower depending on
# warps (rms_norm with Gemma's offset 161 us vs 134 us, layer_norm 185 us vs 135 us at 16384x8192); the
# per-tile reload hits L1/L2. The NPU keeps the row in the UB once (no measurement says otherwise there).
CUDA_PARAMS_PER_TILE = True
# CUDA backward kernels (persistent grid, whole rows) load the next tile's x and dy before computing this one:
# a program otherwise waits out each tile's load latency with nothing in flight (Triton does not pipeline the
# row loop: num_stages 1-3 measured identical). H200, bf16, backward alone: rms_norm 16384x8192 322 -> 205 us,
# layer_norm 336 -> 220 us, 32768x4096 277 -> 197 us / 298 -> 204 us (0.6-0.7 -> 0.86-0.97 of copy).
# Not on the NPU: two more tiles in the UB would halve its tile.
CUDA_PREFETCH = True


class RowTiles(NamedTuple):
    block_rows: int  # BLOCK_R: rows per tile (1 when the row loops)
    block_cols: int  # BLOCK_N: columns per tile (a power of two >= n_cols for whole rows)
    whole_row: bool
    grid: int  # programs to launch
    options: dict  # launch options (num_warps on CUDA)
    params_per_tile: bool  # forward kernels: load weight/bias for every tile instead of once (CUDA, see above)
    prefetch: bool  # persistent whole-row kernels: load the next tile while computing this one (CUDA, see above)


@memoised_plan
def plan_rows(device_type: str, n_rows: int, n_cols: int, memory_multiplier: float, persistent: bool,
              cuda_wide_rows: Tuple[CudaWideRows, ...] = CUDA_BACKWARD_WIDE_ROWS) -> RowTiles:
    """Tiles and grid for a norm kernel whose memory analysis gives ``memory_multiplier`` live fp32 values per
    tile element. ``persistent``: the kernel keeps a per-program partial (backward), so the CUDA grid is capped
    too. Two requests: the columns first (does a whole row fit?), then how many whole rows fit one tile.
    ``cuda_wide_rows``: the kernel's CUDA tiles for wide rows (the entry with the largest ``min_cols`` the row
    reaches applies)."""
    cuda = {"cuda_programs_per_sm": cuda_programs_per_sm(n_cols)} if persistent else {}
    cols = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_max_block=CUDA_WHOLE_ROW_MAX, **cuda))
    block_cols = cols.block
    if block_cols < n_cols:
        # the looped kernels load the parameters with every chunk anyway, and do not prefetch
        return RowTiles(1, block_cols, False, cols.grid(n_rows), cols.launch_options(), params_per_tile=True,
                        prefetch=False)
    # Whole rows: as many per tile as the budget allows, but with a persistent grid no more than keeps every
    # program busy (8 rows over 40 vector cores must not become one tile of 8).
    wanted = n_rows if cols.max_programs is None else math.ceil(n_rows / cols.max_programs)
    wide = [entry for entry in cuda_wide_rows if block_cols >= entry.min_cols]
    if wide:
        entry = max(wide, key=lambda e: e.min_cols)
        cuda.update(cuda_num_warps=entry.warps, cuda_max_block=entry.rows)
    rows = plan_launch(device_type, TileRequest(memory_multiplier, ((wanted, block_cols),), (0,),
                                                COMPUTE_DTYPE_SIZE, **cuda))
    block_rows = rows.block
    on_cuda = rows.backend == "cuda"
    return RowTiles(block_rows, block_cols, True, rows.grid(math.ceil(n_rows / block_rows)), rows.launch_options(),
                    CUDA_PARAMS_PER_TILE and on_cuda, CUDA_PREFETCH and on_cuda and persistent)


@triton.jit
def load_param(ptr, offsets, mask, default, HAS: tl.constexpr):
    """A chunk of a per-column (or per-channel) weight or bias in fp32, or ``default`` everywhere when the
    parameter is absent (``HAS`` off)."""
    if HAS:
        p = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        p = tl.zeros(offsets.shape, dtype=tl.float32) + default
    return p


@triton.jit
def load_tile(ptr, rows, col_ids, n_rows, row_stride, col_mask):
    """A (BLOCK_R, BLOCK_N) tile of whole rows as stored (rows past ``n_rows`` read as 0)."""
    return tl.load(ptr + rows * row_stride + col_ids, mask=(rows < n_rows) & col_mask, other=0.0)


def as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as (n_rows, n_cols) with unit column stride (a view when the layout allows, else a copy); rows are
    addressed through the row stride, which may be 0 (a gradient broadcast over rows)."""
    rows = t.reshape(-1, n_cols)
    return rows if rows.stride(1) == 1 else rows.contiguous()


def param_row(param: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A weight or bias as the kernels read it, element ``c`` at ``ptr + c``: a strided or expanded view (a column
    of a matrix, ``ones(1).expand(C)``) is copied, C elements; a contiguous one is passed as it is."""
    return None if param is None else param.contiguous()


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


# ---- the parameter gradients' partials, summed over programs ----------------------------------------------------

# Partial rows added per step of the reduction, in a fixed order (the result does not depend on the tile plan's
# column block). Fixed, not tiled: the columns are what the UB manager tiles.
PARTIAL_ROWS_PER_STEP = 16
# Live fp32 values per (PARTIAL_ROWS_PER_STEP x BLOCK_N) tile element: the loaded tile, the masked load's
# select, the sum and the accumulator. bishengir-compile's UB plan agrees: one buffer at 16 x 1024 needs
# 2097152 bits (4 values an element) of 1572864, and two buffers fit at 16 x 512 (the temporaries are reused
# between them), so the multiplier does not grow with the buffers (Ascend910B3: 192 KiB * 0.8 / (4 * 16 * 4 B)
# = 614 -> 512 columns).
SUM_PARTIALS_MEMORY_MULTIPLIER = 4.0
# CUDA: columns per program, at most. The buffers are small (2 programs per SM x n_cols fp32 each), so the
# reduction is latency-bound; narrow column blocks give it enough programs (64 at 4096 columns).
CUDA_SUM_PARTIALS_MAX_COLS = 64


@launched_kernel(do_not_specialize=["n_partials"])
def _sum_partials_kernel(partials_ptr, out_ptr, second_out_ptr, n_partials, n_cols, TWO: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[c] = sum over p of partials[0, p, c] (and second_out from partials[1] when TWO), fp32 sums in a fixed
    order, stored in the outputs' dtypes."""
    p_ids = tl.arange(0, BLOCK_P)[:, None].to(tl.int64)
    col_ids = tl.arange(0, BLOCK_N)
    # n_partials may arrive as a constexpr 1 (Inductor's launches and wrap_triton's mutation analysis specialise
    # it), which has no .to(): widen it through a tensor
    second = partials_ptr + (tl.program_id(0) * 0 + n_partials).to(tl.int64) * n_cols
    for start in tl.range(program_start(BLOCK_N), n_cols, grid_stride(BLOCK_N)):
        cols = start + col_ids
        col_ok = cols < n_cols
        acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        second_acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        for p in tl.range(0, n_partials, BLOCK_P):
            rows = p + p_ids
            mask = (rows < n_partials) & col_ok[None, :]
            offsets = rows * n_cols + cols[None, :]
            acc += tl.load(partials_ptr + offsets, mask=mask, other=0.0)
            if TWO:
                second_acc += tl.load(second + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_ok)
        if TWO:
            tl.store(second_out_ptr + cols, tl.sum(second_acc, axis=0).to(second_out_ptr.dtype.element_ty),
                     mask=col_ok)


class PartialsTiles(NamedTuple):
    block_cols: int
    grid: int
    options: dict


@memoised_plan
def plan_sum_partials(device_type: str, n_cols: int) -> PartialsTiles:
    request = TileRequest(SUM_PARTIALS_MEMORY_MULTIPLIER, ((PARTIAL_ROWS_PER_STEP, n_cols),), (1,),
                          COMPUTE_DTYPE_SIZE, cuda_num_warps=4)
    plan = plan_launch(device_type, request)
    block_cols = plan.tiles[0][1]
    if plan.backend == "cuda":
        block_cols = min(block_cols, CUDA_SUM_PARTIALS_MAX_COLS)
    return PartialsTiles(block_cols, plan.grid(-(-n_cols // block_cols)), plan.launch_options())


def sum_partials(partials: torch.Tensor, dtypes: Tuple[torch.dtype, ...]) -> Tuple[torch.Tensor, ...]:
    """One (n_cols,) tensor per buffer of ``partials`` ((buffers, programs, n_cols) fp32, contiguous; one or two
    buffers), summed over programs in a fixed order and stored in that buffer's dtype from ``dtypes``. The
    results are separate tensors, never views of one."""
    buffers, n_partials, n_cols = partials.shape
    outs = tuple(torch.empty((n_cols,), dtype=dtype, device=partials.device) for dtype in dtypes)
    tiles = plan_sum_partials(partials.device.type, n_cols)
    _sum_partials_kernel[(tiles.grid,)](
        partials, outs[0], outs[-1], n_partials, n_cols, TWO=buffers == 2, BLOCK_P=PARTIAL_ROWS_PER_STEP,
        BLOCK_N=tiles.block_cols, **tiles.options
    )
    return outs
