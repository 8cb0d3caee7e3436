from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..registrations.embedding import embedding, schema_padding_idx

__all__ = ["Embedding"]


class Embedding(nn.Module):
    """A lookup table like ``torch.nn.Embedding`` (same arguments, state dict and initialisation), backed by
    ``npu_liger::embedding``. ``padding_idx`` follows ``nn.Embedding``: a negative value counts from the end,
    the padding row starts at zero and never receives a gradient. ``max_norm``, ``scale_grad_by_freq`` and
    sparse gradients are not supported."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 device=None, dtype=None):
        super().__init__()
        if padding_idx is not None:  # stored as nn.Embedding does: in [0, num_embeddings)
            padding_idx = schema_padding_idx(padding_idx, num_embeddings)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.weight = nn.Parameter(torch.empty((num_embeddings, embedding_dim), device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return embedding(self.weight, indices, self.padding_idx)

    def extra_repr(self) -> str:
        padding = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}"
