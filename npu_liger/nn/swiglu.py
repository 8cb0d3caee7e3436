from __future__ import annotations

from typing import Optional

from ..registrations.swiglu import swiglu
from ._gated_mlp import GatedMLP

__all__ = ["SwiGLUMLP"]


class SwiGLUMLP(GatedMLP):
    """The gated MLP of Llama-style models (HF ``LlamaMLP`` with ``hidden_act="silu"``):
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``. ``SwiGLUMLP(hidden_size, intermediate_size, bias=False,
    device=None, dtype=None)``, or ``SwiGLUMLP(config)`` as Liger-Kernel's ``LigerSwiGLUMLP(config)`` (its
    ``hidden_act`` must be ``silu`` or ``swish``; see ``GatedMLP``)."""

    gate_name = "swiglu"
    gate = staticmethod(swiglu)

    def __init__(self, hidden_size=None, intermediate_size: Optional[int] = None, bias: Optional[bool] = None,
                 device=None, dtype=None, *, config=None):
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, config=config)
