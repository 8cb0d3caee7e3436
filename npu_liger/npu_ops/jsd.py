"""JSD: the generalised Jensen-Shannon divergence of (BT, V) log-probability rows, loss and gradient in one pass.

``input`` holds the student's log-probabilities X = log Q, ``target`` the teacher's Y = log P (the order of
torch's losses: prediction first). Per row: beta 0 gives KL(P || Q), beta 1 KL(Q || P), otherwise
``beta * KL(P || M) + (1 - beta) * KL(Q || M)`` with ``M = beta * P + (1 - beta) * Q``, as Liger-Kernel's
``LigerJSD`` defines it (the elementwise math and its gradient: ``_divergence.py``). The loss is the sum over V and
rows divided by the number of rows whose label is not ignore_index (all rows when ``shift_labels`` is None),
counted on the device; no valid row gives 0, not NaN. The loss is fp32 for any input dtypes; input and target
may differ in dtype (a bf16 student against an fp32 teacher). The gradient w.r.t. input (in input's dtype, for
an incoming gradient of 1) comes out of the same pass over the rows when it is wanted; the autograd formula
scales it by the incoming gradient. The target gets no gradient (a teacher's output).

One program walks whole rows (persistent grid-stride loop over rows, V tiled by the UB manager's block; see
``JSD_MEMORY_MULTIPLIER`` in ``_divergence.py``); input and target are read through (row, column) strides.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._divergence import check_beta, check_labels, launch_jsd_rows, valid_row_scale
from ._triton import check_float_tensor, new_like


def check_jsd_inputs(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor], beta: float,
                     ignore_index: int) -> None:
    check_float_tensor("input", input)
    check_float_tensor("target", target)  # any supported dtype: it need not be input's
    if input.dim() != 2:
        raise ValueError(f"input must be 2-D (BT, V), got shape {tuple(input.shape)}")
    if target.shape != input.shape:
        raise ValueError(f"target must have the shape of input {tuple(input.shape)}, got {tuple(target.shape)}")
    if target.device != input.device:
        raise RuntimeError(f"target must be on the device of input ({input.device}), got {target.device}")
    check_beta("beta", beta)
    check_labels(shift_labels, input.shape[0], "input", input, ignore_index)


def jsd_forward(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
                beta: float = 0.5, ignore_index: int = -100, compute_grad: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, grad_input): the fp32 0-d loss and, with ``compute_grad``, its gradient w.r.t. input for an incoming
    gradient of 1 (a new (BT, V) tensor in input's dtype); without, an empty (0,) tensor."""
    check_jsd_inputs(input, target, shift_labels, beta, ignore_index)
    n_rows = input.shape[0]
    scale = valid_row_scale(shift_labels, ignore_index, n_rows, input.device)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=input.device)  # the kernel writes every row
    grad = new_like(input) if compute_grad else None
    launch_jsd_rows(input, target, shift_labels, scale, row_losses, grad, beta, ignore_index)
    return row_losses.sum() * scale, grad if grad is not None else input.new_empty((0,))
