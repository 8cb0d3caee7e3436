"""Drop-in replacements for transformers' rotary-embedding functions, running the npu_liger rope ops.

Each keeps the signature of the function it replaces, so it can be assigned over the original in a modeling
file (which is what the patchers do) or called directly:

=============================================  ====================================  =========================
transformers function                          drop-in                               op
=============================================  ====================================  =========================
``apply_rotary_pos_emb`` (Llama, Mistral,      ``apply_rotary_pos_emb``              ``npu_liger::rope``
Qwen2/3, Gemma 1-3, Qwen2-VL text in 5.x)
``apply_multimodal_rotary_pos_emb``            ``apply_multimodal_rotary_pos_emb``   ``npu_liger::qwen2vl_mrope``
(Qwen2-VL, transformers 4.x; (3, bsz, seq,
head_dim) tables)
Llama-4 ``apply_rotary_emb``                   ``apply_rotary_emb``                  ``npu_liger::llama4_rope``
=============================================  ====================================  =========================

``unsqueeze_dim``: transformers unsqueezes cos/sin at dim 1 for q/k laid out (bsz, heads, seq, head_dim)
and at dim 2 for (bsz, seq, heads, head_dim). The ops take the first layout; for ``unsqueeze_dim=2`` the
drop-ins hand the op transposed views (no copy) and transpose the results back, so callers get the layout
they passed. Inputs the ops do not cover (other ranks or unsqueeze dims; dtypes the ops refuse: float64, or
mixed) take an eager PyTorch path that is transformers' computation op for op (so a float64 model of a patched
family, which the module-wide patch reaches too, gets transformers' result); that choice depends only on
shapes and dtypes, so it is fixed at trace time under ``torch.compile``.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

import npu_liger  # the functional API: eager fast path, the registered op under compile/dispatch modes

from ..npu_ops._triton import SUPPORTED_DTYPES

Pair = Tuple[torch.Tensor, torch.Tensor]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` on the first ``cos.shape[-1]`` dims (partial rotary)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)


def _op_dtypes(*tensors: torch.Tensor) -> bool:
    """One dtype throughout, and one the ops compute (fp32/fp16/bf16): dtypes only, never data."""
    return tensors[0].dtype in SUPPORTED_DTYPES and all(t.dtype == tensors[0].dtype for t in tensors)


def _head_layout(q: torch.Tensor, unsqueeze_dim: int):
    """1 if q is (bsz, heads, seq, hd) for this unsqueeze_dim, 2 if (bsz, seq, heads, hd), else None."""
    if q.dim() != 4:
        return None
    dim = unsqueeze_dim + 4 if unsqueeze_dim < 0 else unsqueeze_dim
    return dim if dim in (1, 2) else None


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids=None, unsqueeze_dim: int = 1) -> Pair:
    """transformers' ``apply_rotary_pos_emb`` through ``torch.ops.npu_liger.rope``.

    ``position_ids`` is accepted and ignored, as in transformers 4.x (cos/sin are already gathered). In
    transformers 5.x the fifth positional argument is ``unsqueeze_dim``; an ``int`` there is taken as such.
    """
    if isinstance(position_ids, int) and not isinstance(position_ids, bool):
        unsqueeze_dim = position_ids
    layout = _head_layout(q, unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    if (layout is None or k.dim() != 4 or cos.dim() not in (2, 3) or not _op_dtypes(q, k, cos, sin)
            or rotary_dim > min(q.shape[-1], k.shape[-1])):
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _rotate(q, c, s), _rotate(k, c, s)
    if rotary_dim < q.shape[-1] or rotary_dim < k.shape[-1]:  # partial rotary: the rest passes through
        q_rot, k_rot = apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin,
                                            unsqueeze_dim=unsqueeze_dim)
        return (torch.cat((q_rot, q[..., rotary_dim:]), dim=-1), torch.cat((k_rot, k[..., rotary_dim:]), dim=-1))
    if layout == 1:
        return npu_liger.rope(q, k, cos, sin)
    q_out, k_out = npu_liger.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def apply_rotary_pos_emb_cast(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                              unsqueeze_dim: int = 1) -> Pair:
    """OLMo-2/3's ``apply_rotary_pos_emb``: the plain rotation (``apply_rotary_pos_emb``), its results cast back to
    q's and k's dtypes (a no-op where the rope op runs: it takes one dtype throughout)."""
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def _merge_mrope(table: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """(3, bsz, seq, hd) -> (bsz, seq, hd): section i of each half comes from table[i % 3] (HF's rule)."""
    sections = table.split(list(mrope_section) * 2, dim=-1)
    return torch.cat([part[i % 3] for i, part in enumerate(sections)], dim=-1)


def apply_multimodal_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                    mrope_section: Sequence[int], unsqueeze_dim: int = 1) -> Pair:
    """transformers' Qwen2-VL ``apply_multimodal_rotary_pos_emb`` through ``torch.ops.npu_liger.qwen2vl_mrope``:
    cos/sin (3, bsz, seq, head_dim) hold the temporal, height and width tables."""
    section = [int(s) for s in mrope_section]
    layout = _head_layout(q, unsqueeze_dim)
    if layout is None or k.dim() != 4 or cos.dim() != 4 or not _op_dtypes(q, k, cos, sin):
        c = _merge_mrope(cos, section).unsqueeze(unsqueeze_dim)
        s = _merge_mrope(sin, section).unsqueeze(unsqueeze_dim)
        return _rotate(q, c, s), _rotate(k, c, s)
    if layout == 1:
        return npu_liger.qwen2vl_mrope(q, k, cos, sin, section)
    q_out, k_out = npu_liger.qwen2vl_mrope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, section)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> Pair:
    """Llama-4's ``apply_rotary_emb`` through ``torch.ops.npu_liger.llama4_rope``: xq/xk (bsz, seq, heads,
    head_dim) with interleaved (re, im) pairs, freqs_cis complex (bsz or 1, seq, head_dim // 2)."""
    if (xq.dim() != 4 or xk.dim() != 4 or freqs_cis.dim() not in (2, 3) or not _op_dtypes(xq, xk)
            or freqs_cis.dtype not in (torch.complex64, torch.complex128)):  # the tables llama4_rope takes
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        f = freqs_cis[:, :, None, :]
        return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq),
                torch.view_as_real(xk_ * f).flatten(3).type_as(xk))
    return npu_liger.llama4_rope(xq, xk, freqs_cis)


__all__ = ["apply_rotary_pos_emb", "apply_rotary_pos_emb_cast", "apply_multimodal_rotary_pos_emb", "apply_rotary_emb"]
