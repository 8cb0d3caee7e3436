"""RoPE: HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, partial rotary included.

    q (bsz, n_q_heads, seq, head_dim), k (bsz, n_kv_heads, seq, head_dim): any strides (HF's transposed views
    of (bsz, seq, heads, head_dim) are read row by row, without a copy); n_q_heads != n_kv_heads is fine (GQA).
    cos, sin (1 or bsz, seq, rotary_dim) or (seq, rotary_dim); rotary_dim even and <= head_dim; float32, float16,
    bfloat16 or float64 (float64 tables are rounded to float32 first: the kernel computes in float32), q's dtype or
    not; same shape, dtype and device as each other.

    half = rotary_dim // 2, x1 = x[..., :half], x2 = x[..., half:rotary_dim]:
    out[..., :half]           = x1 * cos[..., :half] - x2 * sin[..., :half]
    out[..., half:rotary_dim] = x2 * cos[..., half:] + x1 * sin[..., half:]
    out[..., rotary_dim:]     = x[..., rotary_dim:]                        (partial rotary: passed through)

Exact for any cos/sin values (the two halves of a table are read separately, never assumed equal). The backward
applies the transposed rotation to the output gradients; cos and sin get no gradient.

Outputs are new tensors of q's (k's) shape and dtype, laid out like HF's usual q/k: contiguous in
(bsz, seq, heads, head_dim) memory, i.e. strides (seq*H*D, D, H*D, 1). Launch, memory analysis and shared checks:
``_rotary.py``; kernels: ``_rotary_kernels.py``.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ._rotary import check_cos_sin, check_qk, launch_half_split


def check_rope_inputs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      names: Sequence[str] = ("q", "k")) -> None:
    check_qk(q, k, names)
    check_cos_sin(cos, sin, q, names[0])
    bsz, _, seq_len, head_dim = q.shape
    if cos.dim() not in (2, 3):
        raise ValueError(f"cos must be (bsz or 1, seq, rotary_dim) or (seq, rotary_dim), got shape {tuple(cos.shape)}")
    if cos.dim() == 3 and cos.shape[0] != 1 and cos.shape[0] != bsz:
        raise ValueError(f"cos must have batch size 1 or {names[0]}'s bsz {bsz}, got shape {tuple(cos.shape)}")
    if cos.shape[-2] != seq_len:
        raise ValueError(f"cos must have {names[0]}'s seq length {seq_len} in dim -2, got shape {tuple(cos.shape)}")
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 != 0:
        raise ValueError(f"rotary_dim (cos.shape[-1]) must be even, got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim (cos.shape[-1]) must be <= head_dim {head_dim}, got {rotary_dim}")


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    check_rope_inputs(q, k, cos, sin)
    return launch_half_split(q, k, cos, sin, backward=False)


def rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of q and k from the gradients of the two outputs (the rotation is linear: q, k not needed)."""
    check_rope_inputs(grad_q, grad_k, cos, sin, names=("grad_q", "grad_k"))
    return launch_half_split(grad_q, grad_k, cos, sin, backward=True)
