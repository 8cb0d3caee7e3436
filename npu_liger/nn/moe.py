"""The experts of a MoE block as one module: ``npu_liger.fused_moe`` over 3-D expert weights."""

from __future__ import annotations

import torch
from torch import nn

from ..registrations.fused_moe import fused_moe

__all__ = ["Experts"]


class Experts(nn.Module):
    """transformers 5.x's stacked SwiGLU experts (``MixtralExperts``, ``Qwen3MoeExperts``, ...) through
    ``npu_liger.fused_moe``: ``forward(hidden_states, top_k_index, top_k_weights)``. Built from a model config
    like Liger-Kernel's ``LigerExperts`` (``num_experts`` or ``num_local_experts``; ``moe_intermediate_size`` or
    ``intermediate_size``; ``hidden_act`` silu/swish), with the parameters ``gate_up_proj`` (E, 2I, H) and
    ``down_proj`` (E, H, I), so transformers' experts state dicts load unchanged. ``hidden_states`` may carry
    leading dims (flattened to tokens); an index equal to E is a slot served elsewhere."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        num_experts = getattr(config, "num_experts", None) or config.num_local_experts
        inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"Experts computes SwiGLU experts; hidden_act {config.hidden_act!r} is not supported")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, config.hidden_size, inter
        factory = {"device": device, "dtype": dtype}
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, config.hidden_size, **factory))
        self.down_proj = nn.Parameter(torch.empty(num_experts, config.hidden_size, inter, **factory))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        k = top_k_index.shape[-1]
        out = fused_moe(x, self.gate_up_proj, self.down_proj, top_k_index.reshape(-1, k),
                        top_k_weights.reshape(-1, k))
        return out.view(shape)
