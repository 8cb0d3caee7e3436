"""Qwen2-VL multimodal RoPE: HF ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1)``.

    q (bsz, n_q_heads, seq, head_dim), k (bsz, n_kv_heads, seq, head_dim): any strides, as for rope.
    cos, sin (3, bsz or 1, seq, head_dim): temporal, height and width planes (dtypes as for rope).
    mrope_section: sizes over half the head dim, sum(mrope_section) == head_dim // 2.

Section i of ``mrope_section * 2`` (which tiles the full head dim) takes its columns from plane i % 3; the merged
(bsz or 1, seq, head_dim) tables then rotate q and k exactly as rope does.

Design: the merge happens inside the rope kernel. For the usual three sections (Qwen2-VL, Qwen2.5-VL) both
halves of the head dim take section i from plane i, so column j (and half + j) reads plane 0, 1 or 2 by the two
boundaries sec1 = s0, sec2 = s0 + s1: the kernel reads each row's cos/sin columns straight from their planes
(one head_dim-wide row of cos and of sin per (batch, seq) row, as for rope; no merged table is written). Other
section counts (where the two halves' planes differ) merge on the device first (``torch.cat`` of per-section
slices, one read and one write of a (bsz, seq, head_dim) table each for cos and sin), then the same kernel runs.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ._rotary import check_cos_sin, check_qk, launch_half_split, layout_hint

N_PLANES = 3  # temporal, height, width


def check_mrope_inputs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       mrope_section: Sequence[int], names: Sequence[str] = ("q", "k")) -> None:
    check_qk(q, k, names)
    check_cos_sin(cos, sin, q, names[0])
    bsz, _, seq_len, head_dim = q.shape
    if cos.dim() != 4 or cos.shape[0] != N_PLANES:
        raise ValueError(f"cos must be (3, bsz or 1, seq, head_dim), got shape {tuple(cos.shape)}")
    if cos.shape[1] != 1 and cos.shape[1] != bsz:
        raise ValueError(f"cos must have batch size 1 or {names[0]}'s bsz {bsz} in dim 1, got shape {tuple(cos.shape)}")
    if cos.shape[2] != seq_len:
        raise ValueError(f"cos must have {names[0]}'s seq length {seq_len} in dim 2, got shape {tuple(cos.shape)} "
                         f"({layout_hint(names)})")
    if cos.shape[3] != head_dim:
        raise ValueError(f"cos must have {names[0]}'s head_dim {head_dim} in dim 3, got shape {tuple(cos.shape)}")
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even for qwen2vl_mrope, got {head_dim}")
    sections = list(mrope_section)
    if not sections or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in sections):
        raise ValueError(f"mrope_section must be a non-empty list of non-negative ints, got {mrope_section!r}")
    if sum(sections) != head_dim // 2:
        raise ValueError(
            f"mrope_section must sum to head_dim // 2 = {head_dim // 2}, got {sections} (sum {sum(sections)})"
        )


def merge_mrope_sections(table: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """(3, B, seq, head_dim) -> (B, seq, head_dim): section i of ``mrope_section * 2`` from plane i % 3."""
    chunks = table.split(list(mrope_section) * 2, dim=-1)
    return torch.cat([chunk[i % N_PLANES] for i, chunk in enumerate(chunks)], dim=-1)


def launch_mrope(q, k, cos, sin, mrope_section, *, backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    if len(mrope_section) == N_PLANES:
        sec1 = mrope_section[0]
        return launch_half_split(q, k, cos, sin, backward=backward, mrope_sections=(sec1, sec1 + mrope_section[1]))
    merged_cos = merge_mrope_sections(cos, mrope_section)
    merged_sin = merge_mrope_sections(sin, mrope_section)
    return launch_half_split(q, k, merged_cos, merged_sin, backward=backward)


def qwen2vl_mrope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          mrope_section: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    check_mrope_inputs(q, k, cos, sin, mrope_section)
    return launch_mrope(q, k, cos, sin, mrope_section, backward=False)


def qwen2vl_mrope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           mrope_section: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    check_mrope_inputs(grad_q, grad_k, cos, sin, mrope_section, names=("grad_q", "grad_k"))
    return launch_mrope(grad_q, grad_k, cos, sin, mrope_section, backward=True)
