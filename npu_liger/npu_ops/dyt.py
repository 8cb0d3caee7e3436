"""Dynamic Tanh (DyT) over the last dim: ``y = gamma * tanh(alpha * x) + beta`` for x (..., C), alpha one element,
gamma and beta (C,) (beta optional), computed in fp32 and rounded once, to x's dtype.

Backward, with t = tanh(alpha * x) and g = dy * gamma * (1 - t^2) (1 - t^2 from e^-2|alpha x| directly: from t it
cancels where tanh saturates, and dalpha sums those terms):
    dx = alpha * g,  dalpha = sum over all elements of g * x,  dgamma = sum over rows of dy * t,  dbeta = sum of dy
tanh is recomputed from x (the backward reads x anyway). The parameter gradients go through per-program fp32
partials summed in a fixed order (deterministic, no atomics): dgamma and dbeta by one ``_norm.sum_partials``
launch, dalpha by torch's sum.

tanh (``_tanh``, this op's own: one exponential and one reciprocal; the backward shares the exponential): with
e = e^-2|y| and r = 1 / (1 + e), 1 - t^2 = 4 e / (1 + e)^2, and t = r - e r (= (1 - e) r) with y's sign for
|y| >= 0.6 (there e <= 0.3: e's rounding reaches t damped, at most 0.66 of it), y + y^3 P(y^2) below (a degree-4
minimax P; 1 - e would cancel near 0). fp32 on the interpreter: tanh within 3.3 unit roundoffs of float64 over
[-12, 12] (the shared ``_triton.tanh``: 6.4, its far branch from 0.25 amplifying e's rounding 1.9x); 1 - t^2 as
``_triton.tanh_derivative`` computes it (within 5.5). In the CUDA backward the exponential and the reciprocals are
PTX's ex2.approx and rcp.approx (``CUDA_FAST_MATH_BACKWARD``; 2 and 1 ulp; the division they replace is Triton's
div.full, 2 ulp; denormal results kept: 1 - t^2 is 4 e there): with the rest of its work that kernel is bound by
instruction issue, not memory (round 19's probe, H100: 0.43 ms without, 0.31 ms with, both at 16384x8192 bf16).
The forward keeps tl.exp and the division on every backend: it measured at copy bandwidth with them (0.186 ms)
and slower with the PTX forms (0.200 ms, more registers).

Layout of the work (``plan_dyt``): x is viewed as (n_rows, C) and cut into (BLOCK_R, BLOCK_N) tiles. Program p owns
the column blocks ``p % col_programs, + col_programs, ...`` and, for each, walks the rows
``p // col_programs, + row_programs, ...`` (BLOCK_R rows at a time): gamma and beta are loaded once per column block,
the dgamma/dbeta/dalpha column sums stay in registers across the row loop (each tile's rows summed into them) and
are written once per column block to row ``p // col_programs`` of a (row_programs, C) buffer (dalpha summed over
the block's columns first: (row_programs, column blocks)). A row wider than one tile is split over column blocks
(no multi-pass loop is needed: the op is elementwise); narrow rows go several per tile.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile; gamma and beta rows are shared by the tile's rows):
- forward: x as loaded, x in fp32, y = alpha * x, and tanh's e, r, y^2, P, its near and far values and t, the
  result before the cast -> 10.0 (Ascend910B3: 192 KiB * 0.8 / (10 * 4 B) = 3932 -> 2048 elements per tile; the
  Ascend check found 4096 fitting fp32 only with multi-buffer off);
- backward: x, dy as loaded and in fp32, y, tanh's temporaries (as above), 4 e r^2, g, dx, the three products
  summed into the partials -> 12.0 (3276 -> 2048 elements).
CUDA ignores the budget (``CUDA_FORWARD_TILES`` / ``CUDA_BACKWARD_TILES``: tiles, warps and grid of each kernel);
``prefetch`` (the CUDA backward only) keeps the next tile's x and dy in registers besides.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, next_power_of_2, plan_launch
from ..tiling.launch import CUDA_MAX_GRID, backend_of, cuda_sm_count
from ._norm import (as_rows, check_grad, check_norm_input, check_norm_param, cuda_programs_per_sm, load_tile,
                    param_row, sum_partials)
from ._triton import (COMPUTE_DTYPE_SIZE, cdiv, check_float_tensor, launched_kernel, new_like, require_launchable)

FORWARD_MEMORY_MULTIPLIER = 10.0
BACKWARD_MEMORY_MULTIPLIER = 12.0

# tanh (module docstring): |y| below TANH_NEAR takes y + y^3 P(y^2), P(u) = P0 + P1 u + ... + P4 u^4, minimax for
# tanh's relative error on [0, 0.6] (7e-9 relative from P itself; 1.2 unit roundoffs in fp32 with the roundings).
TANH_NEAR = tl.constexpr(0.6)
TANH_P0 = tl.constexpr(-0.33333298563957214)
TANH_P1 = tl.constexpr(0.13331924378871918)
TANH_P2 = tl.constexpr(-0.05378388613462448)
TANH_P3 = tl.constexpr(0.020796174183487892)
TANH_P4 = tl.constexpr(-0.005895407870411873)
NEG_2_LOG2E = tl.constexpr(-2.885390081777927)  # e^-2|y| = 2^(|y| * NEG_2_LOG2E)

# CUDA backward: ex2.approx / rcp.approx for tanh's exponential and reciprocal (module docstring); off: tl.exp and a
# division, as on the NPU and the CPU and in every forward.
CUDA_FAST_MATH_BACKWARD = True


class CudaTiles(NamedTuple):
    """One kernel's CUDA launch (the tile budget is ignored): tiles of ``rows`` x ``cols`` (a narrower row takes
    next_pow2(C) columns and as many more rows as keep the tile's size), ``warps`` per program, a persistent grid of
    ``programs_per_sm`` programs per SM (None: one program per tile), ``prefetch`` (backward only): the row loop
    loads the next tile before computing this one (Triton does not pipeline it), ``maxnreg``: Triton's register
    cap, if any."""
    rows: int
    cols: int
    warps: int
    programs_per_sm: Optional[int]
    prefetch: bool
    maxnreg: Optional[int] = None


# Measured by round 19's probe (benchmarks/results/round19/dyt_probe.py; H100, x 16384x8192 bf16, whole calls).
# Forward: one program per tile; 4 rows share each program's gamma/beta loads and its index arithmetic: 0.186 ms
# (0.98 of copy; Liger-Kernel 0.185, torch.compile 0.185, the old 1 x 1024 tiles with the shared tanh 0.212). 2 or 8
# rows measured the same, wider tiles and persistent grids slower.
CUDA_FORWARD_TILES = CudaTiles(rows=4, cols=1024, warps=4, programs_per_sm=None, prefetch=False)
# Backward: persistent (per-program partials: 2 x (3 x SMs / 4 column blocks) x C fp32, 3.2 MB at 132 SMs, C 8192);
# 3 programs of 8 warps per SM on 2048-column rows, capped at 80 registers a thread so all three stay resident, each
# loading its next row while computing this one: forward+backward 0.505 ms against 0.54-0.76 for 4-10 programs per
# SM of 4 warps on 1024 columns and 0.98 for the old kernel (Liger-Kernel 0.96, torch.compile 1.21).
CUDA_BACKWARD_TILES = CudaTiles(rows=1, cols=2048, warps=8, programs_per_sm=3, prefetch=True, maxnreg=80)


class ColumnTiles(NamedTuple):
    block_rows: int  # BLOCK_R
    block_cols: int  # BLOCK_N
    col_programs: int  # programs sharing out the column blocks
    row_programs: int  # programs sharing out the rows of one column block (partial buffers have this many rows)
    options: dict  # launch options (num_warps on CUDA)
    prefetch: bool = False  # PREFETCH of the backward kernel (CUDA only; the forward has none)

    @property
    def grid(self) -> int:
        return self.col_programs * self.row_programs


@memoised_plan
def plan_dyt(device_type: str, n_rows: int, n_cols: int, memory_multiplier: float, persistent: bool,
             cuda_tiles: Optional[CudaTiles] = None) -> ColumnTiles:
    """Tiles and grid: the columns first (does a whole row fit one tile?), then as many whole rows per tile as
    the budget allows, but with a persistent grid no more than keeps every program busy. ``persistent``: the
    kernel keeps per-program partials (backward), so the CUDA grid is capped too. On CUDA ``cuda_tiles`` (the
    launchers pass ``CUDA_FORWARD_TILES`` / ``CUDA_BACKWARD_TILES``) decides instead (``plan_dyt_cuda``)."""
    if cuda_tiles is not None and backend_of(device_type) == "cuda":
        return plan_dyt_cuda(n_rows, n_cols, cuda_tiles, cuda_sm_count())
    cuda = {"cuda_programs_per_sm": cuda_programs_per_sm(n_cols)} if persistent else {}
    cols = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE, **cuda))
    block_cols = cols.block
    col_blocks = cdiv(n_cols, block_cols)
    block_rows, options = 1, cols.launch_options()
    if col_blocks == 1:
        wanted = n_rows if cols.max_programs is None else cdiv(n_rows, cols.max_programs)
        rows = plan_launch(device_type, TileRequest(memory_multiplier, ((wanted, block_cols),), (0,),
                                                    COMPUTE_DTYPE_SIZE, **cuda))
        block_rows, options = rows.block, rows.launch_options()
    programs = cols.grid(cdiv(n_rows, block_rows) * col_blocks)
    col_programs = min(col_blocks, programs)
    return ColumnTiles(block_rows, block_cols, col_programs, max(1, programs // col_programs), options)


def plan_dyt_cuda(n_rows: int, n_cols: int, tiles: CudaTiles, sm_count: int) -> ColumnTiles:
    """``plan_dyt`` on CUDA from ``tiles`` and the device's SM count (a plain function: the probe replays it)."""
    block_cols = min(next_power_of_2(n_cols), tiles.cols)
    block_rows = min(max(1, tiles.rows * tiles.cols // block_cols), next_power_of_2(n_rows))
    col_blocks = cdiv(n_cols, block_cols)
    programs = min(cdiv(n_rows, block_rows) * col_blocks, CUDA_MAX_GRID)
    if tiles.programs_per_sm is not None:
        programs = min(programs, tiles.programs_per_sm * sm_count)
    col_programs = min(col_blocks, programs)
    options = {"num_warps": tiles.warps} if tiles.maxnreg is None else {"num_warps": tiles.warps,
                                                                        "maxnreg": tiles.maxnreg}
    return ColumnTiles(block_rows, block_cols, col_programs, max(1, programs // col_programs), options,
                       tiles.prefetch)


@triton.jit
def _exp_neg2abs(y, CUDA_MATH: tl.constexpr):
    """e^-2|y| in [0, 1] (NaN for NaN). CUDA_MATH: ex2.approx of |y| * -2 log2(e), denormal results kept; else
    tl.exp (the same single rounding of the argument: the factor -2 is exact)."""
    if CUDA_MATH:
        e = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [tl.abs(y) * NEG_2_LOG2E],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        e = tl.exp(tl.abs(y) * -2.0)
    return e


@triton.jit
def _ratio(a, b, CUDA_MATH: tl.constexpr):
    """a / b for b in [1, 4] or NaN (a * rcp.approx(b) on CUDA_MATH: b is never denormal)."""
    if CUDA_MATH:
        q = a * tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [b], dtype=tl.float32,
                                          is_pure=True, pack=1)
    else:
        q = a / b
    return q


@triton.jit
def _tanh(y, e, r):
    """tanh(y) from e = e^-2|y| and r = 1 / (1 + e) (module docstring); NaN gives NaN, +-inf gives +-1, -0 gives
    -0."""
    u = y * y
    p = (((u * TANH_P4 + TANH_P3) * u + TANH_P2) * u + TANH_P1) * u + TANH_P0
    near = y + (y * u) * p
    far = r - e * r  # (1 - e) r, one FMA on CUDA
    far = tl.where(y < 0.0, -far, far)
    return tl.where(tl.abs(y) < TANH_NEAR, near, far)


@launched_kernel(do_not_specialize=["n_rows", "row_programs"])
def _dyt_fwd_kernel(x_ptr, alpha_ptr, gamma_ptr, beta_ptr, y_ptr, n_rows, n_cols, x_stride, col_programs,
                    row_programs, HAS_BETA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    row_start = (pid // col_programs).to(tl.int64) * BLOCK_R
    row_step = (pid * 0 + row_programs).to(tl.int64) * BLOCK_R
    alpha = tl.load(alpha_ptr).to(tl.float32)
    for c in tl.range((pid % col_programs) * BLOCK_N, n_cols, col_programs * BLOCK_N):
        cols = c + col_ids
        col_mask = cols < n_cols
        gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BETA:
            beta = tl.load(beta_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        for start in tl.range(row_start, n_rows, row_step):
            rows = start + row_ids
            y = load_tile(x_ptr, rows, cols, n_rows, x_stride, col_mask).to(tl.float32) * alpha
            e = _exp_neg2abs(y, False)
            out = gamma * _tanh(y, e, 1.0 / (e + 1.0))
            if HAS_BETA:
                out += beta
            tl.store(y_ptr + rows * n_cols + cols, out.to(y_ptr.dtype.element_ty), mask=(rows < n_rows) & col_mask)


@launched_kernel(do_not_specialize=["n_rows", "row_programs"])
def _dyt_bwd_kernel(dy_ptr, x_ptr, alpha_ptr, gamma_ptr, dx_ptr, dalpha_ptr, dgamma_ptr, dbeta_ptr, n_rows, n_cols,
                    dy_stride, x_stride, col_programs, row_programs, col_blocks, BLOCK_R: tl.constexpr,
                    BLOCK_N: tl.constexpr, CUDA_MATH: tl.constexpr, PREFETCH: tl.constexpr):
    """dx (module docstring); this program's shares of dgamma and dbeta into row ``pid // col_programs`` of
    dgamma_ptr / dbeta_ptr (row_programs, n_cols), of dalpha into (row_programs, col_blocks), fp32."""
    pid = tl.program_id(0)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    p_cols = tl.arange(0, BLOCK_N)
    row_prog = (pid // col_programs).to(tl.int64)
    row_start = row_prog * BLOCK_R
    row_step = (pid * 0 + row_programs).to(tl.int64) * BLOCK_R
    alpha = tl.load(alpha_ptr).to(tl.float32)
    for c in tl.range((pid % col_programs) * BLOCK_N, n_cols, col_programs * BLOCK_N):
        cols = c + col_ids
        col_mask = cols < n_cols
        gamma4 = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) * 4.0
        dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dbeta_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dalpha_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if PREFETCH:
            x_next = load_tile(x_ptr, row_start + row_ids, cols, n_rows, x_stride, col_mask)
            dy_next = load_tile(dy_ptr, row_start + row_ids, cols, n_rows, dy_stride, col_mask)
        for start in tl.range(row_start, n_rows, row_step):
            rows = start + row_ids
            if PREFETCH:
                x_in = x_next
                dy_in = dy_next
                x_next = load_tile(x_ptr, rows + row_step, cols, n_rows, x_stride, col_mask)
                dy_next = load_tile(dy_ptr, rows + row_step, cols, n_rows, dy_stride, col_mask)
            else:
                x_in = load_tile(x_ptr, rows, cols, n_rows, x_stride, col_mask)
                dy_in = load_tile(dy_ptr, rows, cols, n_rows, dy_stride, col_mask)
            x = x_in.to(tl.float32)
            dy = dy_in.to(tl.float32)
            y = x * alpha
            e = _exp_neg2abs(y, CUDA_MATH)
            d = e + 1.0
            g = dy * (gamma4 * _ratio(e, d * d, CUDA_MATH))  # 4 e / (1 + e)^2, the 4 in gamma4
            tl.store(dx_ptr + rows * n_cols + cols, (g * alpha).to(dx_ptr.dtype.element_ty),
                     mask=(rows < n_rows) & col_mask)
            dalpha_acc += tl.sum(g * x, axis=0)
            dgamma_acc += tl.sum(dy * _tanh(y, e, _ratio(1.0, d, CUDA_MATH)), axis=0)
            dbeta_acc += tl.sum(dy, axis=0)
        p_mask = c + p_cols < n_cols
        tl.store(dgamma_ptr + row_prog * n_cols + c + p_cols, dgamma_acc, mask=p_mask)
        tl.store(dbeta_ptr + row_prog * n_cols + c + p_cols, dbeta_acc, mask=p_mask)
        tl.store(dalpha_ptr + row_prog * col_blocks + c // BLOCK_N, tl.sum(dalpha_acc, axis=0))


def check_alpha(alpha: torch.Tensor, x: torch.Tensor) -> None:
    check_float_tensor("alpha", alpha)
    if alpha.dim() > 1 or alpha.numel() != 1:
        raise ValueError(f"alpha must be a one-element tensor of shape (1,) or (), got shape {tuple(alpha.shape)}")
    if alpha.device != x.device:
        raise RuntimeError(f"alpha must be on the device of x ({x.device}), got {alpha.device}")


def check_dyt_inputs(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: Optional[torch.Tensor]) -> None:
    check_norm_input("x", x)
    check_alpha(alpha, x)
    check_norm_param("gamma", gamma, x)
    if beta is not None:
        check_norm_param("beta", beta, x)


def dyt_forward(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
                beta: Optional[torch.Tensor] = None) -> torch.Tensor:
    check_dyt_inputs(x, alpha, gamma, beta)
    y = new_like(x)
    if x.numel() == 0:
        return y
    require_launchable(x.device)
    n_cols = x.shape[-1]
    x2, alpha, gamma, beta = as_rows(x, n_cols), alpha.contiguous(), param_row(gamma), param_row(beta)
    n_rows = x2.shape[0]
    tiles = plan_dyt(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, False, CUDA_FORWARD_TILES)
    _dyt_fwd_kernel[(tiles.grid,)](
        x2, alpha, gamma, beta if beta is not None else gamma, y, n_rows, n_cols, x2.stride(0), tiles.col_programs,
        tiles.row_programs, HAS_BETA=beta is not None, BLOCK_R=tiles.block_rows, BLOCK_N=tiles.block_cols,
        **tiles.options
    )
    return y


def dyt_backward(grad_out: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
                 beta: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_alpha, grad_gamma, grad_beta), each in its input's dtype and shape; grad_beta is computed even
    when beta is absent (in gamma's dtype then; the autograd formula drops it)."""
    check_dyt_inputs(x, alpha, gamma, beta)
    check_grad("grad_out", grad_out, x.shape, x.dtype, x.device)
    return launch_dyt_backward(grad_out, x, alpha, gamma, beta)


def launch_dyt_backward(grad_out: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
                        beta: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dyt_backward`` without its input checks, for the autograd formula's plain eager calls."""
    n_cols = x.shape[-1]
    dx = new_like(x)
    b_dtype = beta.dtype if beta is not None else gamma.dtype
    if x.numel() == 0:  # sums over nothing
        return (dx, torch.zeros_like(alpha, memory_format=torch.contiguous_format),
                torch.zeros(n_cols, dtype=gamma.dtype, device=x.device),
                torch.zeros(n_cols, dtype=b_dtype, device=x.device))
    require_launchable(x.device)
    x2, dy2, gamma = as_rows(x, n_cols), as_rows(grad_out, n_cols), param_row(gamma)
    n_rows = x2.shape[0]
    tiles = plan_dyt(x.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, True, CUDA_BACKWARD_TILES)
    col_blocks = cdiv(n_cols, tiles.block_cols)
    partials = torch.empty((2, tiles.row_programs, n_cols), dtype=torch.float32, device=x.device)
    dalpha = torch.empty((tiles.row_programs, col_blocks), dtype=torch.float32, device=x.device)
    _dyt_bwd_kernel[(tiles.grid,)](
        dy2, x2, alpha.contiguous(), gamma, dx, dalpha, partials[0], partials[1], n_rows, n_cols, dy2.stride(0),
        x2.stride(0), tiles.col_programs, tiles.row_programs, col_blocks, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, CUDA_MATH=CUDA_FAST_MATH_BACKWARD and x.device.type == "cuda",
        PREFETCH=tiles.prefetch, **tiles.options
    )
    return (dx, dalpha.sum().reshape(alpha.shape).to(alpha.dtype), *sum_partials(partials, (gamma.dtype, b_dtype)))
