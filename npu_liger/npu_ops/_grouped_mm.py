"""The grouped matmuls of ``fused_moe`` over expert-sorted rows, and the one switch that picks their implementation.

Two products, each with a Triton kernel (``_moe_kernels.py``) that runs on every backend (triton-ascend, CUDA,
the CPU interpreter) and, on CUDA, torch's ``torch._grouped_mm`` (CUTLASS) where it applies:

- ``grouped_linear(a, w, routing, out_dtype)``: ``c[r] = a[r] @ w[e(r)].T``, a (rows, K), w (E, N, K) in any
  layout (transposed views are free), c (rows, N) in a's dtype or ``out_dtype`` (Triton stores its fp32
  accumulator in that dtype; torch's kernel returns a's dtype, converted). Rows of no expert (from
  ``bounds[E]`` on) are left unwritten.
- ``grouped_weight_grad(a, b, routing)``: ``c[e] = a[rows of e].T @ b[rows of e]``, c (E, a.shape[1],
  b.shape[1]); an expert without rows gets zeros.

The switch: ``NPU_LIGER_MOE_GROUPED_MM`` = ``auto`` (default, ``DEFAULT_CHOICE``): torch's kernel where it
applies, else Triton; ``triton``: always Triton; ``torch``: torch's kernel where it applies (the same as auto, but
says what the caller wants). torch's applies on CUDA, torch >= 2.8 with ``torch._grouped_mm``, bf16 operands (its
CUTLASS path is bf16-only; others take a slow loop or raise), each operand with one unit stride in its last two
dims, 16-byte aligned data and other strides (torch raises "strides should be multiple of 16 bytes" otherwise),
and output rows of a multiple of 16 bytes: torch 2.11 accepted a (rows, 38) bf16 output (I = 19) and returned
wrong values (measured on an H200: 1.7 relative error), so N must be a multiple of 8 too. In short: H and I
multiples of 8. Read per call (also under torch.compile: the op is opaque and decides at run time).

Triton tiles (``MM_TILES``): fixed per backend, never autotuned and never derived from the data, so the tile
tables' sizes and the grid depend only on shapes; the persistent grid is capped at the plan's program count (the
vector cores on an NPU: far below Ascend's 32768-program limit that Liger-Kernel's MoE ran into).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._moe_kernels import (ZERO_EMPTY_MEMORY_MULTIPLIER, _fused_moe_mm_kernel, _fused_moe_wgrad_kernel,
                           _fused_moe_zero_empty_kernel)
from ._triton import cdiv, flat_plan, interpreter_enabled

GROUPED_MM_ENV = "NPU_LIGER_MOE_GROUPED_MM"
DEFAULT_CHOICE = "auto"
CHOICES = ("auto", "triton", "torch")


@dataclass(frozen=True)
class MMTiles:
    block_m: int  # rows per tile (the routing's tile tables are built for this value)
    block_n: int
    block_k: int
    num_warps: int = 4  # CUDA only
    num_stages: int = 3  # CUDA only


# npu: 64x128 fp32 accumulator (32 KiB) and 64-deep operand tiles, the cube unit's L0A/L0B (64 KiB each) hold
# one 64x64 and one 64x128 bf16 tile with room for double buffering. cpu: the NPU's (the CPU backend emulates an
# Ascend chip); tests shrink them to make every loop turn. cuda: a common starting point for Hopper grouped GEMMs.
MM_TILES = {"npu": MMTiles(64, 128, 64), "cpu": MMTiles(64, 128, 64), "cuda": MMTiles(64, 128, 64, 4, 3)}


def tiles_for(device_type: str) -> MMTiles:
    return MM_TILES.get(device_type, MM_TILES["npu"])


def choice() -> str:
    value = os.environ.get(GROUPED_MM_ENV, DEFAULT_CHOICE)
    if value not in CHOICES:
        raise ValueError(f"{GROUPED_MM_ENV} must be one of {CHOICES}, got {value!r}")
    return value


def _aligned(t: torch.Tensor) -> bool:
    """torch's own layout check, answered instead of raised: the data pointer 16-byte aligned; the last dim of unit
    stride with the row stride at least the row's length (else the second-to-last of unit stride with the column
    stride at least the column's length), that other stride a multiple of 16 bytes. Checked in torch's order: a
    (rows, 1) tensor of strides (1, 1) counts as row-major and fails (H = 1). Our addition: the expert stride of
    a 3-D operand 16-byte aligned too (each expert's matrix starts on its own 16 bytes)."""
    align = 16 // t.element_size()
    stride_m, stride_n = t.stride()[-2:]
    size_m, size_n = t.shape[-2:]
    if t.data_ptr() % 16 or any(s % align for s in t.stride()[:-2]):
        return False
    if stride_n == 1 and stride_m >= max(1, size_n):
        return stride_m % align == 0
    if stride_m == 1 and stride_n >= max(1, size_m):
        return stride_n % align == 0
    return False


def torch_grouped_mm_applies(*operands: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes these operands (module docstring), under the current switch: the
    operands aligned and the product's rows (the last operand's last dim) a multiple of 16 bytes."""
    if choice() == "triton":
        return False
    first, last = operands[0], operands[-1]
    return (first.device.type == "cuda" and hasattr(torch, "_grouped_mm")
            and all(t.dtype == torch.bfloat16 for t in operands) and all(map(_aligned, operands))
            and (last.shape[-1] * last.element_size()) % 16 == 0)


def _dot_precision(device_type: str, dtype: torch.dtype):
    """fp32 products as torch computes them on CUDA (IEEE unless TF32 is allowed); the backend's default
    elsewhere ("": ``tl.dot`` without ``input_precision``, which triton-ascend cannot resolve)."""
    if device_type == "cuda" and dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return ""


def _grid(device_type: str, n_tasks: int) -> int:
    # flat_plan(…, 1, …): only its persistent-grid cap is used (the tiles are MM_TILES)
    return flat_plan(device_type, 1, 1.0).grid(n_tasks)


def _cuda_options(device_type: str, tiles: MMTiles) -> dict:
    return {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages} if device_type == "cuda" else {}


def grouped_linear(a: torch.Tensor, w: torch.Tensor, routing, out_dtype=None) -> torch.Tensor:
    """``c[r] = a[r] @ w[e(r)].T`` (module docstring) in ``out_dtype`` (default a's). ``routing``:
    ``fused_moe.Routing``."""
    rows, n_cols = a.shape[0], w.shape[1]
    if rows and n_cols and torch_grouped_mm_applies(a, w.transpose(1, 2)):
        # torch 2.13 wants the output in mat_a's dtype ("Grouped gemm output dtype must match `mat_a` dtype")
        c = torch._grouped_mm(a, w.transpose(1, 2), offs=routing.group_ends_i32())
        return c if out_dtype is None else c.to(out_dtype)
    # allocated only here: an unused (T*K, H) buffer beside torch's output sat in the MoE backward's memory peak
    # (benchmarks/memory_peak.py, BENCHMARKS round thirteen)
    c = torch.empty((rows, n_cols), dtype=out_dtype or a.dtype, device=a.device)
    if rows == 0 or n_cols == 0:
        return c
    device = a.device.type
    tiles = routing.tiles
    n_col_blocks = cdiv(n_cols, tiles.block_n)
    n_tasks = routing.n_tiles * n_col_blocks
    _fused_moe_mm_kernel[(_grid(device, n_tasks),)](
        a, w, c, routing.tile_expert, routing.tile_row, routing.bounds, n_tasks, n_col_blocks, n_cols, a.shape[1],
        routing.num_experts, a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        DOT_PRECISION=_dot_precision(device, a.dtype), UPCAST=interpreter_enabled(), **_cuda_options(device, tiles))
    return c


# Chunks per expert slab in ``zero_experts_without_rows``: enough programs to zero an empty expert's slab
# quickly, few enough that the check of every expert's row count costs next to nothing.
ZERO_EMPTY_CHUNKS = 16


def zero_experts_without_rows(c: torch.Tensor, routing) -> torch.Tensor:
    """``c[e] = 0`` in place for every expert without rows, read from ``routing.bounds`` on the device (no host
    synchronisation); returns c (contiguous, as torch's grouped matmul returns it). Only those slabs are written: a
    ``torch.where`` over c would read and write every expert's gradient once more."""
    assert c.is_contiguous(), "zero_experts_without_rows writes c as (E, slab) rows"
    experts = c.shape[0]
    slab = c[0].numel() if experts else 0
    if slab == 0:
        return c
    plan = flat_plan(c.device.type, slab, ZERO_EMPTY_MEMORY_MULTIPLIER)
    chunk = cdiv(cdiv(slab, ZERO_EMPTY_CHUNKS), plan.block) * plan.block
    n_chunks = cdiv(slab, chunk)
    n_tasks = experts * n_chunks
    _fused_moe_zero_empty_kernel[(plan.grid(n_tasks),)](c, routing.bounds, n_tasks, n_chunks, slab, chunk,
                                                        BLOCK=plan.block, **plan.launch_options())
    return c


def grouped_weight_grad(a: torch.Tensor, b: torch.Tensor, routing) -> torch.Tensor:
    """``c[e] = a[rows of e].T @ b[rows of e]`` (module docstring), in a's dtype."""
    n_a, n_b, experts = a.shape[1], b.shape[1], routing.num_experts
    if torch_grouped_mm_applies(a.t(), b) and a.shape[0] > 0:
        c = torch._grouped_mm(a.t(), b, offs=routing.group_ends_i32())
        # an expert without rows: torch documents no value for its (K = 0) product, the contract says zeros
        return zero_experts_without_rows(c, routing)
    c = torch.empty((experts, n_a, n_b), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    device = a.device.type
    tiles = routing.tiles
    block_n = block_m = tiles.block_n
    n_n_blocks, n_m_blocks = cdiv(n_a, block_n), cdiv(n_b, block_m)
    n_tasks = experts * n_n_blocks * n_m_blocks
    _fused_moe_wgrad_kernel[(_grid(device, n_tasks),)](
        a, b, c, routing.bounds, n_tasks, n_n_blocks, n_m_blocks, n_a, n_b, a.stride(0), a.stride(1), b.stride(0),
        b.stride(1), c.stride(0), c.stride(1), c.stride(2), BLOCK_N=block_n, BLOCK_M=block_m,
        BLOCK_R=tiles.block_k, DOT_PRECISION=_dot_precision(device, a.dtype), UPCAST=interpreter_enabled(),
        **_cuda_options(device, tiles))
    return c
