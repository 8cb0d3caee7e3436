from __future__ import annotations

from ..registrations.swiglu import swiglu
from ._gated_mlp import GatedMLP

__all__ = ["SwiGLUMLP"]


class SwiGLUMLP(GatedMLP):
    """The gated MLP of Llama-style models (HF ``LlamaMLP`` with ``hidden_act="silu"``):
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    gate_name = "swiglu"
    gate = staticmethod(swiglu)
