"""Dynamic Tanh (DyT) over the last dim: ``y = gamma * tanh(alpha * x) + beta`` for x (..., C), alpha one element,
gamma and beta (C,) (beta optional), computed in fp32 and rounded once, to x's dtype.

Backward, with t = tanh(alpha * x) and g = dy * gamma * (1 - t^2) (1 - t^2 from e^-2|alpha x| directly: from t it
cancels where tanh saturates, and dalpha sums those terms):
    dx = alpha * g,  dalpha = sum over all elements of g * x,  dgamma = sum over rows of dy * t,  dbeta = sum of dy
tanh is recomputed from x (the backward reads x anyway). The parameter gradients go through per-program fp32
partials summed in a fixed order (deterministic, no atomics): dgamma and dbeta by one ``_norm.sum_partials``
launch, dalpha by torch's sum.

Layout of the work (``plan_dyt``): x is viewed as (n_rows, C) and cut into (BLOCK_R, BLOCK_N) tiles. Program p owns
the column blocks ``p % col_programs, + col_programs, ...`` and, for each, walks the rows
``p // col_programs, + row_programs, ...`` (BLOCK_R rows at a time): gamma and beta are loaded once per column block,
the dgamma/dbeta column sums and the dalpha row sums stay in registers across the row loop and are written once per
column block to row ``p // col_programs`` of a (row_programs, C) buffer (dalpha: (row_programs, column blocks)).
A row wider than one tile is split over column blocks (no multi-pass loop is needed: the op is elementwise); narrow
rows go several per tile.

Memory analysis (fp32 elements per (BLOCK_R x BLOCK_N) tile; gamma and beta rows are shared by the tile's rows):
- forward: x as loaded, x in fp32, alpha * x, and the tanh helper's |y|, e^-2|y|, |y|^2, its far and near
  branches and t, y before the cast -> 10.0 (Ascend910B3: 192 KiB * 0.8 / (10 * 4 B) = 3932 -> 2048 elements per
  tile; the Ascend check found 4096 fitting fp32 only with multi-buffer off);
- backward: x, dy as loaded and in fp32, the temporaries of tanh and of its derivative, t, g, dx, the three
  products summed into the partials -> 12.0 (3276 -> 2048 elements).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._norm import (as_rows, check_grad, check_norm_input, check_norm_param, cuda_programs_per_sm, param_row,
                    sum_partials)
from ._triton import (COMPUTE_DTYPE_SIZE, cdiv, check_float_tensor, launched_kernel, new_like, require_launchable,
                      tanh, tanh_derivative)

FORWARD_MEMORY_MULTIPLIER = 10.0
BACKWARD_MEMORY_MULTIPLIER = 12.0


class ColumnTiles(NamedTuple):
    block_rows: int  # BLOCK_R
    block_cols: int  # BLOCK_N
    col_programs: int  # programs sharing out the column blocks
    row_programs: int  # programs sharing out the rows of one column block (partial buffers have this many rows)
    options: dict  # launch options (num_warps on CUDA)

    @property
    def grid(self) -> int:
        return self.col_programs * self.row_programs


@memoised_plan
def plan_dyt(device_type: str, n_rows: int, n_cols: int, memory_multiplier: float, persistent: bool) -> ColumnTiles:
    """Tiles and grid: the columns first (does a whole row fit one tile?), then as many whole rows per tile as
    the budget allows, but with a persistent grid no more than keeps every program busy. ``persistent``: the
    kernel keeps per-program partials (backward), so the CUDA grid is capped too."""
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
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
            y = gamma * tanh(x * alpha)
            if HAS_BETA:
                y += beta
            tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "row_programs"])
def _dyt_bwd_kernel(dy_ptr, x_ptr, alpha_ptr, gamma_ptr, dx_ptr, dalpha_ptr, dgamma_ptr, dbeta_ptr, n_rows, n_cols,
                    dy_stride, x_stride, col_programs, row_programs, col_blocks, BLOCK_R: tl.constexpr,
                    BLOCK_N: tl.constexpr):
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
        gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dbeta_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dalpha_acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for start in tl.range(row_start, n_rows, row_step):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
            y = x * alpha
            t = tanh(y)
            g = dy * gamma * tanh_derivative(y)
            tl.store(dx_ptr + rows * n_cols + cols, (g * alpha).to(dx_ptr.dtype.element_ty), mask=mask)
            dalpha_acc += tl.sum(g * x, axis=1)
            dgamma_acc += tl.sum(dy * t, axis=0)
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
    tiles = plan_dyt(x.device.type, n_rows, n_cols, FORWARD_MEMORY_MULTIPLIER, persistent=False)
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
    tiles = plan_dyt(x.device.type, n_rows, n_cols, BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    col_blocks = cdiv(n_cols, tiles.block_cols)
    partials = torch.empty((2, tiles.row_programs, n_cols), dtype=torch.float32, device=x.device)
    dalpha = torch.empty((tiles.row_programs, col_blocks), dtype=torch.float32, device=x.device)
    _dyt_bwd_kernel[(tiles.grid,)](
        dy2, x2, alpha.contiguous(), gamma, dx, dalpha, partials[0], partials[1], n_rows, n_cols, dy2.stride(0),
        x2.stride(0), tiles.col_programs, tiles.row_programs, col_blocks, BLOCK_R=tiles.block_rows,
        BLOCK_N=tiles.block_cols, **tiles.options
    )
    return (dx, dalpha.sum().reshape(alpha.shape).to(alpha.dtype), *sum_partials(partials, (gamma.dtype, b_dtype)))
