from __future__ import annotations

from typing import Optional

from ..registrations.geglu import geglu
from ._gated_mlp import GatedMLP

__all__ = ["GEGLUMLP"]


class GEGLUMLP(GatedMLP):
    """The gated MLP of Gemma-style models (HF ``GemmaMLP`` with ``hidden_act="gelu_pytorch_tanh"``):
    ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``. ``GEGLUMLP(hidden_size, intermediate_size, bias=False,
    device=None, dtype=None)``, or ``GEGLUMLP(config)`` as Liger-Kernel's ``LigerGEGLUMLP(config)`` (its
    activation must be ``gelu_pytorch_tanh``, or Gemma's legacy ``gelu``; see ``GatedMLP``)."""

    gate_name = "geglu"
    gate = staticmethod(geglu)

    def __init__(self, hidden_size=None, intermediate_size: Optional[int] = None, bias: Optional[bool] = None,
                 device=None, dtype=None, *, config=None):
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, config=config)
