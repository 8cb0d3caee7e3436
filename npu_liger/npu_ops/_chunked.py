"""The fused linear losses' shared rules (fused_linear_cross_entropy, fused_linear_jsd, the preference losses): how
many rows of x one chunk of logits holds, and the input checks of their linear heads. The chunk policy's reasoning
and the H200 measurements are in ``fused_linear_cross_entropy.py``'s docstring; ``NPU_LIGER_FLCE_CHUNK_ROWS=<rows>``
overrides the choice for every such loss (read per call, at run time, also under torch.compile).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from ._triton import check_float_tensor

CHUNK_ROWS_ENV = "NPU_LIGER_FLCE_CHUNK_ROWS"
EFFICIENT_CHUNK_ROWS = 1024  # rows per chunk at which the weight-gradient matmul stops being memory-bound
MAX_CHUNK_FRACTION = 4  # a chunk holds at most 1/4 of the rows ...
MIN_CHUNK_ROWS = 64  # ... unless that is fewer than this (tiny calls, e.g. evaluation of a few rows: one chunk)


def chunk_rows(n_rows: int, hidden: int, vocab: int) -> int:
    """Rows per chunk (module docstring): a power of two, the larger of EFFICIENT_CHUNK_ROWS (capped at a quarter
    of the rows, or MIN_CHUNK_ROWS) and the rows whose logits have x's size; at least 1, at most n_rows.
    ``NPU_LIGER_FLCE_CHUNK_ROWS`` replaces the choice."""
    override = os.environ.get(CHUNK_ROWS_ENV)
    if override:
        if not override.isdigit() or int(override) < 1:
            raise ValueError(f"{CHUNK_ROWS_ENV} must be a positive integer (rows per chunk), got {override!r}")
        return max(1, min(n_rows, int(override)))
    x_sized = n_rows * hidden // max(vocab, 1)
    efficient = min(EFFICIENT_CHUNK_ROWS, max(n_rows // MAX_CHUNK_FRACTION, MIN_CHUNK_ROWS))
    wanted = max(x_sized, efficient, 1)
    return min(n_rows, 1 << (wanted.bit_length() - 1)) or 1  # the largest power of two <= wanted


def check_linear_head(names: Sequence[str], input: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None, layout: Sequence[str] = ("BT", "H")) -> None:
    """A model's last linear layer: ``input`` of ``layout`` (its last dim H), ``weight`` (V, H) and an optional
    ``bias`` (V,), all float, in input's dtype and on its device. ``names``: the three arguments' names."""
    input_name, weight_name, bias_name = names
    check_float_tensor(input_name, input)
    check_float_tensor(weight_name, weight)
    if input.dim() != len(layout):
        raise ValueError(f"{input_name} must be {len(layout)}-D ({', '.join(layout)}), got shape {tuple(input.shape)}")
    if weight.dim() != 2 or weight.shape[1] != input.shape[-1]:
        raise ValueError(f"{weight_name} must have shape (V, H) with H = {input.shape[-1]} to match {input_name}, "
                         f"got {tuple(weight.shape)}")
    for name, t in ((weight_name, weight), (bias_name, bias)):
        if t is None:
            continue
        check_float_tensor(name, t)
        if t.dtype != input.dtype:
            raise TypeError(f"{name} must have the dtype of {input_name} ({input.dtype}), got {t.dtype}")
        if t.device != input.device:
            raise RuntimeError(f"{name} must be on the device of {input_name} ({input.device}), got {t.device}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{bias_name} must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")


def check_second_head(names: Sequence[str], input: torch.Tensor, weight: torch.Tensor, first_names: Sequence[str],
                      first_input: torch.Tensor, first_weight: torch.Tensor, rows: str) -> None:
    """A second model's head (a teacher's, a reference model's) beside the first, each already checked with
    ``check_linear_head``: the same leading dims of input (``rows`` names them: all dims but H), the same
    vocabulary, the same device (its hidden size and dtype may differ)."""
    lead = first_input.dim() - 1
    if tuple(input.shape[:lead]) != tuple(first_input.shape[:lead]):
        raise ValueError(f"{names[0]} must have the {rows} of {first_names[0]} {tuple(first_input.shape[:lead])}, "
                         f"got {tuple(input.shape[:lead])}")
    if weight.shape[0] != first_weight.shape[0]:
        raise ValueError(f"{names[1]} must have the vocabulary of {first_names[1]} ({first_weight.shape[0]}), "
                         f"got {weight.shape[0]}")
    if input.device != first_input.device:
        raise RuntimeError(f"{names[0]} must be on the device of {first_names[0]} ({first_input.device}), "
                           f"got {input.device}")
