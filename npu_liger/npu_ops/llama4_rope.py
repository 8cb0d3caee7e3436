"""Llama-4 RoPE: HF ``modeling_llama4.apply_rotary_emb(xq, xk, freqs_cis)``.

    q (bsz, seq, n_q_heads, head_dim), k (bsz, seq, n_kv_heads, head_dim): any strides; the last dim holds
    interleaved (real, imag) pairs, head_dim even.
    freqs_cis complex64 (bsz or 1, seq, head_dim // 2) or (seq, head_dim // 2) (complex128 is rounded to complex64
    first); every batch row uses its own positions (HF broadcasts ``freqs_cis[:, :, None, :]`` over heads only).

    (q[2j] + i q[2j+1]) * freqs_cis[b, s, j]  ->  out[2j], out[2j+1]

The frequencies go to the kernel as the float32 (re, im) view ``torch.view_as_real(freqs_cis)`` (no copy). As in HF
the product is computed in fp32 and the outputs have q's (k's) dtype; they are new tensors, contiguous in
(bsz, seq, heads, head_dim). Backward: multiplication by the conjugate. Kernels and memory analysis: ``_rotary.py``.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ._rotary import check_qk, rotate_qk
from ._triton import new_like

FREQS_DTYPE = torch.complex64


def check_llama4_inputs(q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor,
                        names: Sequence[str] = ("q", "k")) -> None:
    check_qk(q, k, names, layout="(bsz, seq, heads, head_dim)", seq_dim=1)
    bsz, seq_len, _, head_dim = q.shape
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even (interleaved real/imag pairs), got {head_dim}")
    if not isinstance(freqs_cis, torch.Tensor):
        raise TypeError(f"freqs_cis must be a torch.Tensor, got {type(freqs_cis).__name__}")
    if freqs_cis.dtype not in (FREQS_DTYPE, torch.complex128):
        raise TypeError(f"freqs_cis must be complex64 (or complex128, rounded to complex64), got {freqs_cis.dtype}")
    if freqs_cis.device != q.device:
        raise RuntimeError(f"freqs_cis must be on the device of {names[0]} ({q.device}), got {freqs_cis.device}")
    expected = f"(bsz or 1, seq, head_dim // 2) = ({bsz} or 1, {seq_len}, {head_dim // 2}) or (seq, head_dim // 2)"
    if freqs_cis.dim() not in (2, 3):
        raise ValueError(f"freqs_cis must be {expected}, got shape {tuple(freqs_cis.shape)}")
    if freqs_cis.dim() == 3 and freqs_cis.shape[0] != 1 and freqs_cis.shape[0] != bsz:
        raise ValueError(f"freqs_cis must be {expected}, got shape {tuple(freqs_cis.shape)}")
    if freqs_cis.shape[-2] != seq_len or freqs_cis.shape[-1] != head_dim // 2:
        raise ValueError(f"freqs_cis must be {expected}, got shape {tuple(freqs_cis.shape)}")


def new_llama4_output(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape and dtype (metadata only: fakes call it too)."""
    return new_like(x)


def launch_llama4(q, k, freqs_cis, *, backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    q_out, k_out = new_llama4_output(q), new_llama4_output(k)
    bsz, seq_len, n_q_heads, head_dim = q.shape
    if q.stride(3) != 1:  # the kernel reads each head's row as one contiguous block (rare: copy)
        q = q.contiguous()
    if k.stride(3) != 1:
        k = k.contiguous()
    if freqs_cis.dtype != FREQS_DTYPE:  # complex128: no fp64 inside kernels; the table is small
        freqs_cis = freqs_cis.to(FREQS_DTYPE)
    if freqs_cis.stride(-1) != 1:
        freqs_cis = freqs_cis.contiguous()
    freqs = torch.view_as_real(freqs_cis)  # (..., seq, head_dim // 2, 2) float32 view: (re, im) pairs
    f_strides = freqs.stride()
    f_batch = f_strides[0] if freqs_cis.dim() == 3 and freqs_cis.shape[0] > 1 else 0
    rotate_qk(q, k, q_out, k_out, freqs, freqs, (bsz, seq_len, n_q_heads, k.shape[2], head_dim),
              q.stride()[:3], k.stride()[:3], (0, f_batch, f_strides[-3]), head_dim // 2,
              interleaved=True, backward=backward)
    return q_out, k_out


def llama4_rope_forward(q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    check_llama4_inputs(q, k, freqs_cis)
    return launch_llama4(q, k, freqs_cis, backward=False)


def llama4_rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, freqs_cis: torch.Tensor
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    check_llama4_inputs(grad_q, grad_k, freqs_cis, names=("grad_q", "grad_k"))
    return launch_llama4(grad_q, grad_k, freqs_cis, backward=True)
