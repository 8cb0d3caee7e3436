"""The rotary family's host code (rope, qwen2vl_mrope, llama4_rope): the shared input checks, the launch policy and
memory analysis of the one rotary kernel (``_rotary_kernels.py``: what it computes, its layouts and switches), and
the launch itself. Each op's file adds only its own table checks and launcher.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch

from ..tiling import TileRequest, memoised_plan, next_power_of_2, plan_launch
from ._rotary_kernels import SHAPE_DEPENDENT_ARGS, _rotary_bwd_kernel, _rotary_fwd_kernel  # noqa: F401 (tests)
from ._triton import COMPUTE_DTYPE_SIZE, SUPPORTED_DTYPES, check_float_tensor, require_launchable

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4).
# A head tile is (BLOCK_H, PAD_HD) elements, held as two (BLOCK_H, PAD_HD // 2) halves. Live per element of it:
#   x1/x2 upcast to fp32 (1), the raw loads before the upcast (<= 1), the two products of each output before
#   they are combined (1), y1/y2 before the cast (1) -> ~4 fp32 values -> memory_multiplier 4.0 (Liger's RoPE
#   example in docs/UB_MANAGER.md counts 3.0 for a kernel without the raw-load and product temporaries; 4.0 is the
#   conservative estimate, not a measurement). The pass-through copy of partial rotary moves half-width chunks.
# The interleaved layout also holds the whole loaded row, its (BLOCK_H, BLOCK_HALF, 2) view, the split x1/x2, the
#   joined y and its cast: on the NPU these are buffers, not register views. The Ascend check's headroom probe
#   (scripts/ascend_check.py) puts the largest fitting tile at multipliers in (4.8, 9.6] on Ascend910B3 (64 heads
#   of 128 overflow the UB 2x); 6.0 sits inside that range -> INTERLEAVED_MEMORY_MULTIPLIER (forward and backward).
# cos/sin of the row (4 vectors of PAD_HD // 2) are shared by all heads: a fixed PAD_HD * 2 elements, inside
#   the 20% safety margin. q tiles and k tiles are processed one after the other, never live together, so each
#   shape may use the whole budget.
# shapes: ((n_q_heads, pad_hd), (n_kv_heads, pad_hd)), tiling_dims: (0, 0) -> heads tiled, pad_hd fixed
#   (unit_param = pad_hd). Ascend910B3, head_dim 128: 196608 * 0.8 / (4.0 * 128 * 4 B) = 76 -> 64 heads per tile.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 4.0  # the same loop with the signs of the sin terms moved: same live values
INTERLEAVED_MEMORY_MULTIPLIER = 6.0
VECTOR_BYTES = 16  # widest global access of one thread on CUDA (ld.global.v4.b32)
# CUDA: warps per program (the tile budget gives (16, 128)-element q tiles at head_dim 128). Measured on an H200
# (bsz 4, seq 4096, 32/8 heads, bf16, one program per row), forward kernel:
# - half-split (rope): 0.0912 ms with 2 warps, 0.0940 with 4 (the tile-size default), 0.1008 with 8; (32, 128)
#   tiles were slower (0.109 with 4 or 8 warps). Two warps give each thread 16 elements of each half-tile.
# - interleaved (llama4): 4 warps, 0.087 ms forward and backward (0.91 of copy bandwidth, profiler kernel time);
#   with 2 warps the pair split/join goes through shared memory.
CUDA_NUM_WARPS = {False: 2, True: 4}  # by INTERLEAVED

# mrope table reads (``PLANE_MASKS`` switch). CUDA: three masked vector loads per table vector, one per plane (a
# masked-off lane reads nothing), 0.0905 ms forward on the H200 shape above vs 0.124 for the per-column gather
# (scalar loads). triton-ascend 3.2 crashes intermittently (ConvertTritonIRToLinalgIR) on the masked form, so the
# NPU and the CPU interpreter (which emulates the NPU) use the gather: each column's offset picks its plane.
PLANE_MASK_BACKENDS = ("cuda",)  # tests add "cpu" to run the masked form in the interpreter

TABLE_DTYPES = (*SUPPORTED_DTYPES, torch.float64)  # cos/sin; float64 is rounded to float32 before the launch


def check_qk(q: torch.Tensor, k: torch.Tensor, names: Sequence[str] = ("q", "k"),
             layout: str = "(bsz, heads, seq, head_dim)", seq_dim: int = 2) -> None:
    """q and k: supported float dtype, 4-D, same dtype and device, equal bsz, seq and head_dim."""
    q_name, k_name = names
    check_float_tensor(q_name, q)
    check_float_tensor(k_name, k)
    for name, t in ((q_name, q), (k_name, k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"{k_name} must have the dtype of {q_name} ({q.dtype}), got {k.dtype}")
    if k.device != q.device:
        raise RuntimeError(f"{k_name} must be on the device of {q_name} ({q.device}), got {k.device}")
    for dim, what in ((0, "bsz"), (seq_dim, "seq"), (3, "head_dim")):
        if k.shape[dim] != q.shape[dim]:
            raise ValueError(
                f"{k_name} must match {q_name} in {what} (dim {dim}): {q_name} has shape {tuple(q.shape)}, "
                f"{k_name} has shape {tuple(k.shape)} ({layout_hint(names, layout)})"
            )


def layout_hint(names: Sequence[str] = ("q", "k"), layout: str = "(bsz, heads, seq, head_dim)") -> str:
    """What the q/k layout is, for errors a tensor in the other layout runs into."""
    hint = f"{names[0]} and {names[1]} are {layout}"
    if layout == "(bsz, heads, seq, head_dim)":
        hint += ", e.g. q.transpose(1, 2) of Hugging Face's (bsz, seq, heads, head_dim) projections"
    return hint


def check_cos_sin(cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, q_name: str = "q") -> None:
    """cos and sin: float, same shape/dtype/device as each other, on q's device."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in TABLE_DTYPES:
            raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin must have the dtype of cos ({cos.dtype}), got {sin.dtype}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise RuntimeError(f"{name} must be on the device of {q_name} ({q.device}), got {t.device}")


