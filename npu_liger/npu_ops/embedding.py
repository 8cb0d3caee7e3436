"""Embedding: ``out[t, :] = weight[indices[t], :]`` (``F.embedding(indices, weight, padding_idx)``).

    forward:  out (*indices.shape, D) = weight (V, D) gathered at indices (int32/int64, any shape)
    backward: grad_weight[v, :] = sum over tokens t with indices[t] == v of grad_out[t, :],
              0 for rows no token names and for the padding row

Forward gathers rows without any arithmetic, so it is exact in every dtype. It walks (token block x column
block) tiles: D is tiled with the UB manager, the token block fills what is left of the UB (many tokens per
tile when D is small), and a persistent grid strides over the token blocks.

Backward (one path, deterministic in every mode): the flat indices are sorted on the device (stable; int32
keys when the vocabulary allows), and ``torch.searchsorted`` gives every row v of grad_weight the bounds of its
run of tokens in the sorted order. ``_embedding_bwd_kernel`` owns each (row, column block) task: it sums the
run's gradient rows in token order in fp32 registers and stores the block once, cast to grad_out's dtype -- or
zeros when no token names the row (or it is the padding row). Runs longer than LONG_RUN tokens (frequent
tokens) are left to ``_embedding_bwd_long_kernel``, which sums each of them over narrow column blocks, many
gradient rows per step, so a hot row is summed by many programs at once. So grad_weight (V x D) is written
exactly once: no zero-fill pass, no (V, D) fp32 buffer, no atomics, no cast pass, no host sync for the number
of distinct rows, and bitwise-identical results from run to run. On the CPU (the Triton interpreter, ~1 ms of
Python per task) the tasks go over the sorted tokens instead when there are fewer tokens than rows: the task
at the start of each run owns its row, grad_weight is zero-filled by torch first, and the cost follows the
tokens, not V (``_tasks_by_token``; same sums, bitwise). The fp32 sums keep many small updates to one
bf16/fp16 row (bf16 arithmetic would stall at 256 when adding 1.0 a thousand times).

Out-of-range indices (outside [0, V)) are an error. The launchers check the indices' (min, max) after queueing
their kernels (``check_index_range``), in the way ``F.embedding`` reports them on each device:
- CUDA: the kernels themselves check: each is given a one-element int32 flag holding 1, and a program that
  meets an out-of-range index stores 0 into it (the forward kernel per token tile; the backward kernel's first
  program from the sorted run bounds, which show any index below 0 or at or above V). ``torch._assert_async``
  on the flag is queued right after them on the current stream: one small launch beside the kernels (the flag
  is filled once per device and reused, ``index_check_flag``), no host synchronisation, no side stream, no host
  memory (a min/max reduction and its comparisons cost five launches: the forward is host-bound at training
  sizes). The autograd backward of such a call checks nothing again: it runs on the indices the forward checked
  (``embedding_backward_of_forward``). A bad index fails later, at
  the next synchronisation, with a RuntimeError "CUDA error: device-side assert triggered" (the failing kernel
  prints the message naming ``indices`` and the range), and, as after torch's own device asserts, the
  process's CUDA context is unusable afterwards. The assert is an ordinary kernel launch on the current stream,
  so a CUDA graph capture (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) records it and
  every replay checks its indices. On ROCm builds, whose kernel asserts are compiled out by default, the
  check does nothing (the kernels still mask).
- CPU: ``IndexError`` naming the bad value (the host reads the pair; free there).
- NPU: the same host check, one synchronisation per call, after the kernels are queued. torch_npu registers no
  ``_assert_async`` kernel: the op would fall back to the CPU, which copies the flag to the host anyway (and
  torch_npu lists its own test of it as disabled), so the host check costs the same and names the value.
Under ``torch.compile`` the op is opaque and its launcher runs at run time, so the check happens there too.
Independently of that check every kernel masks indices outside [0, V), so memory safety never depends on it:
nothing outside ``weight``/``grad_weight`` is ever read or written (forward writes zeros for such tokens,
backward skips them).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._triton import (COMPUTE_DTYPE_SIZE, cdiv, check_float_tensor, flat, grid_stride, interpreter_enabled,
                     allocate_outside_graph_pools, launched_kernel, program_start, recording_launches,
                     require_launchable)

INDEX_DTYPES = (torch.int32, torch.int64)

# Memory analysis. Tiles are counted in 4-byte units (dtype_size = 4) per element of the 2-D tile.
# Forward, per element of a (BLOCK_N tokens x BLOCK_D columns) tile: the gathered value (<= 4 B, no upcast:
#   a gather needs no arithmetic), its int64 address (8 B = 2 units), the load/store masks (~1 B each) ->
#   ~3.5 units, rounded up to memory_multiplier 4.0 (Ascend910B3: 192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> 8192
#   elements per tile). Estimated from the live values, not yet measured on hardware.
#   Two requests: ((D,),) tiling dim 0 gives BLOCK_D; then ((next_pow2(n_tokens), BLOCK_D),) tiling dim 0 (D
#   fixed at BLOCK_D, unit_param = BLOCK_D) gives BLOCK_N, the tokens that fit beside one column block.
# Backward, per element of a (RUN_BLOCK x BLOCK_D) tile: the gradient value (native + fp32, 2 units), its
#   int64 address (2 units), mask, plus the fp32 row accumulator (BLOCK_D only, 1/RUN_BLOCK per element) ->
#   memory_multiplier 6.0. One request: ((RUN_BLOCK, D),) tiling dim 1, so unit_param = RUN_BLOCK
#   (Ascend910B3: 6553 / 8 = 819 -> BLOCK_D 512). The long-run kernel has the same tile with LONG_RUN_BLOCK
#   rows ((LONG_RUN_BLOCK, D),), its accumulator as large as the tile (one fp32 unit, where the main kernel's
#   row accumulator and masks take about as much): 6553 / 16 = 409 -> BLOCK_D 256.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 6.0
# Duplicates of one row are summed RUN_BLOCK gradient rows at a time: enough lanes to vectorise hot rows,
# few enough not to waste a large masked tile on the common run of one or two tokens.
RUN_BLOCK = 8
# CUDA: one gradient row per step, so the same formula and register budget give wide column blocks (2048).
# Most of the backward's time goes to storing grad_weight's rows, most of them zeros (16k tokens over a 128k
# vocabulary touch ~12% of the rows, once each), and the register-lean tile keeps the most programs (and stores)
# in flight: measured on an H200 (V 128256, D 4096, 16k tokens, bf16), 0.308 ms for the (1, 2048) tile against
# 0.327-0.448 ms for tiles of 2-4 rows ((2, 1024) to (4, 4096)).
CUDA_RUN_BLOCK = 1
# Runs longer than LONG_RUN tokens (frequent tokens: a Zipf-distributed batch of 16k has one of ~1300) are left
# to ``_embedding_bwd_long_kernel``, which sums them LONG_RUN_BLOCK gradient rows per step over narrow column
# blocks, so a hot row is summed by many programs at once instead of serially by one.
LONG_RUN = 32
LONG_RUN_BLOCK = 16


@launched_kernel
def _embedding_fwd_kernel(weight_ptr, indices_ptr, out_ptr, ok_ptr, n_tokens, num_embeddings, dim, stride_wv,
                          stride_wd, CHECK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """CHECK: store 0 into ``ok_ptr``'s flag when a token's index is out of range (CUDA's device-side check)."""
    for start in tl.range(program_start(BLOCK_N), n_tokens, grid_stride(BLOCK_N)):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < n_tokens
        rows = tl.load(indices_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
        valid = token_mask & (rows >= 0) & (rows < num_embeddings)
        if CHECK:
            n_bad = tl.sum((token_mask & ((rows < 0) | (rows >= num_embeddings))).to(tl.int32), axis=0)
            if n_bad > 0:
                tl.store(ok_ptr, 0)
        src = weight_ptr + tl.where(valid, rows, 0)[:, None] * stride_wv  # in bounds even for bad indices
        dst = out_ptr + tokens[:, None] * dim
        for col_start in tl.range(0, dim, BLOCK_D):
            cols = (col_start + tl.arange(0, BLOCK_D)).to(tl.int64)
            col_mask = cols < dim
            values = tl.load(src + cols[None, :] * stride_wd, mask=valid[:, None] & col_mask[None, :], other=0.0)
            tl.store(dst + cols[None, :], values, mask=token_mask[:, None] & col_mask[None, :])


@launched_kernel
def _embedding_bwd_kernel(grad_out_ptr, sorted_rows_ptr, order_ptr, row_bounds_ptr, grad_weight_ptr, ok_ptr, n_tasks,
                          n_col_blocks, n_tokens, num_embeddings, dim, padding_idx, long_run, stride_gn, stride_gd,
                          CHECK: tl.constexpr, BY_TOKEN: tl.constexpr, BLOCK_K: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    """Task = (row of grad_weight, column block): sum grad_out over the row's run of tokens
    (``order[row_bounds[row]:row_bounds[row + 1]]``, token order) in fp32 and store the block once -- zeros for
    a row no token names, or the padding row. Runs longer than ``long_run`` are skipped here: the long-run
    kernel owns them. Every element of grad_weight is written by exactly one task of the two kernels.

    BY_TOKEN: tasks are (sorted position, column block) instead, so their number scales with the tokens, not
    the vocabulary; the task at the first position of a run owns that run's row, the others do nothing, and
    grad_weight was zero-filled beforehand (rows no token names are never visited).

    CHECK: the first program stores 0 into ``ok_ptr``'s flag when an index is out of range: the sorted keys
    hold one below 0 when row 0's run does not start at position 0, and one at or above V when row V's bound
    (the first key >= V) is not the end."""
    if CHECK:
        if tl.program_id(0) == 0:
            below = tl.load(row_bounds_ptr)
            at_or_above = tl.load(row_bounds_ptr + num_embeddings)
            if (below != 0) | (at_or_above != n_tokens):
                tl.store(ok_ptr, 0)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        slot = task // n_col_blocks
        col_block = task % n_col_blocks
        if BY_TOKEN:
            row = tl.load(sorted_rows_ptr + slot).to(tl.int64)
            in_range = (row >= 0) & (row < num_embeddings)
            row = tl.where(in_range, row, 0)  # an out-of-range index: read in bounds, own nothing
            run_start = tl.load(row_bounds_ptr + row)
            run_end = tl.load(row_bounds_ptr + row + 1)
            run_end = tl.where(row == padding_idx, run_start, run_end)  # the padding row sums nothing
            todo = in_range & (run_start == slot) & (run_end - run_start <= long_run)
        else:
            row = slot
            run_start = tl.load(row_bounds_ptr + row)
            run_end = tl.load(row_bounds_ptr + row + 1)
            run_end = tl.where(row == padding_idx, run_start, run_end)  # the padding row sums nothing
            todo = run_end - run_start <= long_run
        if todo:
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
            tl.store(grad_weight_ptr + row * dim + cols, acc.to(grad_weight_ptr.dtype.element_ty), mask=col_mask)


@launched_kernel
def _embedding_bwd_long_kernel(grad_out_ptr, sorted_rows_ptr, order_ptr, row_bounds_ptr, grad_weight_ptr, n_tasks,
                               n_col_blocks, num_embeddings, dim, padding_idx, long_run, stride_gn, stride_gd,
                               BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """The runs longer than ``long_run`` tokens. Task = (slot, column block); slot s looks at sorted position
    k = s * (long_run + 1). Every such run covers at least long_run + 1 positions, so it holds a multiple of
    long_run + 1, and the first one (k - run_start <= long_run) owns the run: exactly one slot per long run."""
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        k = (task // n_col_blocks) * (long_run + 1)
        col_block = task % n_col_blocks
        row = tl.load(sorted_rows_ptr + k).to(tl.int64)
        valid = (row >= 0) & (row < num_embeddings) & (row != padding_idx)
        safe_row = tl.where(valid, row, 0)
        run_start = tl.load(row_bounds_ptr + safe_row)
        run_end = tl.load(row_bounds_ptr + safe_row + 1)
        if valid & (run_end - run_start > long_run) & (k - run_start <= long_run):
            cols = (col_block * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
            col_mask = cols < dim
            acc = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)  # reduced once, after the loop
            for k_start in tl.range(run_start, run_end, BLOCK_K):
                ks = k_start + tl.arange(0, BLOCK_K)
                k_mask = ks < run_end
                tokens = tl.load(order_ptr + ks, mask=k_mask, other=0).to(tl.int64)
                acc += tl.load(grad_out_ptr + tokens[:, None] * stride_gn + cols[None, :] * stride_gd,
                               mask=k_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
            row_sum = tl.sum(acc, axis=0).to(grad_weight_ptr.dtype.element_ty)
            tl.store(grad_weight_ptr + safe_row * dim + cols, row_sum, mask=col_mask)


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


# CUDA: one flag per device, reused by every call instead of a fill launch per call. Kernels only ever clear it,
# and the assert queued after them then leaves the process's CUDA context unusable (device-side asserts are
# sticky), so no later call can read a cleared flag. A call being recorded (a CUDA-graph capture, a graph that
# records our launches) gets a fresh flag: a tensor first allocated there would hold no 1 outside the recording.
# The kept flag is allocated outside any CUDA-graph pool (a first call inside torch.compile's CUDA-graph warm-up
# would otherwise put it in the graph's memory).
_INDEX_FLAGS = {}  # CUDA device index -> its flag


def index_check_flag(device: torch.device):
    """CUDA: the flag the kernels clear on an out-of-range index (1 = all in range), for ``check_index_range``;
    None elsewhere (the host check reads the indices' min and max instead)."""
    if device.type != "cuda":
        return None
    if recording_launches(device):
        return torch.ones((), dtype=torch.int32, device=device)
    flag = _INDEX_FLAGS.get(device.index)
    if flag is None:
        flag = _INDEX_FLAGS[device.index] = allocate_outside_graph_pools(
            lambda: torch.ones((), dtype=torch.int32, device=device), device)
    return flag


def check_index_range(indices: torch.Tensor, num_embeddings: int, flag=None) -> None:
    """Every index (a non-empty flat tensor) must lie in [0, num_embeddings): a device-side assert on CUDA, else
    IndexError naming a bad value (see the module docstring). ``flag``: from ``index_check_flag``, after the
    kernels that checked the indices into it were queued."""
    message = f"embedding: indices must be in [0, {num_embeddings}) (num_embeddings={num_embeddings})"
    if flag is not None:
        torch._assert_async(flag, message)
        return
    low, high = torch.aminmax(indices)
    if indices.device.type == "cuda":  # no kernel looked at the indices (zero-width rows)
        # max <= V - 1, capped, rather than max < V: with int32 indices and V >= 2**31, V would wrap around.
        last = min(num_embeddings - 1, torch.iinfo(indices.dtype).max)
        torch._assert_async((low >= 0) & (high <= last), message)
        return
    low, high = torch.stack((low, high)).tolist()
    if low < 0 or high >= num_embeddings:
        bad = low if low < 0 else high
        raise IndexError(f"index {bad} is out of range for an embedding with num_embeddings={num_embeddings}: "
                         f"indices must be in [0, {num_embeddings}) (got values from {low} to {high})")


@memoised_plan
def _token_plan(device_type: str, tokens: int, dim: int, memory_multiplier: float = FORWARD_MEMORY_MULTIPLIER):
    """(BLOCK_N, BLOCK_D) plan: D tiled first, then as many tokens as fit beside one column block. ``tokens``:
    the token count rounded up to a power of two (so the CUDA memo holds one plan per power)."""
    block_d = plan_launch(device_type, TileRequest(memory_multiplier, ((dim,),), (0,), COMPUTE_DTYPE_SIZE)).block
    request = TileRequest(memory_multiplier, ((tokens, block_d),), (0,), COMPUTE_DTYPE_SIZE)
    return plan_launch(device_type, request)


@memoised_plan
def _backward_plan(device_type: str, dim: int, long_runs: bool = False):
    """(RUN_BLOCK, BLOCK_D) plan of the backward kernel, or of the long-run kernel."""
    run_block = LONG_RUN_BLOCK if long_runs else CUDA_RUN_BLOCK if device_type == "cuda" else RUN_BLOCK
    request = TileRequest(BACKWARD_MEMORY_MULTIPLIER, ((run_block, dim),), (1,), COMPUTE_DTYPE_SIZE)
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
    flag = None
    if dim:
        require_launchable(weight.device)
        flag = index_check_flag(weight.device)
        plan = _token_plan(weight.device.type, triton.next_power_of_2(n), dim)
        block_n, block_d = plan.tiles[0]
        _embedding_fwd_kernel[(plan.grid(cdiv(n, block_n)),)](
            weight, flat_indices, out, flat_indices if flag is None else flag, n, num_embeddings, dim,
            weight.stride(0), weight.stride(1), CHECK=flag is not None, BLOCK_N=block_n, BLOCK_D=block_d,
            **plan.launch_options()
        )
    # after the launch: where the host reads, the gather is already queued
    check_index_range(flat_indices, num_embeddings, flag)
    return out


def _sort_keys(flat_indices: torch.Tensor, num_embeddings: int, in_range: bool) -> torch.Tensor:
    """int32 sort keys when the vocabulary allows (a radix sort of 32-bit keys takes half the passes): int64
    indices are clamped to [-1, V] first, so an out-of-range index stays out of range (``in_range``: the indices
    were checked, a plain cast keeps them)."""
    if flat_indices.dtype == torch.int32 or num_embeddings >= torch.iinfo(torch.int32).max:
        return flat_indices
    keys = flat_indices if in_range else flat_indices.clamp(-1, num_embeddings)
    return keys.to(torch.int32)


def _tasks_by_token(device_type: str, n_tokens: int, num_embeddings: int) -> bool:
    """Whether the backward's tasks go over the tokens (after a torch zero-fill) rather than the vocabulary rows.

    Only where the Triton interpreter runs the kernel (CPU tensors), which spends ~1 ms of Python per task
    whatever the task does: a 32000-row vocabulary cost ~30-60 s per backward for a handful of tokens; now the
    cost follows the tokens. Compiled kernels (CUDA, Ascend) keep one task per row, each element stored once
    with no zero-fill pass (the token tasks have not been timed there). The Ascend compile check runs the
    launchers on CPU tensors without the interpreter, so it compiles the per-row variant Ascend runs."""
    return device_type == "cpu" and interpreter_enabled() and n_tokens < num_embeddings


def embedding_backward(grad_out: torch.Tensor, indices: torch.Tensor, num_embeddings: int,
                       padding_idx: int = -1) -> torch.Tensor:
    """grad_weight (num_embeddings, D) in grad_out's dtype, each element written once; deterministic."""
    check_embedding_backward_inputs(grad_out, indices, num_embeddings, padding_idx)
    return _launch_backward(grad_out, indices, num_embeddings, padding_idx, indices_checked=False)


def embedding_backward_of_forward(grad_out: torch.Tensor, indices: torch.Tensor, num_embeddings: int,
                                  padding_idx: int) -> torch.Tensor:
    """The autograd backward's launch: ``indices`` are the ones the forward saved after checking their range
    (CPU, NPU: it raised; CUDA: its assert is queued before this, and a failed one stops every later kernel),
    and ``grad_out`` has the forward output's shape. So no input checks, no range check (on CUDA: no assert
    launch), and int64 indices cast to int32 keys without the clamp. The kernels still mask every index."""
    return _launch_backward(grad_out, indices, num_embeddings, padding_idx, indices_checked=True)


def _launch_backward(grad_out: torch.Tensor, indices: torch.Tensor, num_embeddings: int, padding_idx: int, *,
                     indices_checked: bool) -> torch.Tensor:
    dim = grad_out.shape[-1]
    device = grad_out.device
    flat_indices = flat(indices)
    n = flat_indices.numel()
    if n == 0:
        return torch.zeros((num_embeddings, dim), dtype=grad_out.dtype, device=device)
    grad_2d = grad_out.reshape(n, dim)  # a view when possible (even of an expanded gradient): strides go along
    padding = padding_idx if padding_idx >= 0 else -1
    grad_weight = torch.empty((num_embeddings, dim), dtype=grad_out.dtype, device=device)  # all written below
    flag = None
    if dim and num_embeddings:
        require_launchable(device)
        keys = _sort_keys(flat_indices, num_embeddings, in_range=indices_checked)
        sorted_rows, order = torch.sort(keys, stable=True)  # stable: a fixed summation order per row
        # row_bounds[v] = first sorted position holding a row >= v: row v's run is [row_bounds[v], row_bounds[v+1]).
        row_ids = torch.arange(num_embeddings + 1, dtype=sorted_rows.dtype, device=device)
        row_bounds = torch.searchsorted(sorted_rows, row_ids)
        plan = _backward_plan(device.type, dim)
        block_k, block_d = plan.tiles[0]
        n_col_blocks = cdiv(dim, block_d)
        by_token = _tasks_by_token(device.type, n, num_embeddings)
        if by_token:
            grad_weight.zero_()  # rows no token names are never visited
        elif not indices_checked:
            flag = index_check_flag(device)
        n_tasks = (n if by_token else num_embeddings) * n_col_blocks
        _embedding_bwd_kernel[(plan.grid(n_tasks),)](
            grad_2d, sorted_rows, order, row_bounds, grad_weight, row_bounds if flag is None else flag, n_tasks,
            n_col_blocks, n, num_embeddings, dim, padding, LONG_RUN, grad_2d.stride(0), grad_2d.stride(1),
            CHECK=flag is not None, BY_TOKEN=by_token, BLOCK_K=block_k, BLOCK_D=block_d, **plan.launch_options()
        )
        if n > LONG_RUN:  # else no run can be long
            plan = _backward_plan(device.type, dim, True)  # the long-run kernel's
            block_k, block_d = plan.tiles[0]
            n_col_blocks = cdiv(dim, block_d)
            n_tasks = cdiv(n, LONG_RUN + 1) * n_col_blocks
            _embedding_bwd_long_kernel[(plan.grid(n_tasks),)](
                grad_2d, sorted_rows, order, row_bounds, grad_weight, n_tasks, n_col_blocks, num_embeddings, dim,
                padding, LONG_RUN, grad_2d.stride(0), grad_2d.stride(1), BLOCK_K=block_k, BLOCK_D=block_d,
                **plan.launch_options()
            )
    if not indices_checked:
        check_index_range(flat_indices, num_embeddings, flag)
    return grad_weight
