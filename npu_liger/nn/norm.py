"""``RMSNorm`` and ``LayerNorm`` modules: the npu_liger ops with parameters named as Hugging Face's norms and
``torch.nn.LayerNorm`` name them (``weight``, ``bias``), so their state dicts load unchanged. Both also take
Liger-Kernel's constructor arguments (``LigerRMSNorm``, ``LigerLayerNorm``; docs/SWITCHING.md lists what each
one does here)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..npu_ops.rms_norm import CASTING_MODES
from ..registrations.layer_norm import layer_norm
from ..registrations.rms_norm import fused_add_rms_norm, rms_norm

__all__ = ["RMSNorm", "LayerNorm"]

INIT_FNS = ("ones", "zeros")  # Liger-Kernel's init_fn values: the weight's starting value


def _last_dim(shape: Union[int, Sequence[int]], what: str) -> int:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(dims) != 1 or isinstance(dims[0], bool) or not isinstance(dims[0], int) or dims[0] < 0:
        raise ValueError(f"{what} must be one non-negative int (the last dim is normalised), got {shape!r}")
    return dims[0]


def _check_init_fn(init_fn: Optional[str]) -> None:
    if init_fn is not None and init_fn not in INIT_FNS:
        raise ValueError(f"init_fn must be 'ones' or 'zeros' (or None), got {init_fn!r}")


def _check_flag(name: str, value, allow_none: bool = False) -> None:
    if not (isinstance(value, bool) or (allow_none and value is None)):
        raise TypeError(f"{name} must be a bool{' or None' if allow_none else ''}, got {value!r}")


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * (offset + weight)`` over the last dim (``npu_liger.rms_norm``).

    Llama-style (``LlamaRMSNorm``, Qwen, Mistral): ``RMSNorm(hidden)``; Gemma-style (``GemmaRMSNorm``):
    ``RMSNorm(hidden, offset=1.0, casting_mode="gemma")``; no weight (``elementwise_affine=False``, e.g. Llama-4's
    qk norm): ``x * rsqrt(mean(x^2) + eps)`` in x's dtype. ``forward(x, residual=None)``: with a residual,
    returns ``(rms_norm(x + residual), x + residual)`` from one fused kernel.

    The arguments are Liger-Kernel's ``LigerRMSNorm(hidden_size, eps, offset, casting_mode, init_fn, in_place,
    row_mode, elementwise_affine)``, in its order, plus ``device`` and ``dtype`` (keywords):

    - ``init_fn``: the weight's start, ``"ones"`` or ``"zeros"`` as in Liger; None (the default) starts it at
      ``1 - offset``, a unit scale, as Hugging Face's modules do (Liger's default, ones, is a scale of 2 with
      Gemma's offset 1). A loaded state dict replaces it either way.
    - ``in_place``: accepted and ignored: npu_liger never writes into its inputs or incoming gradients (Liger's
      in-place backward overwrites the gradient it is given), so there is nothing to switch.
    - ``row_mode``: accepted and ignored: it picks one of Liger's CUDA kernels; the tile plan chooses here, and
      the result does not depend on it.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
                 init_fn: Optional[str] = None, in_place: bool = True, row_mode: Optional[bool] = None,
                 elementwise_affine: bool = True, *, device=None, dtype=None):
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode must be one of {', '.join(map(repr, CASTING_MODES))}, got "
                             f"{casting_mode!r}")
        _check_init_fn(init_fn)
        _check_flag("in_place", in_place)
        _check_flag("row_mode", row_mode, allow_none=True)
        _check_flag("elementwise_affine", elementwise_affine)
        size = _last_dim(hidden_size, "hidden_size")
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            start = {"ones": 1.0, "zeros": 0.0, None: 1.0 - offset}[init_fn]
            self.weight = nn.Parameter(torch.full((size,), start, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.hidden_size = size
        self.eps, self.offset, self.casting_mode = float(eps), float(offset), casting_mode
        self.in_place, self.row_mode = in_place, row_mode  # kept for code that reads them; unused (see above)

    @property
    def variance_epsilon(self) -> float:
        """``eps`` under the name Hugging Face's and Liger's RMSNorm modules give it."""
        return self.eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is None:
            return rms_norm(x, self.weight, self.eps, self.offset, self.casting_mode)
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset, self.casting_mode)

    def extra_repr(self) -> str:
        return (f"{(self.hidden_size,)}, eps={self.eps}, offset={self.offset}, casting_mode={self.casting_mode!r}, "
                f"elementwise_affine={self.elementwise_affine}")


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` over the last dim through ``npu_liger.layer_norm``: torch's arguments, order,
    defaults and state dict (one normalised dim).

    Liger-Kernel's ``LigerLayerNorm(hidden_size, eps=1e-6, bias=False, init_fn="ones")`` arguments are accepted by
    name: ``hidden_size=`` for ``normalized_shape``, ``init_fn=`` (``"ones"``/``"zeros"``: the weight's start).
    Where the two differ, torch's meaning is kept: ``eps`` defaults to 1e-5 (pass Liger's 1e-6 explicitly), the
    third positional argument is ``elementwise_affine``, and ``bias=False`` means no bias (Liger keeps a
    zero-initialised bias that trains: that is ``bias=True`` here, the default; Liger's ``bias=True`` starts its
    bias at random values, which has no equivalent here)."""

    def __init__(self, normalized_shape: Union[int, Sequence[int], None] = None, eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None, dtype=None, *,
                 hidden_size: Optional[int] = None, init_fn: Optional[str] = None):
        super().__init__()
        if (normalized_shape is None) == (hidden_size is None):
            raise TypeError("LayerNorm(normalized_shape, eps=1e-05, elementwise_affine=True, bias=True, device=None, "
                            "dtype=None, *, hidden_size=None, init_fn=None) takes the normalised size once: as "
                            "normalized_shape (torch's name) or hidden_size= (Liger-Kernel's)")
        _check_init_fn(init_fn)
        _check_flag("elementwise_affine", elementwise_affine)
        _check_flag("bias", bias)
        if init_fn is not None and not elementwise_affine:
            raise ValueError("init_fn sets the weight's start, but elementwise_affine=False has no weight")
        size = _last_dim(normalized_shape if hidden_size is None else hidden_size,
                         "normalized_shape" if hidden_size is None else "hidden_size")
        self.normalized_shape, self.hidden_size = (size,), size
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        factory = dict(device=device, dtype=dtype)
        start = 0.0 if init_fn == "zeros" else 1.0
        self.weight = nn.Parameter(torch.full((size,), start, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(size, **factory)) if elementwise_affine and bias else None

    @property
    def variance_epsilon(self) -> float:
        """``eps`` under the name ``LigerLayerNorm`` also gives it."""
        return self.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