def new_rope_output(x: torch.Tensor) -> torch.Tensor:
    """A new (bsz, heads, seq, head_dim) tensor laid out as (bsz, seq, heads, head_dim) memory (HF's q/k layout).
    Metadata only: fakes call it too."""
    bsz, heads, seq_len, head_dim = x.shape
    return torch.empty_strided(
        (bsz, heads, seq_len, head_dim), (seq_len * heads * head_dim, head_dim, heads * head_dim, 1),
        dtype=x.dtype, device=x.device,
    )


def _seq_major_strides(x: torch.Tensor):
    """x (bsz, heads, seq, head_dim) with unit stride along head_dim (copied otherwise, rare): (x, its
    (batch, seq, head) strides)."""
    sb, sh, ss, sd = x.stride()
    if sd != 1:
        x = x.contiguous()
        sb, sh, ss, sd = x.stride()
    return x, (sb, ss, sh)


def table_strides(table: torch.Tensor, plane: int = 0):
    """(plane, batch, seq) element strides of a (..., [bsz or 1,] seq, n) table; batch 0 when broadcast."""
    stride, shape = table.stride(), table.shape
    batch = stride[-3] if table.dim() >= 3 and shape[-3] > 1 else 0
    return plane, batch, stride[-2]


def table_pair(cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as the kernel reads them: float64 rounded to float32 (no fp64 inside kernels; a table is small),
    unit stride along columns and the same strides for both (copied otherwise, rare)."""
    if cos.dtype == torch.float64:
        cos, sin = cos.float(), sin.float()
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def launch_half_split(q, k, cos, sin, *, backward: bool, mrope_sections=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Checked inputs -> new outputs through the half-split kernel (rope; qwen2vl_mrope with
    ``mrope_sections`` = (sec1, sec2) and (3, bsz or 1, seq, head_dim) tables)."""
    q_out, k_out = new_rope_output(q), new_rope_output(k)
    bsz, n_q_heads, seq_len, head_dim = q.shape
    dims = (bsz, seq_len, n_q_heads, k.shape[1], head_dim)
    q, q_strides = _seq_major_strides(q)
    k, k_strides = _seq_major_strides(k)
    cos, sin = table_pair(cos, sin)
    mrope = mrope_sections is not None
    rotate_qk(q, k, q_out, k_out, cos, sin, dims, q_strides, k_strides,
              table_strides(cos, cos.stride(0) if mrope else 0), cos.shape[-1] // 2,
              mrope_sections if mrope else (0, 0), interleaved=False, mrope=mrope, backward=backward)
    return q_out, k_out


def _request(n_q_heads: int, n_kv_heads: int, head_dim: int, memory_multiplier: float,
             interleaved: bool = False) -> TileRequest:
    pad_hd = max(1, next_power_of_2(head_dim))
    return TileRequest(memory_multiplier, ((n_q_heads, pad_hd), (n_kv_heads, pad_hd)), (0, 0), COMPUTE_DTYPE_SIZE,
                       cuda_num_warps=CUDA_NUM_WARPS[interleaved])


@memoised_plan
def _launch_config(device_type: str, n_q_heads: int, n_kv_heads: int, head_dim: int, backward: bool,
                   interleaved: bool = False):
    """(BLOCK_QH, BLOCK_KH, BLOCK_HALF, plan, launch options) of the backend's launch policy (memoised: the
    per-call host cost matters for a kernel this short)."""
    if interleaved:
        multiplier = INTERLEAVED_MEMORY_MULTIPLIER
    else:
        multiplier = BACKWARD_MEMORY_MULTIPLIER if backward else FORWARD_MEMORY_MULTIPLIER
    plan = plan_launch(device_type, _request(n_q_heads, n_kv_heads, head_dim, multiplier, interleaved))
    (block_qh, pad_hd), (block_kh, _) = plan.tiles
    return block_qh, block_kh, max(1, pad_hd // 2), plan, plan.launch_options()


def _vec(max_vec: int, g: int) -> int:
    """Largest power of two <= max_vec that divides g (g = 0: max_vec)."""
    return min(max_vec, g & -g) if g else max_vec


def rotate_qk(q: torch.Tensor, k: torch.Tensor, q_out: torch.Tensor, k_out: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, dims, q_strides, k_strides, table_strides, half: int,
              sections=(0, 0), *, interleaved: bool, mrope: bool = False, backward: bool) -> None:
    """Launch the rotary kernel.

    dims = (bsz, seq_len, n_q_heads, n_kv_heads, head_dim). q/k: tensors whose logical (bsz, seq, heads,
    head_dim) element strides are ``q_strides``/``k_strides`` = (batch, seq, head) (unit stride along head_dim);
    q_out/k_out: new tensors contiguous in (bsz, seq, heads, head_dim). cos/sin: tables with element strides
    ``table_strides`` = (plane, batch, seq) (batch 0 when broadcast; plane only with ``mrope``) and unit stride
    along columns (interleaved: the float (re, im) view of the complex frequencies; ``sin`` is unused).
    ``sections``: the mrope section boundaries (sec1, sec2). Inputs are checked by the calling op's launcher;
    this only launches.
    """
    bsz, seq_len, n_q_heads, n_kv_heads, head_dim = dims
    if bsz * seq_len == 0 or head_dim == 0 or n_q_heads + n_kv_heads == 0:
        return
    if not q.is_cuda:
        require_launchable(q.device)
    plane_masks = mrope and q.device.type in PLANE_MASK_BACKENDS
    grid, int_args, constexprs = _launch_arguments(q.device.type, dims, q_strides, k_strides, table_strides, half,
                                                   sections, q.element_size(), cos.element_size(), interleaved,
                                                   mrope, plane_masks, backward)
    kernel = _rotary_bwd_kernel if backward else _rotary_fwd_kernel
    kernel[grid](q, k, cos, sin, q_out, k_out, *int_args, **constexprs)


@memoised_plan
def _launch_arguments(device_type: str, dims, q_strides, k_strides, table_strides, half: int, sections,
                      q_element_size: int, table_element_size: int, interleaved: bool, mrope: bool,
                      plane_masks: bool, backward: bool):
    """(grid, the kernel's int arguments after its six tensors, its constexprs and launch options) of a
    ``rotate_qk`` call: a function of the call's sizes, strides and element sizes only, so memoised on them
    (``memoised_plan``: the gcds, vector widths and plan lookup are ~7 µs of host time per launch on a CI-class
    CPU, and the rotary ops' forward+backward is host-bound at training sizes)."""
    bsz, seq_len, n_q_heads, n_kv_heads, head_dim = dims
    block_qh, block_kh, block_half, plan, options = _launch_config(device_type, n_q_heads, n_kv_heads, head_dim,
                                                                   backward, interleaved)
    q_sb, q_ss, q_sh = q_strides
    k_sb, k_ss, k_sh = k_strides
    t_sp, t_sb, t_ss = table_strides
    if bsz == 1:  # the stride of a size-1 dim is never used (and may be anything): keep it out of VEC
        q_sb = k_sb = 0
    if seq_len == 1:
        q_ss = k_ss = t_ss = 0
    sec1, sec2 = sections
    vec = _vec(VECTOR_BYTES // q_element_size, math.gcd(q_sb, q_ss, q_sh, k_sb, k_ss, k_sh))
    tvec = _vec(VECTOR_BYTES // table_element_size, math.gcd(t_sp, t_sb, t_ss, sec1, sec2))
    n_rows = bsz * seq_len
    int_args = (n_rows, seq_len, n_q_heads, n_kv_heads, head_dim, half,
                q_sb // vec, q_ss // vec, q_sh // vec, k_sb // vec, k_ss // vec, k_sh // vec,
                t_sp // tvec, t_sb // tvec, t_ss // tvec, sec1 // tvec, sec2 // tvec)
    constexprs = dict(BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=block_half, VEC=vec, TVEC=tvec,
                      INTERLEAVED=interleaved, MROPE=mrope, PLANE_MASKS=plane_masks, **options)
    return (plan.grid(n_rows),), int_args, constexprs


def head_tiles(device_type: str, n_q_heads: int, n_kv_heads: int, head_dim: int,
               backward: bool = False, interleaved: bool = False) -> Tuple[int, int]:
    """(BLOCK_QH, BLOCK_KH) the launcher would use (tests and benchmarks read it)."""
    block_qh, block_kh, *_ = _launch_config(device_type, n_q_heads, n_kv_heads, head_dim, backward, interleaved)
    return block_qh, block_kh
