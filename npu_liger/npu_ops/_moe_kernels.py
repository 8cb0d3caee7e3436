"""The Triton kernels of ``fused_moe`` (the host side is ``fused_moe.py``; the grouped-matmul switch
``_grouped_mm.py``). Every kernel walks a persistent 1-D grid-stride loop over independent tasks with 2-D tiles
and int64 offsets, reads shapes and strides as runtime arguments, and computes in fp32.

Rows ("slots" sorted by expert): row r of a sorted buffer is the routing slot ``order[r]`` (= t * K + k) of token
``order[r] // K``; rows ``[bounds[e], bounds[e + 1])`` belong to expert e; rows from ``bounds[E]`` (= n_valid) on
are the slots whose index is E (served elsewhere) and are never computed, so every kernel that reads sorted rows
masks them with n_valid, loaded from the device (no host synchronisation).

Memory analysis of the vector kernels (UB tiles, fp32 values of 4 bytes, Ascend910B3: 192 KiB * 0.8 = 157286 B):
- ``_fused_moe_gather_kernel``, a (BLOCK_R rows x BLOCK_C columns) tile: the gathered value (<= 4 B, no upcast:
  a copy needs no arithmetic), its int64 address (2 units, the rows are indirect) and the masks -> 4.0
  (157286 / 16 = 9830 -> 8192 elements per tile: BLOCK_C = min(next_pow2(C), 8192), BLOCK_R fills the rest).
- ``_fused_moe_swiglu_fwd_kernel``, a (BLOCK_R x BLOCK_I) tile of the (rows, 2I) gate/up buffer: gate, up, the
  sigmoid, the product, and the masks -> 5.0 (7864 -> 4096 elements).
- ``_fused_moe_swiglu_bwd_kernel``, a (BLOCK_R x BLOCK_I) tile: the incoming gradient, gate, up, sigmoid, silu,
  its derivative, the product, the two gate/up gradients and the weighted product (10 fp32 values), plus the
  row accumulators (1 / BLOCK_I per element) -> 11.0 (3574 -> 2048 elements).
- ``_fused_moe_combine_kernel``, a (BLOCK_T tokens x BLOCK_C columns) tile: the fp32 accumulator, the gathered row
  (fp32), its int64 address (2 units), masks -> 6.0 (6553 -> 4096 elements).
- ``_fused_moe_zero_empty_kernel``, a BLOCK-element tile of zeros stored into an expert's weight gradient: the
  zeros (<= 4 B), their int64 address (2 units) and the mask -> 4.0 (like the gather).
The grouped matmuls (``_fused_moe_mm_kernel``, ``_fused_moe_wgrad_kernel``) have fixed tiles (``MM_TILES`` in
``_grouped_mm.py``): their operands go through the cube unit's buffers (UPCAST: the Triton interpreter's dot
reads half-precision operands as garbage, so on CPU they are upcast to fp32 first; compiled backends multiply
them as they are), the UB holds only the fp32 accumulator
being cast for the store; ``scripts/ascend_check.sh`` compiles them at those tiles for every chip.
"""

from __future__ import annotations

import triton.language as tl

from ._triton import grid_stride, launched_kernel, program_start

GATHER_MEMORY_MULTIPLIER = 4.0
SWIGLU_FWD_MEMORY_MULTIPLIER = 5.0
SWIGLU_BWD_MEMORY_MULTIPLIER = 11.0
COMBINE_MEMORY_MULTIPLIER = 6.0
ZERO_EMPTY_MEMORY_MULTIPLIER = 4.0


