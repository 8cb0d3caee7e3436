"""npu_liger::embedding and npu_liger::embedding_backward: schema -> fake -> device kernels -> autograd.

padding_idx has two conventions, translated in one place (``schema_padding_idx``):
- the public function, ``nn.Embedding`` and the HF embedding patch follow torch: None means no padding row and a
  negative value counts from the end (``F.embedding``);
- the op's schema takes a plain int: any negative value (the default is -1) means "no padding row" and
  0 <= padding_idx < num_embeddings names the row that gets no gradient.
Gradients flow to weight only; indices are integers and get none.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..npu_ops.embedding import (check_embedding_backward_inputs, check_embedding_inputs, embedding_backward,
                                 embedding_backward_of_forward, embedding_forward)
from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule

__all__ = ["embedding"]  # schema_padding_idx is shared with nn.Embedding and the HF patch, not public API


def _embedding_fake(weight, indices, padding_idx=-1):
    check_embedding_inputs(weight, indices, padding_idx)
    return torch.empty((*indices.shape, weight.shape[1]), dtype=weight.dtype, device=weight.device)


def _embedding_backward_fake(grad_out, indices, num_embeddings, padding_idx):
    check_embedding_backward_inputs(grad_out, indices, num_embeddings, padding_idx)
    return torch.empty((num_embeddings, grad_out.shape[-1]), dtype=grad_out.dtype, device=grad_out.device)


embedding_op = define_op(
    "embedding(Tensor weight, Tensor indices, int padding_idx=-1) -> Tensor",
    kernel=embedding_forward,
    fake=_embedding_fake,
)
# num_embeddings is a SymInt so that a dynamic vocabulary size stays symbolic under torch.compile.
embedding_backward_op = define_op(
    "embedding_backward(Tensor grad_out, Tensor indices, SymInt num_embeddings, int padding_idx) -> Tensor",
    kernel=embedding_backward,
    fake=_embedding_backward_fake,
    trusted_kernel=embedding_backward_of_forward,  # plain eager backward passes: the forward checked the indices
)


@sharding_rule(embedding_op)
def _embedding_sharding(p, weight, indices, padding_idx=-1):
    """weight R with indices R -> R, or with indices S(d) -> S(d) (batch or sequence parallel); weight S(1) (the
    embedding dim) with indices R -> S(last). Not vocab-parallel (weight S(0)): the kernel rejects indices outside
    its rows, and masking them would also need a shifted padding_idx, so DTensor gathers the weight first."""
    S = p.S
    return ([p.case(p.R), p.case(S(indices.ndim), weight=S(1))]
            + [p.case(S(d), indices=S(d)) for d in range(indices.ndim)])


@sharding_rule(embedding_backward_op)
def _embedding_backward_sharding(p, grad_out, indices, num_embeddings, padding_idx):
    """R -> R; grad_out S(last) with indices R -> S(1); grad_out and indices S(d) on a token dim -> P (each rank
    scatters its own tokens); grad_out P with indices R -> P."""
    S = p.S
    return ([p.case(p.R), p.case(p.P, grad_out=p.P), p.case(S(1), grad_out=S(indices.ndim))]
            + [p.case(p.P, grad_out=S(d), indices=S(d)) for d in range(indices.ndim)])


def _setup_context(ctx, inputs, output):
    weight, indices, padding_idx = inputs
    ctx.save_for_backward(indices)  # weight itself is not needed: only its row count
    ctx.num_embeddings = weight.shape[0]
    ctx.padding_idx = padding_idx


def _backward(ctx, grad_out):
    if not ctx.needs_input_grad[0]:
        return None, None, None
    (indices,) = ctx.saved_tensors
    return call_op(embedding_backward_op, grad_out, indices, ctx.num_embeddings, ctx.padding_idx), None, None


_embedding_entry = define_autograd(embedding_op, backward=_backward, setup_context=_setup_context,
                                   kernel=embedding_forward)
forbid_double_backward(embedding_backward_op, "embedding")


def schema_padding_idx(padding_idx: Optional[int], num_embeddings: int) -> int:
    """torch's padding_idx (None: no padding row; negative: counted from the end) as the op's schema value
    (-1: no padding row; else the row in [0, num_embeddings))."""
    if padding_idx is None:
        return -1
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, torch.SymInt)):
        raise TypeError(f"padding_idx must be an int or None, got {type(padding_idx).__name__}")
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"padding_idx must be within [-num_embeddings, num_embeddings) = "
                         f"[{-num_embeddings}, {num_embeddings}), got {padding_idx}")
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


def embedding(weight: torch.Tensor, indices: torch.Tensor, padding_idx: Optional[int] = None) -> torch.Tensor:
    """``F.embedding(indices, weight, padding_idx)`` through ``torch.ops.npu_liger.embedding`` (eager calls skip
    the dispatcher). Note the argument order (weight first, as in the op). ``padding_idx`` as in torch: None
    means no padding row, a negative value counts from the end (-1 is the last row). Indices outside
    [0, num_embeddings) raise ``IndexError`` (CPU, NPU) or, on CUDA, trip a device-side assert, reported as a
    ``RuntimeError`` at the next synchronisation (as ``F.embedding`` does there)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (num_embeddings, embedding_dim), got shape {tuple(weight.shape)}")
    return _embedding_entry(weight, indices, schema_padding_idx(padding_idx, weight.shape[0]))
