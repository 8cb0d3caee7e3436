"""Embedding: ``out[t, :] = weight[indices[t], :]`` (``F.embedding(indices, weight, padding_idx)``).

    forward:  out (*indices.shape, D) = weight (V, D) gathered at indices (int32/int64, any shape)
    backward: grad_weight[v, :] = sum over tokens t with indices[t] == v of grad_out[t, :],
              0 for rows no token names and for the padding row

Forward gathers rows without any arithmetic, so it is exact in every dtype. It walks (token block x column
block) tiles: D is tiled with the UB manager, the token block fills what is left of the UB (many tokens per
tile when D is small), and a persistent grid strides over the token blocks.

Backward has two paths, picked at run time by ``torch.are_deterministic_algorithms_enabled()``:
- deterministic (``_embedding_bwd_kernel``): the flat indices are sorted on the device (stable), so equal rows
  form runs (bounds from cumsum + searchsorted, on the device); each (run, column block) task is owned by
  exactly one program, which sums the run's gradient rows in a fixed order in fp32 and stores the row once,
  cast to the weight's dtype. No atomics, no (V, D) fp32 buffer, bitwise-identical results from run to run.
- default (``_embedding_bwd_atomic_kernel``): one pass over the tokens with ``tl.atomic_add`` into an fp32
  (V, D) accumulator (the output itself for fp32 weights), cast once at the end. Faster for hot rows, but the
  order of the additions varies between runs on a parallel device.
Either way low-precision gradients are summed in fp32, so many small updates to one bf16/fp16 row are not
lost to rounding (bf16 arithmetic would stall at 256 when adding 1.0 a thousand times).

Out-of-range indices (outside [0, V)): a Triton kernel cannot raise, so the launchers check the index range
on the host, which costs ONE host-device sync per call (min and max fetched together, plus the number of
distinct rows in the deterministic backward, which sizes its grid) and raises ``IndexError`` naming the bad
value. Under ``torch.compile`` the op is opaque and its launcher runs at run time,
so the check still happens there (it is never traced). Independently of that check every kernel masks
indices outside [0, V): nothing outside ``weight``/``grad_weight`` is ever read or written (forward writes
zeros for such tokens, backward skips them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, plan_launch
from ._triton import check_float_tensor, flat, program_start, grid_stride, require_launchable

INDEX_DTYPES = (torch.int32, torch.int64)

# Memory analysis. Tiles are counted in 4-byte units (dtype_size = 4) per element of the 2-D tile.
# Forward, per element of a (BLOCK_N tokens x BLOCK_D columns) tile: the gathered value (<= 4 B, no upcast:
#   a gather needs no arithmetic), its int64 address (8 B = 2 units), the load/store masks (~1 B each) ->
#   ~3.5 units, rounded up to memory_multiplier 4.0 (Ascend910B3: 192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> 8192
#   elements per tile). Estimated from the live values, not yet measured on hardware.
#   Two requests: ((D,),) tiling dim 0 gives BLOCK_D; then ((next_pow2(n_tokens), BLOCK_D),) tiling dim 0 (D
#   fixed at BLOCK_D, unit_param = BLOCK_D) gives BLOCK_N, the tokens that fit beside one column block.
# Atomic backward, per element of a (BLOCK_N x BLOCK_D) tile: the gradient value (native + fp32 copy, 2 units),
#   two int64 addresses (grad_out and accumulator, 4 units), masks -> memory_multiplier 7.0 (5617 -> 4096).
# Deterministic backward, per element of a (RUN_BLOCK x BLOCK_D) tile: the gradient value (native + fp32,
#   2 units), its int64 address (2 units), mask, plus the fp32 row accumulator (BLOCK_D only, 1/RUN_BLOCK per
#   element) -> memory_multiplier 6.0. One request: ((RUN_BLOCK, D),) tiling dim 1, so unit_param = RUN_BLOCK
#   (Ascend910B3: 6553 / 8 = 819 -> BLOCK_D 512).
FORWARD_MEMORY_MULTIPLIER = 4.0
ATOMIC_BACKWARD_MEMORY_MULTIPLIER = 7.0
SORTED_BACKWARD_MEMORY_MULTIPLIER = 6.0
COMPUTE_DTYPE_SIZE = 4
# Duplicates of one row are summed RUN_BLOCK gradient rows at a time: enough lanes to vectorise hot rows,
# few enough not to waste a large masked tile on the common run of one or two tokens.
RUN_BLOCK = 8


@triton.jit
def _embedding_fwd_kernel(weight_ptr, indices_ptr, out_ptr, n_tokens, num_embeddings, dim, stride_wv, stride_wd,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    for start in tl.range(program_start(BLOCK_N), n_tokens, grid_stride(BLOCK_N)):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < n_tokens
        rows = tl.load(indices_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
        valid = token_mask & (rows >= 0) & (rows < num_embeddings)
        src = weight_ptr + tl.where(valid, rows, 0)[:, None] * stride_wv  # in bounds even for bad indices
        dst = out_ptr + tokens[:, None] * dim
        for col_start in tl.range(0, dim, BLOCK_D):
            cols = (col_start + tl.arange(0, BLOCK_D)).to(tl.int64)
            col_mask = cols < dim
            values = tl.load(src + cols[None, :] * stride_wd, mask=valid[:, None] & col_mask[None, :], other=0.0)
            tl.store(dst + cols[None, :], values, mask=token_mask[:, None] & col_mask[None, :])


@triton.jit
def _embedding_bwd_atomic_kernel(grad_out_ptr, indices_ptr, acc_ptr, n_tokens, num_embeddings, dim, padding_idx,
                                 stride_gn, stride_gd, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    for start in tl.range(program_start(BLOCK_N), n_tokens, grid_stride(BLOCK_N)):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < n_tokens
        rows = tl.load(indices_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
        owns = token_mask & (rows >= 0) & (rows < num_embeddings) & (rows != padding_idx)
        src = grad_out_ptr + tokens[:, None] * stride_gn
        dst = acc_ptr + tl.where(owns, rows, 0)[:, None] * dim
        for col_start in tl.range(0, dim, BLOCK_D):
            cols = (col_start + tl.arange(0, BLOCK_D)).to(tl.int64)
            mask = owns[:, None] & (cols < dim)[None, :]
            grad = tl.load(src + cols[None, :] * stride_gd, mask=mask, other=0.0).to(tl.float32)
            tl.atomic_add(dst + cols[None, :], grad, mask=mask)


@triton.jit
def _embedding_bwd_kernel(grad_out_ptr, sorted_rows_ptr, order_ptr, run_bounds_ptr, grad_weight_ptr, n_tasks,
                          n_col_blocks, num_embeddings, dim, padding_idx, stride_gn, stride_gd,
                          BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """Task = (run of equal rows in the sorted indices, column block): sum grad_out over the run's tokens
    (``order[run_start:run_end]``) in a fixed order and write that row. Each grad_weight row is one run, so
    exactly one program writes it."""
    for task in tl.range(tl.program_id(0), n_tasks, tl.num_programs(0)):
        run = task // n_col_blocks
        col_block = task % n_col_blocks
        run_start = tl.load(run_bounds_ptr + run)
        row = tl.load(sorted_rows_ptr + run_start).to(tl.int64)
        owns = (row >= 0) & (row < num_embeddings) & (row != padding_idx)
        run_end = tl.where(owns, tl.load(run_bounds_ptr + run + 1), run_start)  # empty loop: nothing to own
        cols = (col_block * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        col_mask = cols < dim
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for k_start in tl.range(run_start, run_end, BLOCK_K):
            ks = k_start + tl.arange(0, BLOCK_K)
            k_mask = ks < run_end
            tokens = tl.load(order_ptr + ks, mask=k_mask, other=0).to(tl.int64)
            grad = tl.load(grad_out_ptr + tokens[:, None] * stride_gn + cols[None, :] * stride_gd,
                           mask=k_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(grad, axis=0)
        # The store mask is built from integers: the interpreter mis-types a splat scalar bool in a mask.
        store_cols = tl.where(owns, dim, 0)
        dst = grad_weight_ptr + tl.where(owns, row, 0) * dim
        tl.store(dst + cols, acc.to(grad_weight_ptr.dtype.element_ty), mask=cols < store_cols)


def _check_indices(indices: torch.Tensor, weight_like: torch.Tensor, weight_name: str) -> None:
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"indices must be int32 or int64, got {indices.dtype}")
    if indices.device != weight_like.device:
        raise RuntimeError(
            f"indices must be on the device of {weight_name} ({weight_like.device}), got {indices.device}"
        )


def _check_padding_idx(padding_idx, num_embeddings) -> None:
    """Op convention: any negative padding_idx means "no padding row" (the schema default is -1)."""
    if not isinstance(padding_idx, int) or isinstance(padding_idx, bool):
        raise TypeError(f"padding_idx must be an int, got {type(padding_idx).__name__}")
    if padding_idx >= 0 and padding_idx >= num_embeddings:
        raise ValueError(
            f"padding_idx must be < num_embeddings ({num_embeddings}) or negative (none), got {padding_idx}"
        )


def check_embedding_inputs(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int) -> None:
    check_float_tensor("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (num_embeddings, embedding_dim), got shape {tuple(weight.shape)}")
    _check_indices(indices, weight, "weight")
    _check_padding_idx(padding_idx, weight.shape[0])


def check_embedding_backward_inputs(grad_out: torch.Tensor, indices: torch.Tensor, num_embeddings: int,
                                    padding_idx: int) -> None:
    check_float_tensor("grad_out", grad_out)
    _check_indices(indices, grad_out, "grad_out")
    if grad_out.dim() != indices.dim() + 1 or grad_out.shape[:-1] != indices.shape:
        raise ValueError(f"grad_out must have shape (*indices.shape, embedding_dim) with indices.shape "
                         f"{tuple(indices.shape)}, got {tuple(grad_out.shape)}")
    if num_embeddings < 0:
        raise ValueError(f"num_embeddings must be >= 0, got {num_embeddings}")
    _check_padding_idx(padding_idx, num_embeddings)


def check_index_range(low: torch.Tensor, high: torch.Tensor, num_embeddings: int, *counts: torch.Tensor):
    """Raise IndexError unless ``0 <= low <= high < num_embeddings``. ``low``/``high`` (the indices' min and
    max) and any ``counts`` are 0-d tensors still on the device: fetching them together is the launcher's one
    host sync. Returns the counts as ints."""
    low, high, *counts = torch.stack([t.to(torch.int64) for t in (low, high, *counts)]).tolist()
    if low < 0 or high >= num_embeddings:
        bad = low if low < 0 else high
        raise IndexError(f"index {bad} is out of range for an embedding with num_embeddings={num_embeddings}: "
                         f"indices must be in [0, {num_embeddings}) (got values from {low} to {high})")
    return counts


def _token_plan(device_type: str, n_tokens: int, dim: int, memory_multiplier: float):
    """(BLOCK_N, BLOCK_D) plan: D tiled first, then as many tokens as fit beside one column block."""
    block_d = plan_launch(device_type, TileRequest(memory_multiplier, ((dim,),), (0,), COMPUTE_DTYPE_SIZE)).block
    request = TileRequest(memory_multiplier, ((triton.next_power_of_2(n_tokens), block_d),), (0,), COMPUTE_DTYPE_SIZE)
    return plan_launch(device_type, request)


def _sorted_plan(device_type: str, dim: int):
    request = TileRequest(SORTED_BACKWARD_MEMORY_MULTIPLIER, ((RUN_BLOCK, dim),), (1,), COMPUTE_DTYPE_SIZE)
    return plan_launch(device_type, request)


def embedding_forward(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1) -> torch.Tensor:
    """``F.embedding(indices, weight)``; ``padding_idx`` only affects the gradient, but is validated here."""
    check_embedding_inputs(weight, indices, padding_idx)
    num_embeddings, dim = weight.shape
    out = torch.empty((*indices.shape, dim), dtype=weight.dtype, device=weight.device)
    flat_indices = flat(indices)
    n = flat_indices.numel()
    if n == 0:
        return out
    check_index_range(flat_indices.min(), flat_indices.max(), num_embeddings)  # the one host sync
    if dim == 0:
        return out
    require_launchable(weight.device)
    plan = _token_plan(weight.device.type, n, dim, FORWARD_MEMORY_MULTIPLIER)
    block_n, block_d = plan.tiles[0]
    _embedding_fwd_kernel[(plan.grid(triton.cdiv(n, block_n)),)](
        weight, flat_indices, out, n, num_embeddings, dim, weight.stride(0), weight.stride(1),
        BLOCK_N=block_n, BLOCK_D=block_d, **plan.launch_options()
    )
    return out


def embedding_backward(grad_out: torch.Tensor, indices: torch.Tensor, num_embeddings: int,
                       padding_idx: int = -1) -> torch.Tensor:
    """grad_weight (num_embeddings, D) in grad_out's dtype; deterministic when torch asks for it."""
    check_embedding_backward_inputs(grad_out, indices, num_embeddings, padding_idx)
    dim = grad_out.shape[-1]
    device = grad_out.device
    flat_indices = flat(indices)
    n = flat_indices.numel()
    grad_2d = grad_out.reshape(n, dim)  # a view when possible (even of an expanded gradient): strides go along
    padding = padding_idx if padding_idx >= 0 else -1
    if n == 0:
        return torch.zeros((num_embeddings, dim), dtype=grad_out.dtype, device=device)
    if torch.are_deterministic_algorithms_enabled():
        return _sorted_backward(grad_2d, flat_indices, num_embeddings, padding)
    return _atomic_backward(grad_2d, flat_indices, num_embeddings, padding)


