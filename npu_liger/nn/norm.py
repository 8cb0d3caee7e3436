"""``RMSNorm`` and ``LayerNorm`` modules: the npu_liger ops with parameters named as Hugging Face's norms and
``torch.nn.LayerNorm`` name them (``weight``, ``bias``), so their state dicts load unchanged."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..npu_ops.rms_norm import CASTING_MODES
from ..registrations.layer_norm import layer_norm
from ..registrations.rms_norm import fused_add_rms_norm, rms_norm

__all__ = ["RMSNorm", "LayerNorm"]


def _last_dim(shape: Union[int, Sequence[int]], what: str) -> int:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(dims) != 1 or isinstance(dims[0], bool) or not isinstance(dims[0], int) or dims[0] < 0:
        raise ValueError(f"{what} must be one non-negative int (the last dim is normalised), got {shape!r}")
    return dims[0]


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * (offset + weight)`` over the last dim (``npu_liger.rms_norm``).

    Llama-style (``LlamaRMSNorm``, Qwen, Mistral): ``RMSNorm(hidden)``; Gemma-style (``GemmaRMSNorm``):
    ``RMSNorm(hidden, offset=1.0, casting_mode="gemma")``. The weight starts at ``1 - offset`` (a unit scale)
    and loads those modules' state dicts. ``forward(x, residual=None)``: with a residual, returns
    ``(rms_norm(x + residual), x + residual)`` from one fused kernel."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
                 device=None, dtype=None):
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode must be one of {', '.join(map(repr, CASTING_MODES))}, got "
                             f"{casting_mode!r}")
        size = _last_dim(hidden_size, "hidden_size")
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset, device=device, dtype=dtype))
        self.eps, self.offset, self.casting_mode = float(eps), float(offset), casting_mode

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is None:
            return rms_norm(x, self.weight, self.eps, self.offset, self.casting_mode)
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset, self.casting_mode)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, offset={self.offset}, casting_mode={self.casting_mode!r}"


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` over the last dim through ``npu_liger.layer_norm`` (same arguments and state dict,
    one normalised dim)."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None, dtype=None):
        super().__init__()
        size = _last_dim(normalized_shape, "normalized_shape")
        self.normalized_shape = (size,)
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        factory = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.ones(size, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(size, **factory)) if elementwise_affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
