"""SwiGLU: ``c = silu(a) * b = a * sigmoid(a) * b``, elementwise over any shape.

    d/da silu(a) = s + a * s * (1 - s) = s * (1 + a * (1 - s)),  s = sigmoid(a)

Forward reads a and b and writes c; backward reads grad_c, a and b and writes grad_a and grad_b, recomputing
the sigmoid rather than saving it (one less tensor through HBM). Both kernels run a grid-stride loop over the
flat tensor with int64 offsets, so the same source serves a persistent NPU grid (one program per vector core)
and a one-program-per-tile CUDA grid.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton.language as tl

from ._gated import gated_backward, gated_forward
from ._triton import grid_stride, launched_kernel, program_start

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4).
# Forward, per element of the block: a, b (upcast), the sigmoid, and c before the cast:
#   ~4 live fp32 values -> memory_multiplier 4.0 (Ascend910B3: 192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> BLOCK 8192).
# Backward: grad_c, a, b, the sigmoid, silu(a), d silu / da, grad_a, grad_b: ~7 live fp32 values ->
#   memory_multiplier 7.0 (5617 -> BLOCK 4096). Same counts as GEGLU, whose figures were measured; SwiGLU's
#   gate is cheaper (no cubic), so these are upper bounds.
# shapes: ((n_elements,),), tiling_dims: (0,) -> no fixed dims, unit_param = 1.
FORWARD_MEMORY_MULTIPLIER = 4.0
BACKWARD_MEMORY_MULTIPLIER = 7.0


@launched_kernel
def _swiglu_fwd_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK: tl.constexpr):
    for start in tl.range(program_start(BLOCK), n_elements, grid_stride(BLOCK)):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(c_ptr + offsets, (a * tl.sigmoid(a) * b).to(c_ptr.dtype.element_ty), mask=mask)


@launched_kernel
def _swiglu_bwd_kernel(grad_c_ptr, a_ptr, b_ptr, grad_a_ptr, grad_b_ptr, n_elements, BLOCK: tl.constexpr):
    for start in tl.range(program_start(BLOCK), n_elements, grid_stride(BLOCK)):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        grad_c = tl.load(grad_c_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(a)
        silu = a * s
        d_silu = s * (1.0 + a * (1.0 - s))
        tl.store(grad_a_ptr + offsets, (grad_c * b * d_silu).to(grad_a_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_b_ptr + offsets, (grad_c * silu).to(grad_b_ptr.dtype.element_ty), mask=mask)


def swiglu_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return gated_forward(_swiglu_fwd_kernel, a, b, FORWARD_MEMORY_MULTIPLIER)


def swiglu_backward(grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return gated_backward(_swiglu_bwd_kernel, grad_c, a, b, BACKWARD_MEMORY_MULTIPLIER)


