"""The chunk policy of the fused linear losses (fused_linear_cross_entropy, fused_linear_jsd): how many rows of x
one chunk of logits holds. The reasoning and the H200 measurements are in ``fused_linear_cross_entropy.py``'s
docstring; ``NPU_LIGER_FLCE_CHUNK_ROWS=<rows>`` overrides the choice for both losses (read per call, at run time,
also under torch.compile).
"""

from __future__ import annotations

import os

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