@launched_kernel(do_not_specialize=["n_rows", "n_tasks"])
def _fused_moe_gather_kernel(src_ptr, order_ptr, bounds_ptr, out_ptr, n_rows, n_tasks, n_col_blocks, n_cols,
                             top_k, num_experts, stride_sr, stride_sc, BLOCK_R: tl.constexpr,
                             BLOCK_C: tl.constexpr):
    """``out[r, :] = src[order[r] // top_k, :]`` for the sorted rows below n_valid (the others are left as they
    are: nothing reads them). Task = (row block, column block)."""
    n_valid = tl.load(bounds_ptr + num_experts)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        rows = (task // n_col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        cols = (task % n_col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C).to(tl.int64)
        row_mask = rows < n_valid
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        tokens = tl.load(order_ptr + rows, mask=row_mask, other=0) // top_k
        values = tl.load(src_ptr + tokens[:, None] * stride_sr + cols[None, :] * stride_sc, mask=mask, other=0.0)
        tl.store(out_ptr + rows[:, None] * n_cols + cols[None, :], values, mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "n_tasks"])
def _fused_moe_swiglu_fwd_kernel(h_ptr, act_ptr, bounds_ptr, n_rows, n_tasks, n_col_blocks, inter, num_experts,
                                 BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    """``act = silu(h[:, :I]) * h[:, I:]`` over the (rows, 2I) gate/up buffer, rows below n_valid. The rows of
    no expert (n_valid on) get zeros in h and act: h is an output of the op, so all of it is defined."""
    n_valid = tl.load(bounds_ptr + num_experts)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        rows = (task // n_col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        cols = (task % n_col_blocks) * BLOCK_I + tl.arange(0, BLOCK_I).to(tl.int64)
        col_mask = (cols < inter)[None, :]
        mask = (rows < n_valid)[:, None] & col_mask
        gate_ptrs = h_ptr + rows[:, None] * (2 * inter) + cols[None, :]
        gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
        act = gate * tl.sigmoid(gate) * up  # 0 on the rows of no expert (loaded as 0)
        tl.store(act_ptr + rows[:, None] * inter + cols[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=(rows < n_rows)[:, None] & col_mask)
        tail = ((rows >= n_valid) & (rows < n_rows))[:, None] & col_mask
        tl.store(gate_ptrs, gate.to(h_ptr.dtype.element_ty), mask=tail)
        tl.store(gate_ptrs + inter, up.to(h_ptr.dtype.element_ty), mask=tail)


@launched_kernel(do_not_specialize=["n_rows", "n_row_blocks"])
def _fused_moe_swiglu_bwd_kernel(grad_act_ptr, h_ptr, weights_ptr, order_ptr, bounds_ptr, grad_h_ptr, wact_ptr,
                                 grad_w_ptr, n_rows, n_row_blocks, inter, top_k, num_experts, stride_wt, stride_wk,
                                 BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    """Per sorted row r (slot s = order[r], weight w = weights[s // K, s % K]), with ``ga = grad_out[token] @
    down_proj[e]`` (the unweighted gradient of the SwiGLU product) and the product ``act`` recomputed from h (and
    rounded to the dtype the forward's act had, so the gradients are those of the forward as computed):
    ``grad_h = [w * ga * d silu(gate) * up, w * ga * silu(gate)]``, ``wact = w * act`` (for down_proj's gradient)
    and ``grad_w[r] = sum_i ga * act`` (the routing weight's gradient, ``grad_out . expert output``). Task = a
    block of rows; the columns are looped. grad_h is an operator output, so the rows past the served ones (slots
    served elsewhere) get zeros (their loads are masked to 0) rather than whatever the buffer held."""
    n_valid = tl.load(bounds_ptr + num_experts)
    for block in tl.range(program_start(1), n_row_blocks, grid_stride(1)):
        rows = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        row_mask = rows < n_valid
        slots = tl.load(order_ptr + rows, mask=row_mask, other=0)
        w = tl.load(weights_ptr + (slots // top_k) * stride_wt + (slots % top_k) * stride_wk, mask=row_mask,
                    other=0.0).to(tl.float32)
        dot = tl.zeros([BLOCK_R], dtype=tl.float32)
        for col_start in tl.range(0, inter, BLOCK_I):
            cols = col_start + tl.arange(0, BLOCK_I).to(tl.int64)
            mask = row_mask[:, None] & (cols < inter)[None, :]
            out_mask = (rows < n_rows)[:, None] & (cols < inter)[None, :]
            ga = tl.load(grad_act_ptr + rows[:, None] * inter + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            h_ptrs = rows[:, None] * (2 * inter) + cols[None, :]
            gate = tl.load(h_ptr + h_ptrs, mask=mask, other=0.0).to(tl.float32)
            up = tl.load(h_ptr + h_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
            s = tl.sigmoid(gate)
            silu = gate * s
            act = (silu * up).to(wact_ptr.dtype.element_ty).to(tl.float32)  # rounded as the forward's act was
            dot += tl.sum(ga * act, axis=1)
            weighted = ga * w[:, None]
            d_silu = s * (1.0 + gate * (1.0 - s))
            tl.store(grad_h_ptr + h_ptrs, (weighted * up * d_silu).to(grad_h_ptr.dtype.element_ty), mask=out_mask)
            tl.store(grad_h_ptr + h_ptrs + inter, (weighted * silu).to(grad_h_ptr.dtype.element_ty), mask=out_mask)
            tl.store(wact_ptr + rows[:, None] * inter + cols[None, :],
                     (act * w[:, None]).to(wact_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_w_ptr + rows, dot, mask=row_mask)


@launched_kernel(do_not_specialize=["n_tokens", "n_tasks"])
def _fused_moe_combine_kernel(y_ptr, pos_ptr, keys_ptr, weights_ptr, out_ptr, n_tokens, n_tasks, n_col_blocks,
                              n_cols, top_k, num_experts, stride_wt, stride_wk, WEIGHTED: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """``out[t, :] = sum_k w[t, k] * y[pos[t * K + k], :]`` over the slots whose expert is below E (WEIGHTED; else
    the plain sum, the gradient of x), in slot order and fp32: deterministic, no atomics. Task = (token block,
    column block)."""
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        tokens = (task // n_col_blocks) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
        cols = (task % n_col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C).to(tl.int64)
        token_mask = tokens < n_tokens
        col_mask = cols < n_cols
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for k in tl.range(0, top_k):
            slots = tokens * top_k + k
            expert = tl.load(keys_ptr + slots, mask=token_mask, other=num_experts)
            valid = token_mask & (expert < num_experts)
            rows = tl.load(pos_ptr + slots, mask=valid, other=0)
            y = tl.load(y_ptr + rows[:, None] * n_cols + cols[None, :], mask=valid[:, None] & col_mask[None, :],
                        other=0.0).to(tl.float32)
            if WEIGHTED:
                w = tl.load(weights_ptr + tokens * stride_wt + k * stride_wk, mask=valid, other=0.0).to(tl.float32)
                y = y * w[:, None]
            acc += y
        tl.store(out_ptr + tokens[:, None] * n_cols + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=token_mask[:, None] & col_mask[None, :])


@launched_kernel(do_not_specialize=["n_tasks"])
def _fused_moe_mm_kernel(a_ptr, w_ptr, c_ptr, tile_expert_ptr, tile_row_ptr, bounds_ptr, n_tasks, n_col_blocks,
                         n_cols, depth, num_experts, stride_am, stride_ak, stride_we, stride_wn, stride_wk,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Grouped ``c[r, :] = a[r, :] @ w[e(r)].T`` over expert-sorted rows: a (rows, depth), w (E, n_cols, depth)
    with any strides, c (rows, n_cols) contiguous. Task = (row tile, column block); row tile j covers rows
    ``[tile_row[j], min(tile_row[j] + BLOCK_M, bounds[e + 1]))`` of expert ``e = tile_expert[j]`` (E: an unused
    tile of the fixed-size table). fp32 accumulation, 2-D loads, one store per tile."""
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        tile = task // n_col_blocks
        expert = tl.load(tile_expert_ptr + tile)
        if expert < num_experts:
            row_start = tl.load(tile_row_ptr + tile)
            row_end = tl.load(bounds_ptr + expert + 1)
            rows = row_start + tl.arange(0, BLOCK_M).to(tl.int64)
            cols = (task % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
            row_mask = rows < row_end
            col_mask = cols < n_cols
            w_base = w_ptr + expert * stride_we
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k_start in tl.range(0, depth, BLOCK_K):
                ks = k_start + tl.arange(0, BLOCK_K).to(tl.int64)
                k_mask = ks < depth
                a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                            mask=row_mask[:, None] & k_mask[None, :], other=0.0)
                b = tl.load(w_base + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                            mask=k_mask[:, None] & col_mask[None, :], other=0.0)
                if UPCAST:
                    a, b = a.to(tl.float32), b.to(tl.float32)
                if DOT_PRECISION == "":  # the backend's default (triton-ascend has no input_precision default)
                    acc += tl.dot(a, b)
                else:
                    acc += tl.dot(a, b, input_precision=DOT_PRECISION)
            tl.store(c_ptr + rows[:, None] * n_cols + cols[None, :], acc.to(c_ptr.dtype.element_ty),
                     mask=row_mask[:, None] & col_mask[None, :])


@launched_kernel(do_not_specialize=["n_tasks"])
def _fused_moe_wgrad_kernel(a_ptr, b_ptr, c_ptr, bounds_ptr, n_tasks, n_n_blocks, n_m_blocks, n_a, n_b,
                            stride_ar, stride_an, stride_br, stride_bm, stride_ce, stride_cn, stride_cm,
                            BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Per expert ``c[e] = a[rows of e].T @ b[rows of e]``: a (rows, n_a), b (rows, n_b), c (E, n_a, n_b) with any
    strides (e.g. both halves of one gradient). Task = (expert, n block, m block); an expert without rows stores
    zeros, so c needs no fill. The rows are summed in order: deterministic."""
    blocks = n_n_blocks * n_m_blocks
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        expert = task // blocks
        ns = ((task % blocks) // n_m_blocks) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        ms = (task % n_m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        n_mask = ns < n_a
        m_mask = ms < n_b
        row_start = tl.load(bounds_ptr + expert)
        row_end = tl.load(bounds_ptr + expert + 1)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for r_start in tl.range(row_start, row_end, BLOCK_R):
            rs = r_start + tl.arange(0, BLOCK_R).to(tl.int64)
            r_mask = rs < row_end
            a = tl.load(a_ptr + rs[:, None] * stride_ar + ns[None, :] * stride_an,
                        mask=r_mask[:, None] & n_mask[None, :], other=0.0)
            b = tl.load(b_ptr + rs[:, None] * stride_br + ms[None, :] * stride_bm,
                        mask=r_mask[:, None] & m_mask[None, :], other=0.0)
            if UPCAST:
                a, b = a.to(tl.float32), b.to(tl.float32)
            if DOT_PRECISION == "":
                acc += tl.dot(tl.trans(a), b)
            else:
                acc += tl.dot(tl.trans(a), b, input_precision=DOT_PRECISION)
        tl.store(c_ptr + expert * stride_ce + ns[:, None] * stride_cn + ms[None, :] * stride_cm,
                 acc.to(c_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@launched_kernel(do_not_specialize=["n_tasks"])
def _fused_moe_zero_empty_kernel(c_ptr, bounds_ptr, n_tasks, n_chunks, slab, chunk, BLOCK: tl.constexpr):
    """``c[e] = 0`` for every expert e without rows (``bounds[e] == bounds[e + 1]``); the other experts' slabs are
    not touched, so when every expert has rows a task costs two index loads. c is (E, slab) contiguous; task =
    (expert, chunk of ``chunk`` elements of its slab)."""
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        expert = task // n_chunks
        if tl.load(bounds_ptr + expert) == tl.load(bounds_ptr + expert + 1):
            start = expert * slab + (task % n_chunks) * chunk
            end = tl.minimum(start + chunk, (expert + 1) * slab)
            for offset in tl.range(start, end, BLOCK):
                idx = offset + tl.arange(0, BLOCK).to(tl.int64)
                tl.store(c_ptr + idx, tl.zeros((BLOCK,), dtype=c_ptr.dtype.element_ty), mask=idx < end)
