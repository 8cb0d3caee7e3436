"""Fused linear JSD: ``jsd(log_softmax(student_input @ student_weight.T / T), log_softmax(teacher_input @
teacher_weight.T / T), shift_labels, jsd_beta, ignore_index)`` without the (BT, V) logits of either model.

The rows are processed in chunks of ``chunk_rows`` (the chunk policy of fused_linear_cross_entropy,
``_chunked.py``). Per chunk of n rows:

    s = student_input[chunk] @ student_weight.T      torch's matmul, (n, V) in the student's dtype
    t = teacher_input[chunk] @ teacher_weight.T      (n, V) in the teacher's dtype
    the JSD kernel from logits (``_divergence.py``, FROM_LOGITS): per-row losses, and s overwritten by
        d loss / d s = (dX - Q * sum(dX)) / T, scaled by 1 / valid rows
    grad_input[chunk] = s @ student_weight           written straight into grad_input
    grad_weight      += s.T @ student_input[chunk]   addmm_ into grad_weight (the weight's dtype; the first chunk
                                                     overwrites with beta=0)

so the extra memory is one chunk of logits per model (reused by every chunk) and the per-row losses. The
gradients come out of the forward pass (for an incoming gradient of 1; the autograd formula scales them), as in
fused_linear_cross_entropy, whose reasoning about grad_weight's accumulation dtype applies unchanged. The loss is
fp32; rows whose label is ignore_index count for nothing; the divisor (valid rows, clamped to 1) stays on the
device. The teacher gets no gradient (its inputs are a frozen model's: detach them, or they are treated as
constants); student and teacher may differ in hidden size and dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._chunked import check_linear_head, check_second_head, chunk_rows
from ._divergence import check_beta, check_labels, launch_jsd_rows, valid_row_scale
from ._triton import new_like


def check_fused_linear_jsd_options(jsd_beta: float, temperature: float) -> None:
    check_beta("jsd_beta", jsd_beta)
    if not 0.0 < temperature < float("inf"):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")


def check_fused_linear_jsd_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                  jsd_beta, ignore_index, temperature) -> None:
    student, teacher = ("student_input", "student_weight", ""), ("teacher_input", "teacher_weight", "")
    check_linear_head(student, student_input, student_weight)
    check_linear_head(teacher, teacher_input, teacher_weight)
    check_second_head(teacher, teacher_input, teacher_weight, student, student_input, student_weight, "rows")
    check_fused_linear_jsd_options(jsd_beta, temperature)
    check_labels(shift_labels, student_input.shape[0], "student_input", student_input, ignore_index)


def _empty(ref: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=ref.dtype, device=ref.device)


def fused_linear_jsd_forward(student_input: torch.Tensor, student_weight: torch.Tensor, teacher_input: torch.Tensor,
                             teacher_weight: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
                             jsd_beta: float = 0.5, ignore_index: int = -100, temperature: float = 1.0,
                             grad_input: bool = False, grad_weight: bool = False
                             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_student_input, grad_student_weight): the fp32 0-d loss and the gradients asked for (for an
    incoming gradient of 1; an empty (0,) tensor when not asked for)."""
    check_fused_linear_jsd_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                  jsd_beta, ignore_index, temperature)
    n_rows, vocab = student_input.shape[0], student_weight.shape[0]
    device = student_input.device
    scale = valid_row_scale(shift_labels, ignore_index, n_rows, device)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=device)
    gx = new_like(student_input) if grad_input else None
    gw = new_like(student_weight) if grad_weight else None
    wants = gx is not None or gw is not None
    rows = chunk_rows(n_rows, student_input.shape[1], vocab)
    student_buffer = torch.empty((min(rows, n_rows), vocab), dtype=student_input.dtype, device=device)
    teacher_buffer = torch.empty((min(rows, n_rows), vocab), dtype=teacher_input.dtype, device=device)
    student_weight_t, teacher_weight_t = student_weight.t(), teacher_weight.t()
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        x_chunk = student_input[start:end]
        student_logits, teacher_logits = student_buffer[: end - start], teacher_buffer[: end - start]
        torch.mm(x_chunk, student_weight_t, out=student_logits)
        torch.mm(teacher_input[start:end], teacher_weight_t, out=teacher_logits)
        launch_jsd_rows(student_logits, teacher_logits, None if shift_labels is None else shift_labels[start:end],
                        scale, row_losses[start:end], student_logits if wants else None, jsd_beta, ignore_index,
                        temperature)
        if gx is not None:
            torch.mm(student_logits, student_weight, out=gx[start:end])
        if gw is not None:
            gw.addmm_(student_logits.t(), x_chunk, beta=0.0 if start == 0 else 1.0)
    if gw is not None and n_rows == 0:
        gw.zero_()
    loss = row_losses.sum() * scale
    return loss, _empty(student_input) if gx is None else gx, _empty(student_weight) if gw is None else gw
