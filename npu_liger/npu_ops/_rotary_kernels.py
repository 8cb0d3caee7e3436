"""The rotary kernel shared by rope, qwen2vl_mrope and llama4_rope: rotate pairs of q and k columns per (batch, seq)
row.

For every row (b, s), every head h and every pair j < half, with x1, x2 the pair's two columns of x = q or k:

    forward:   y1 = x1 * c1 - x2 * s1        backward (the rotation transposed):   g_x1 = g1 * c1 + g2 * s2
               y2 = x2 * c2 + x1 * s2                                             g_x2 = g2 * c2 - g1 * s1

Two layouts of the pairs (``INTERLEAVED`` switch):
- half-split (HF ``rotate_half``, rope / qwen2vl_mrope): x1 = x[j], x2 = x[half + j], c1 = cos[j], c2 = cos[half + j]
  (and the same for sin: the two halves of a cos/sin table need not be equal); columns from 2 * half up to
  head_dim pass through unchanged (partial rotary). x1 and x2 are two contiguous half-rows of a head: each is
  loaded as one contiguous block.
- interleaved (Llama-4's complex view): x1 = x[2j], x2 = x[2j + 1], c1 = c2 = Re(freqs[j]), s1 = s2 = Im(freqs[j]).
  A head's row is loaded whole (contiguous), viewed as (pairs, 2) and split into x1/x2 in registers
  (``tl.reshape`` + ``tl.split``); the rotated pairs are joined back (``tl.join``) and stored as one contiguous
  row. No strided (every other element) load or store.

Tables (``MROPE`` switch, half-split only): cos/sin rows are read at ``b * t_sb + s * t_ss`` (t_sb = 0 when the
table is broadcast over the batch). With ``MROPE`` the table has three planes (temporal, height, width) ``t_sp``
apart and column j (and half + j) is read from plane 0, 1 or 2 by the section boundaries ``sec1 <= sec2``:
Qwen2-VL's ``mrope_section * 2`` merge done in the kernel (no merged table is ever written): on CUDA as three
masked vector loads per table vector (a masked-off lane reads nothing, so each column is read once, from its
plane), elsewhere as a gather (``PLANE_MASKS`` switch, see PLANE_MASK_BACKENDS).
Interleaved: the table is the float32 (re, im) view of the complex frequencies; ``sin_ptr`` is unused.

Inputs come in logical (bsz, seq, heads, head_dim) order with unit stride along head_dim and any other strides
(rope passes HF's (bsz, heads, seq, head_dim) views, read row by row without a copy); outputs are new tensors,
contiguous in (bsz, seq, heads, head_dim). Each program walks rows in a grid-stride loop, loads the row's cos/sin
once and then rotates the q heads and the k heads in tiles of BLOCK_QH / BLOCK_KH heads.

Specialisation and vector access. Every argument that changes with batch or sequence length (row count, seq_len,
batch/seq/head strides, table strides) is in ``do_not_specialize``, so a new batch size or sequence length never
compiles another kernel variant. Unspecialised strides would hide their alignment from the compiler (no 16-byte
vector loads), so the q/k strides are passed in units of ``VEC`` elements (a constexpr chosen by the host: the
largest power of two <= 16 bytes that divides them all) and multiplied back in the kernel: every row and head
start is then a known multiple of VEC elements. head_dim, half and the head counts are model constants and
stay specialised (Triton marks them divisible by 16 when they are). The cos/sin table strides and the mrope
section boundaries are passed the same way, in units of ``TVEC`` elements of the table's dtype (the boundaries in
those units keep the plane masks constant over a vector).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton import grid_stride, launched_kernel, program_start

# Integer arguments that change with batch size or sequence length: never specialised (see module docstring).
SHAPE_DEPENDENT_ARGS = (
    "n_rows", "seq_len",
    "q_sb", "q_ss", "q_sh", "k_sb", "k_ss", "k_sh",
    "t_sp", "t_sb", "t_ss",
)


@triton.jit
def _rotate_heads(x_row, y_row, n_heads, x_sh, head_dim, half, c1, s1, c2, s2,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, VEC: tl.constexpr,
                  INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr):
    """Rotate all heads of one row of x (pointer ``x_row``, head stride ``x_sh`` in VEC units) into the
    contiguous (heads, head_dim) row ``y_row``. c1/s1/c2/s2: (1, BLOCK_HALF) fp32."""
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    for h0 in tl.range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)[:, None]
        head_mask = heads < n_heads
        x_base = x_row + (heads.to(tl.int64) * x_sh) * VEC
        y_base = y_row + heads.to(tl.int64) * head_dim
        if INTERLEAVED:
            cols = tl.arange(0, 2 * BLOCK_HALF)[None, :]
            mask = head_mask & (cols < head_dim)
            x = tl.load(x_base + cols, mask=mask, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_HALF, 2)))
        else:
            mask = head_mask & (pairs < half)
            x1 = tl.load(x_base + pairs, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(x_base + half + pairs, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        if INTERLEAVED:
            y = tl.reshape(tl.join(y1, y2), (BLOCK_H, 2 * BLOCK_HALF))
            tl.store(y_base + cols, y.to(y_row.dtype.element_ty), mask=mask)
        else:
            tl.store(y_base + pairs, y1.to(y_row.dtype.element_ty), mask=mask)
            tl.store(y_base + half + pairs, y2.to(y_row.dtype.element_ty), mask=mask)
            for p0 in tl.range(half * 2, head_dim, BLOCK_HALF):  # partial rotary: the other columns unchanged
                cols = p0 + pairs
                pass_mask = head_mask & (cols < head_dim)
                tl.store(y_base + cols, tl.load(x_base + cols, mask=pass_mask, other=0.0), mask=pass_mask)


@triton.jit
def _plane_merge(ptrs, plane, in0, in1, in2):
    """fp32 values of ``ptrs`` (plane 0) where in0, of ``ptrs + plane`` where in1, of ``ptrs + 2 * plane`` where in2."""
    v = tl.load(ptrs, mask=in0, other=0.0).to(tl.float32)
    v += tl.load(ptrs + plane, mask=in1, other=0.0).to(tl.float32)
    v += tl.load(ptrs + plane * 2, mask=in2, other=0.0).to(tl.float32)
    return v


@triton.jit
def _rotary_rows(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, t_sp, t_sb, t_ss, sec1, sec2,
                 BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, VEC: tl.constexpr,
                 TVEC: tl.constexpr, INTERLEAVED: tl.constexpr, MROPE: tl.constexpr, PLANE_MASKS: tl.constexpr,
                 BACKWARD: tl.constexpr):
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    pair_mask = pairs < half
    if MROPE:  # columns [0, sec1) from plane 0, [sec1, sec2) from plane 1, [sec2, half) from plane 2 (both halves)
        bound1 = sec1 * TVEC
        bound2 = sec2 * TVEC
        plane = t_sp * TVEC
        if PLANE_MASKS:
            in0 = pair_mask & (pairs < bound1)
            in1 = pair_mask & (pairs >= bound1) & (pairs < bound2)
            in2 = pair_mask & (pairs >= bound2)
        else:
            t_cols = pairs + ((pairs >= bound1).to(tl.int64) + (pairs >= bound2).to(tl.int64)) * plane
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):  # int64 row index
        b = row // seq_len
        s = row - b * seq_len
        t_row = (b * t_sb + s * t_ss) * TVEC
        if INTERLEAVED:  # (re, im) pairs of the complex table
            c1 = tl.load(cos_ptr + t_row + pairs * 2, mask=pair_mask, other=0.0).to(tl.float32)
            s1 = tl.load(cos_ptr + t_row + pairs * 2 + 1, mask=pair_mask, other=0.0).to(tl.float32)
            c2 = c1
            s2 = s1
        elif MROPE and PLANE_MASKS:  # three masked vector loads: each column is read from its own plane only
            c1 = _plane_merge(cos_ptr + t_row + pairs, plane, in0, in1, in2)
            s1 = _plane_merge(sin_ptr + t_row + pairs, plane, in0, in1, in2)
            c2 = _plane_merge(cos_ptr + t_row + half + pairs, plane, in0, in1, in2)
            s2 = _plane_merge(sin_ptr + t_row + half + pairs, plane, in0, in1, in2)
        elif MROPE:  # a gather: each column's offset picks its plane
            c1 = tl.load(cos_ptr + t_row + t_cols, mask=pair_mask, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + t_row + t_cols, mask=pair_mask, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + t_row + half + t_cols, mask=pair_mask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + t_row + half + t_cols, mask=pair_mask, other=0.0).to(tl.float32)
        else:
            c1 = tl.load(cos_ptr + t_row + pairs, mask=pair_mask, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + t_row + pairs, mask=pair_mask, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + t_row + half + pairs, mask=pair_mask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + t_row + half + pairs, mask=pair_mask, other=0.0).to(tl.float32)
        _rotate_heads(q_ptr + (b * q_sb + s * q_ss) * VEC, q_out_ptr + row * (n_q_heads * head_dim), n_q_heads, q_sh,
                      head_dim, half, c1, s1, c2, s2, BLOCK_QH, BLOCK_HALF, VEC, INTERLEAVED, BACKWARD)
        _rotate_heads(k_ptr + (b * k_sb + s * k_ss) * VEC, k_out_ptr + row * (n_kv_heads * head_dim), n_kv_heads, k_sh,
                      head_dim, half, c1, s1, c2, s2, BLOCK_KH, BLOCK_HALF, VEC, INTERLEAVED, BACKWARD)


@launched_kernel(do_not_specialize=SHAPE_DEPENDENT_ARGS)
def _rotary_fwd_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                       n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                       q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, t_sp, t_sb, t_ss, sec1, sec2,
                       BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       VEC: tl.constexpr, TVEC: tl.constexpr, INTERLEAVED: tl.constexpr, MROPE: tl.constexpr,
                       PLANE_MASKS: tl.constexpr):
    _rotary_rows(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, t_sp, t_sb, t_ss, sec1, sec2,
                 BLOCK_QH, BLOCK_KH, BLOCK_HALF, VEC, TVEC, INTERLEAVED, MROPE, PLANE_MASKS, False)


@launched_kernel(do_not_specialize=SHAPE_DEPENDENT_ARGS)
def _rotary_bwd_kernel(grad_q_ptr, grad_k_ptr, cos_ptr, sin_ptr, grad_q_in_ptr, grad_k_in_ptr,
                       n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                       q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, t_sp, t_sb, t_ss, sec1, sec2,
                       BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       VEC: tl.constexpr, TVEC: tl.constexpr, INTERLEAVED: tl.constexpr, MROPE: tl.constexpr,
                       PLANE_MASKS: tl.constexpr):
    """grad_q/grad_k: gradients of the outputs (strides q_*/k_*); grad_q_in/grad_k_in: gradients of q and k."""
    _rotary_rows(grad_q_ptr, grad_k_ptr, cos_ptr, sin_ptr, grad_q_in_ptr, grad_k_in_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, t_sp, t_sb, t_ss, sec1, sec2,
                 BLOCK_QH, BLOCK_KH, BLOCK_HALF, VEC, TVEC, INTERLEAVED, MROPE, PLANE_MASKS, True)
