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
(bsz, seq, heads, head_dim) memory, i.e. strides (seq*H*D, D, H*D, 1). Kernels and memory analysis: ``_rotary.py``.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ._rotary import rotate_qk
from ._triton import SUPPORTED_DTYPES, check_float_tensor

TABLE_DTYPES = (*SUPPORTED_DTYPES, torch.float64)  # cos/sin; float64 is rounded to float32 before the launch


def check_qk(q: torch.Tensor, k: torch.Tensor, names: Sequence[str] = ("q", "k"),
             layout: str = "(bsz, heads, seq, head_dim)", seq_dim: int = 2) -> None:
    """q and k: supported float dtype, 4-D, same dtype and device, equal bsz, seq and head_dim."""
    q_name, k_name = names
    check_float_tensor(q_name, q)
    check_float_tensor(k_name, k)
    for name, t in ((q_name, q), (k_name, k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"{k_name} must have the dtype of {q_name} ({q.dtype}), got {k.dtype}")
    if k.device != q.device:
        raise RuntimeError(f"{k_name} must be on the device of {q_name} ({q.device}), got {k.device}")
    for dim, what in ((0, "bsz"), (seq_dim, "seq"), (3, "head_dim")):
        if k.shape[dim] != q.shape[dim]:
            raise ValueError(
                f"{k_name} must match {q_name} in {what} (dim {dim}): {q_name} has shape {tuple(q.shape)}, "
                f"{k_name} has shape {tuple(k.shape)}"
            )


def check_cos_sin(cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, q_name: str = "q") -> None:
    """cos and sin: float, same shape/dtype/device as each other, on q's device."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in TABLE_DTYPES:
            raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin must have the dtype of cos ({cos.dtype}), got {sin.dtype}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise RuntimeError(f"{name} must be on the device of {q_name} ({q.device}), got {t.device}")


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


def new_rope_output(x: torch.Tensor) -> torch.Tensor:
    """A new (bsz, heads, seq, head_dim) tensor laid out as (bsz, seq, heads, head_dim) memory (HF's q/k layout).
    Metadata only: fakes call it too."""
    bsz, heads, seq_len, head_dim = x.shape
    return torch.empty_strided(
        (bsz, heads, seq_len, head_dim), (seq_len * heads * head_dim, head_dim, heads * head_dim, 1),
        dtype=x.dtype, device=x.device,
    )


def _seq_major_strides(x: torch.Tensor):
    """x (bsz, heads, seq, head_dim) with unit stride along head_dim (copied otherwise, rare): (x, its
    (batch, seq, head) strides)."""
    sb, sh, ss, sd = x.stride()
    if sd != 1:
        x = x.contiguous()
        sb, sh, ss, sd = x.stride()
    return x, (sb, ss, sh)


def table_strides(table: torch.Tensor, plane: int = 0):
    """(plane, batch, seq) element strides of a (..., [bsz or 1,] seq, n) table; batch 0 when broadcast."""
    stride, shape = table.stride(), table.shape
    batch = stride[-3] if table.dim() >= 3 and shape[-3] > 1 else 0
    return plane, batch, stride[-2]


def table_pair(cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as the kernel reads them: float64 rounded to float32 (no fp64 inside kernels; a table is small),
    unit stride along columns and the same strides for both (copied otherwise, rare)."""
    if cos.dtype == torch.float64:
        cos, sin = cos.float(), sin.float()
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def launch_rope(q, k, cos, sin, *, backward: bool, mrope_sections=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Checked inputs -> new outputs (the rope kernel of ``_rotary.py``; qwen2vl_mrope reuses it with
    ``mrope_sections`` = (sec1, sec2) and (3, bsz or 1, seq, head_dim) tables)."""
    q_out, k_out = new_rope_output(q), new_rope_output(k)
    bsz, n_q_heads, seq_len, head_dim = q.shape
    dims = (bsz, seq_len, n_q_heads, k.shape[1], head_dim)
    q, q_strides = _seq_major_strides(q)
    k, k_strides = _seq_major_strides(k)
    cos, sin = table_pair(cos, sin)
    mrope = mrope_sections is not None
    rotate_qk(q, k, q_out, k_out, cos, sin, dims, q_strides, k_strides,
              table_strides(cos, cos.stride(0) if mrope else 0), cos.shape[-1] // 2,
              mrope_sections if mrope else (0, 0), interleaved=False, mrope=mrope, backward=backward)
    return q_out, k_out


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    check_rope_inputs(q, k, cos, sin)
    return launch_rope(q, k, cos, sin, backward=False)


def rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of q and k from the gradients of the two outputs (the rotation is linear: q, k not needed)."""
    check_rope_inputs(grad_q, grad_k, cos, sin, names=("grad_q", "grad_k"))
    return launch_rope(grad_q, grad_k, cos, sin, backward=True)