def _sorted_backward(grad_2d: torch.Tensor, flat_indices: torch.Tensor, num_embeddings: int,
                     padding: int) -> torch.Tensor:
    n, dim = grad_2d.shape
    device = grad_2d.device
    sorted_rows, order = torch.sort(flat_indices, stable=True)  # stable: a fixed summation order per run
    run_starts = torch.cat((torch.ones(1, dtype=torch.bool, device=device), sorted_rows[1:] != sorted_rows[:-1]))
    # The one host sync: the index range and the number of runs (distinct rows), which sizes the grid.
    (n_runs,) = check_index_range(sorted_rows[0], sorted_rows[-1], num_embeddings, run_starts.sum())
    grad_weight = torch.zeros((num_embeddings, dim), dtype=grad_2d.dtype, device=device)
    if dim == 0:
        return grad_weight
    require_launchable(device)
    # run_bounds[r] = first sorted position of run r (r = 0..n_runs-1), run_bounds[n_runs] = n: the first
    # position whose running count of run starts reaches r + 1.
    run_ids = torch.cumsum(run_starts, 0)
    run_bounds = torch.searchsorted(run_ids, torch.arange(1, n_runs + 2, device=device))
    plan = _sorted_plan(device.type, dim)
    block_k, block_d = plan.tiles[0]
    n_col_blocks = triton.cdiv(dim, block_d)
    n_tasks = n_runs * n_col_blocks
    _embedding_bwd_kernel[(plan.grid(n_tasks),)](
        grad_2d, sorted_rows, order, run_bounds, grad_weight, n_tasks, n_col_blocks, num_embeddings, dim, padding,
        grad_2d.stride(0), grad_2d.stride(1), BLOCK_K=block_k, BLOCK_D=block_d, **plan.launch_options()
    )
    return grad_weight


def _atomic_backward(grad_2d: torch.Tensor, flat_indices: torch.Tensor, num_embeddings: int,
                     padding: int) -> torch.Tensor:
    n, dim = grad_2d.shape
    device = grad_2d.device
    check_index_range(flat_indices.min(), flat_indices.max(), num_embeddings)  # the one host sync
    # fp32 weights accumulate straight into the output; half precision through an fp32 buffer, cast once.
    acc = torch.zeros((num_embeddings, dim), dtype=torch.float32, device=device)
    if dim:
        require_launchable(device)
        plan = _token_plan(device.type, n, dim, ATOMIC_BACKWARD_MEMORY_MULTIPLIER)
        block_n, block_d = plan.tiles[0]
        _embedding_bwd_atomic_kernel[(plan.grid(triton.cdiv(n, block_n)),)](
            grad_2d, flat_indices, acc, n, num_embeddings, dim, padding, grad_2d.stride(0), grad_2d.stride(1),
            BLOCK_N=block_n, BLOCK_D=block_d, **plan.launch_options()
        )
    return acc if grad_2d.dtype == torch.float32 else acc.to(grad_2d.dtype)
