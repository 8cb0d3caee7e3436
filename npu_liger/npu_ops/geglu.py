"""GEGLU: ``c = gelu(a, approximate="tanh") * b``, elementwise over any shape.

    gelu(a) = 0.5 * a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 * a^3))) = a * sigmoid(2 * sqrt(2/pi) * (a + 0.044715 a^3))

Forward reads a and b and writes c; backward reads grad_c, a and b and writes grad_a and grad_b, recomputing
the gate rather than saving it (one less tensor through HBM). Both kernels run a grid-stride loop over the flat
tensor with int64 offsets, so the same source serves a persistent NPU grid (one program per vector core) and
a one-program-per-tile CUDA grid.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ._gated import gated_backward, gated_forward
from ._triton import grid_stride, launched_kernel, program_start

SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_CUBIC_COEFF = tl.constexpr(0.044715)

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4).
# Forward, per element of the block: a, b (upcast), the gate argument / gate, and c before the cast:
#   ~4 live fp32 values -> memory_multiplier 4.0. Measured on Ascend910B3: ~16 UB bytes per element,
#   BLOCK 8192 fits (192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> 8192).
# Backward: grad_c, a, b, the gate, dz/da, the derivative, grad_a, grad_b: ~7 live fp32 values ->
#   memory_multiplier 7.0 for fp16/bf16 inputs (BLOCK 4096 fits cleanly). fp32 inputs need more: the Ascend
#   compile check (docs/ASCEND_CHECK.md) measured BLOCK 4096 fitting only with bishengir's multi-buffering
#   turned off (~32 UB bytes per element), so fp32 uses 10.0 -> BLOCK 2048, which fits double-buffered.
# shapes: ((n_elements,),), tiling_dims: (0,) -> no fixed dims, unit_param = 1.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 7.0
BACKWARD_MEMORY_MULTIPLIER_FP32 = 10.0


@triton.jit
def _gelu_gate(a):
    """0.5 * (1 + tanh(z)) = sigmoid(2z), z = sqrt(2/pi) (a + 0.044715 a^3): the factor gelu applies to a.
    Written with sigmoid because 1 + tanh(z) cancels catastrophically in fp32 for very negative a."""
    return tl.sigmoid((a + a * a * a * GELU_CUBIC_COEFF) * SQRT_2_OVER_PI * 2.0)


@launched_kernel
def _geglu_fwd_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK: tl.constexpr):
    for start in tl.range(program_start(BLOCK), n_elements, grid_stride(BLOCK)):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(c_ptr + offsets, (a * _gelu_gate(a) * b).to(c_ptr.dtype.element_ty), mask=mask)


@launched_kernel
def _geglu_bwd_kernel(grad_c_ptr, a_ptr, b_ptr, grad_a_ptr, grad_b_ptr, n_elements, BLOCK: tl.constexpr):
    for start in tl.range(program_start(BLOCK), n_elements, grid_stride(BLOCK)):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        grad_c = tl.load(grad_c_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        s = _gelu_gate(a)
        # d/da [a * sigmoid(2z)] = s + a * 2 s (1 - s) * dz/da,  dz/da = sqrt(2/pi) (1 + 3 * 0.044715 a^2)
        dz_da = (1.0 + a * a * GELU_CUBIC_COEFF * 3.0) * SQRT_2_OVER_PI
        d_gelu = s + a * s * (1.0 - s) * dz_da * 2.0
        tl.store(grad_a_ptr + offsets, (grad_c * b * d_gelu).to(grad_a_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_b_ptr + offsets, (grad_c * a * s).to(grad_b_ptr.dtype.element_ty), mask=mask)


def geglu_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return gated_forward(_geglu_fwd_kernel, a, b, FORWARD_MEMORY_MULTIPLIER)


def geglu_backward(grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    multiplier = BACKWARD_MEMORY_MULTIPLIER_FP32 if a.dtype == torch.float32 else BACKWARD_MEMORY_MULTIPLIER
    return gated_backward(_geglu_bwd_kernel, grad_c, a, b, multiplier)


