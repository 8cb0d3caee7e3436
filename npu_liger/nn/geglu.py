from __future__ import annotations

from ..registrations.geglu import geglu
from ._gated_mlp import GatedMLP

__all__ = ["GEGLUMLP"]


class GEGLUMLP(GatedMLP):
    """The gated MLP of Gemma-style models (HF ``GemmaMLP`` with ``hidden_act="gelu_pytorch_tanh"``):
    ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``."""

    gate_name = "geglu"
    gate = staticmethod(geglu)
