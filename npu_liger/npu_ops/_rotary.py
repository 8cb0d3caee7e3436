"""The rotary kernel shared by rope, qwen2vl_mrope and llama4_rope: rotate pairs of q and k columns per (batch, seq) row.

For every row (b, s), every head h and every pair j < half, with x1, x2 the pair's two columns of x = q or k:

    forward:   y1 = x1 * c1 - x2 * s1        backward (the rotation transposed):   g_x1 = g1 * c1 + g2 * s2
               y2 = x2 * c2 + x1 * s2                                             g_x2 = g2 * c2 - g1 * s1

Two layouts of the pairs (``INTERLEAVED`` switch):
- half-split (HF ``rotate_half``, rope / qwen2vl_mrope): x1 = x[j], x2 = x[half + j], c1 = cos[j], c2 = cos[half + j]
  (and the same for sin: the two halves of a cos/sin table need not be equal); columns from 2 * half up to
  head_dim pass through unchanged (partial rotary);
- interleaved (Llama-4's complex view): x1 = x[2j], x2 = x[2j + 1], c1 = c2 = Re(freqs[j]), s1 = s2 = Im(freqs[j]).

Inputs come in logical (bsz, seq, heads, head_dim) order with any strides (rope passes transposed views of HF's
(bsz, heads, seq, head_dim) tensors, so HF's usual layout is read row by row without a copy); outputs are new
tensors, contiguous in (bsz, seq, heads, head_dim). cos/sin are (bsz or 1, seq, n) strided views (batch stride 0
when broadcast). Each program walks rows in a persistent grid-stride loop, loads the row's cos/sin once and then
rotates the q heads and the k heads in tiles of BLOCK_QH / BLOCK_KH heads.

Only block sizes and the two switches are ``tl.constexpr``. Every argument that changes with batch or sequence
length (row count, seq_len, batch/seq/head strides) is in ``do_not_specialize``, so a new batch size or
sequence length never compiles another kernel variant (Triton would otherwise specialise integers equal to 1
or divisible by 16).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, plan_launch
from ._triton import grid_stride, program_start, require_launchable

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4).
# A head tile is (BLOCK_H, PAD_HD) elements, held as two (BLOCK_H, PAD_HD // 2) halves. Live per element of it:
#   x1/x2 upcast to fp32 (1), the raw loads before the upcast (<= 1), the two products of each output before
#   they are combined (1), y1/y2 before the cast (1) -> ~4 fp32 values -> memory_multiplier 4.0 (the seed's
#   analysis counts 3.0 for a kernel without the raw-load and product temporaries; 4.0 is the conservative
#   estimate, not a measurement). The pass-through copy of partial rotary moves half-width chunks and needs less.
# cos/sin of the row (4 vectors of PAD_HD // 2) are shared by all heads: a fixed PAD_HD * 2 elements, inside
#   the 20% safety margin. q tiles and k tiles are processed one after the other, never live together, so each
#   shape may use the whole budget.
# shapes: ((n_q_heads, pad_hd), (n_kv_heads, pad_hd)), tiling_dims: (0, 0) -> heads tiled, pad_hd fixed
#   (unit_param = pad_hd). Ascend910B3, head_dim 128: 196608 * 0.8 / (4.0 * 128 * 4 B) = 76 -> 64 heads per tile.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 4.0  # the same loop with the signs of the sin terms moved: same live values
COMPUTE_DTYPE_SIZE = 4

# Integer arguments that change with batch size or sequence length: never specialised (see module docstring).
SHAPE_DEPENDENT_ARGS = (
    "n_rows", "seq_len",
    "q_sb", "q_ss", "q_sh", "k_sb", "k_ss", "k_sh",
    "cos_sb", "cos_ss", "sin_sb", "sin_ss",
)


@triton.jit
def _rotate_heads(x_row, y_row, n_heads, x_sh, x_sd, head_dim, half, c1, s1, c2, s2,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                  BACKWARD: tl.constexpr):
    """Rotate all heads of one row of x (pointer ``x_row``) into the contiguous (heads, head_dim) row ``y_row``."""
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    if INTERLEAVED:
        col1 = pairs * 2
        col2 = pairs * 2 + 1
    else:
        col1 = pairs
        col2 = pairs + half
    for h0 in tl.range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)[:, None]
        head_mask = heads < n_heads
        mask = head_mask & (pairs < half)
        x_base = x_row + heads.to(tl.int64) * x_sh
        y_base = y_row + heads.to(tl.int64) * head_dim
        x1 = tl.load(x_base + col1 * x_sd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_base + col2 * x_sd, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(y_base + col1, y1.to(y_row.dtype.element_ty), mask=mask)
        tl.store(y_base + col2, y2.to(y_row.dtype.element_ty), mask=mask)
        if not INTERLEAVED:  # partial rotary: columns [2 * half, head_dim) are copied unchanged
            for p0 in tl.range(half * 2, head_dim, BLOCK_HALF):
                cols = p0 + pairs
                pass_mask = head_mask & (cols < head_dim)
                tl.store(y_base + cols, tl.load(x_base + cols * x_sd, mask=pass_mask, other=0.0), mask=pass_mask)


@triton.jit
def _rotary_rows(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, q_sd, k_sb, k_ss, k_sh, k_sd,
                 cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd,
                 BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr):
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    pair_mask = pairs < half
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):  # int64 row index, persistent grid
        b = row // seq_len
        s = row - b * seq_len
        cos_row = cos_ptr + b * cos_sb + s * cos_ss
        sin_row = sin_ptr + b * sin_sb + s * sin_ss
        c1 = tl.load(cos_row + pairs * cos_sd, mask=pair_mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_row + pairs * sin_sd, mask=pair_mask, other=0.0).to(tl.float32)
        if INTERLEAVED:
            c2 = c1
            s2 = s1
        else:
            c2 = tl.load(cos_row + (pairs + half) * cos_sd, mask=pair_mask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_row + (pairs + half) * sin_sd, mask=pair_mask, other=0.0).to(tl.float32)
        _rotate_heads(q_ptr + b * q_sb + s * q_ss, q_out_ptr + row * (n_q_heads * head_dim), n_q_heads, q_sh, q_sd,
                      head_dim, half, c1, s1, c2, s2, BLOCK_QH, BLOCK_HALF, INTERLEAVED, BACKWARD)
        _rotate_heads(k_ptr + b * k_sb + s * k_ss, k_out_ptr + row * (n_kv_heads * head_dim), n_kv_heads, k_sh, k_sd,
                      head_dim, half, c1, s1, c2, s2, BLOCK_KH, BLOCK_HALF, INTERLEAVED, BACKWARD)


@triton.jit(do_not_specialize=SHAPE_DEPENDENT_ARGS)
def _rotary_fwd_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                       n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                       q_sb, q_ss, q_sh, q_sd, k_sb, k_ss, k_sh, k_sd,
                       cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd,
                       BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       INTERLEAVED: tl.constexpr):
    _rotary_rows(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, q_sd, k_sb, k_ss, k_sh, k_sd,
                 cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd,
                 BLOCK_QH, BLOCK_KH, BLOCK_HALF, INTERLEAVED, False)


@triton.jit(do_not_specialize=SHAPE_DEPENDENT_ARGS)
def _rotary_bwd_kernel(grad_q_ptr, grad_k_ptr, cos_ptr, sin_ptr, grad_q_in_ptr, grad_k_in_ptr,
                       n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                       q_sb, q_ss, q_sh, q_sd, k_sb, k_ss, k_sh, k_sd,
                       cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd,
                       BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       INTERLEAVED: tl.constexpr):
    """grad_q/grad_k: gradients of the outputs (strides q_*/k_*); grad_q_in/grad_k_in: gradients of q and k."""
    _rotary_rows(grad_q_ptr, grad_k_ptr, cos_ptr, sin_ptr, grad_q_in_ptr, grad_k_in_ptr,
                 n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                 q_sb, q_ss, q_sh, q_sd, k_sb, k_ss, k_sh, k_sd,
                 cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd,
                 BLOCK_QH, BLOCK_KH, BLOCK_HALF, INTERLEAVED, True)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else triton.next_power_of_2(n)


def _request(n_q_heads: int, n_kv_heads: int, head_dim: int, memory_multiplier: float) -> TileRequest:
    pad_hd = next_power_of_2(head_dim)
    return TileRequest(memory_multiplier, ((n_q_heads, pad_hd), (n_kv_heads, pad_hd)), (0, 0), COMPUTE_DTYPE_SIZE)


def _batch_stride(table: torch.Tensor) -> int:
    return table.stride(0) if table.shape[0] > 1 else 0


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int,
              q_out: torch.Tensor, k_out: torch.Tensor, *, interleaved: bool, backward: bool) -> None:
    """Launch the rotary kernel. q/k: (bsz, seq, heads, head_dim) in any strides; cos/sin: (bsz or 1, seq, n)
    in any strides; q_out/k_out: new tensors contiguous in (bsz, seq, heads, head_dim). Inputs are checked by the
    calling op's launcher; this only launches."""
    bsz, seq_len, n_q_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    n_rows = bsz * seq_len
    if n_rows == 0 or head_dim == 0 or n_q_heads + n_kv_heads == 0:
        return
    require_launchable(q.device)
    multiplier = BACKWARD_MEMORY_MULTIPLIER if backward else FORWARD_MEMORY_MULTIPLIER
    plan = plan_launch(q.device.type, _request(n_q_heads, n_kv_heads, head_dim, multiplier))
    (block_qh, pad_hd), (block_kh, _) = plan.tiles
    kernel = _rotary_bwd_kernel if backward else _rotary_fwd_kernel
    kernel[(plan.grid(n_rows),)](
        q, k, cos, sin, q_out, k_out,
        n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
        *q.stride(), *k.stride(),
        _batch_stride(cos), cos.stride(1), cos.stride(2), _batch_stride(sin), sin.stride(1), sin.stride(2),
        BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=max(1, pad_hd // 2), INTERLEAVED=interleaved,
        **plan.launch_options(),
    )


def head_tiles(device_type: str, n_q_heads: int, n_kv_heads: int, head_dim: int,
               backward: bool = False) -> Tuple[int, int]:
    """(BLOCK_QH, BLOCK_KH) the launcher would use (tests and benchmarks read it)."""
    multiplier = BACKWARD_MEMORY_MULTIPLIER if backward else FORWARD_MEMORY_MULTIPLIER
    (block_qh, _), (block_kh, _) = plan_launch(device_type, _request(n_q_heads, n_kv_heads, head_dim, multiplier)).tiles
    return block_qh, block_kh
