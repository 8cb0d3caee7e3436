"""Fused linear cross entropy: ``cross_entropy(x @ weight.T + bias, target, ...)`` without the (BT, V) logits.

The rows of x are processed in chunks. Per chunk of n rows:

    logits = x_chunk @ weight.T (+ bias)          torch's matmul (cuBLAS / the NPU's cube unit), (n, V) in x's dtype
    the cross-entropy kernel, in place           per-row losses, and the logits buffer overwritten by its gradient
    grad_x[chunk] = grad_logits @ weight          written straight into grad_x
    grad_weight  += grad_logits.T @ x_chunk       addmm_ into grad_weight (weight's dtype; the first chunk
                                                  overwrites with beta=0, so no zero fill)
    grad_bias    += grad_logits.sum(0)            fp32, cast at the end

so the extra memory is one chunk of logits (reused by every chunk) and the per-row losses. The gradients come
out of the forward pass (for an incoming gradient of 1; the autograd formula scales them), because the
forward has the chunk's logits in hand: recomputing them in the backward would cost a third matmul per chunk.
``reduction="none"`` is the exception: each row's gradient must be scaled by its own incoming gradient before
it is summed into grad_weight, so there the forward computes losses only and ``fused_linear_cross_entropy_
backward`` recomputes the chunks with those per-row scales.

grad_weight accumulates in weight's dtype: an fp32 accumulator would be V x H x 4 bytes (2.1 GB at V=128256,
H=4096), twice the bf16 gradient itself, which defeats the purpose; each chunk's matmul sums in fp32 inside,
so only the cross-chunk sums round (as Liger's chunked version does).

Chunk size (``chunk_rows``): big enough that the matmuls run at full speed, small enough that the chunk is a
small part of the logits. The binding matmul is the weight-gradient update: ``grad_weight += grad_logits.T @
x_chunk`` reads and writes all of grad_weight (V x H) for only ``rows`` multiply-adds per element, about rows / 2
flops per byte in bf16, so below ~400 rows it is memory-bound (an H200 needs ~200 flops per byte: 989 TFLOP/s
over 4.8 TB/s; Ascend 910B's cube unit is similar). Hence EFFICIENT_CHUNK_ROWS = 1024 rows, but never more than
a quarter of the rows (so the chunk's logits are at most 1/4 of the fp32 logits, 1/8 in bf16; calls of fewer
than 4 x MIN_CHUNK_ROWS rows take MIN_CHUNK_ROWS); and when logits of x's size (BT x H elements) are more rows
than that, those. Measured on an H200 (BT=8192, H=4096, V=128256,
bf16, forward+backward): 256 rows 58.5 ms, 512 rows 46.4 ms, 1024 rows 41.1 ms (263 MB of bf16 logits, 1/16
of the fp32 logits), 2048 rows 40.1 ms; torch.compile of the unfused loss 39.2 ms with 2 GB of logits.
``NPU_LIGER_FLCE_CHUNK_ROWS=<rows>`` overrides the choice (read per call, at run time, also under torch.compile):
256 gives Liger-Kernel's chunk at that shape, 1/4 of the memory for ~40% more time. Tests replace ``chunk_rows``
to make every loop turn.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._chunked import CHUNK_ROWS_ENV, EFFICIENT_CHUNK_ROWS, MAX_CHUNK_FRACTION, MIN_CHUNK_ROWS  # noqa: F401
from ._chunked import chunk_rows
from ._triton import check_float_tensor, new_like
from .cross_entropy import check_cross_entropy_args, launch_rows, reduce_rows, target_scale


def check_flce_inputs(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                      ignore_index: int, reduction: str, label_smoothing: float, softcap: Optional[float],
                      lse_square_scale: float) -> None:
    check_float_tensor("x", x)
    check_float_tensor("weight", weight)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (BT, H), got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must have shape (V, H) with H = {x.shape[1]} to match x, got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have the dtype of x ({x.dtype}), got {weight.dtype}")
    if weight.device != x.device:
        raise RuntimeError(f"weight must be on the device of x ({x.device}), got {weight.device}")
    if bias is not None:
        check_float_tensor("bias", bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"bias must have the dtype of x ({x.dtype}), got {bias.dtype}")
        if bias.device != x.device:
            raise RuntimeError(f"bias must be on the device of x ({x.device}), got {bias.device}")
    check_cross_entropy_args(target, x.shape[0], ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
                             "x", x)


def _empty(ref: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=ref.dtype, device=ref.device)


def _run_chunks(x, weight, target, bias, ignore_index, label_smoothing, softcap, lse_square_scale, scale,
                row_losses, grad_x, grad_weight, grad_bias32) -> None:
    """The chunk loop; a gradient is computed when its buffer is given (``None``: not wanted). ``scale`` is
    0-d or per row."""
    n_rows, vocab = x.shape[0], weight.shape[0]
    wants_grad = grad_x is not None or grad_weight is not None or grad_bias32 is not None
    rows = chunk_rows(n_rows, x.shape[1], vocab)
    logits_buffer = torch.empty((min(rows, n_rows), vocab), dtype=x.dtype, device=x.device)
    weight_t = weight.t()
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        x_chunk = x[start:end]
        logits = logits_buffer[: end - start]
        if bias is None:
            torch.mm(x_chunk, weight_t, out=logits)
        else:
            torch.addmm(bias, x_chunk, weight_t, out=logits)
        chunk_scale = scale[start:end] if scale.dim() else scale
        launch_rows(logits, target[start:end], row_losses[start:end], logits if wants_grad else None, chunk_scale,
                    ignore_index, label_smoothing, softcap, lse_square_scale)
        if grad_x is not None:
            torch.mm(logits, weight, out=grad_x[start:end])
        if grad_weight is not None:
            grad_weight.addmm_(logits.t(), x_chunk, beta=0.0 if start == 0 else 1.0)
        if grad_bias32 is not None:
            grad_bias32 += logits.sum(0, dtype=torch.float32)
    if grad_weight is not None and n_rows == 0:
        grad_weight.zero_()


def fused_linear_cross_entropy_forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                       bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                                       reduction: str = "mean", label_smoothing: float = 0.0,
                                       softcap: Optional[float] = None, lse_square_scale: float = 0.0,
                                       grad_x: bool = False, grad_weight: bool = False, grad_bias: bool = False
                                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_x, grad_weight, grad_bias): the fp32 loss ((BT,) for ``none``, else 0-d) and the gradients
    asked for (for an incoming gradient of 1; each an empty (0,) tensor when not asked for, and always for
    ``reduction="none"``, whose gradients come from ``fused_linear_cross_entropy_backward``)."""
    check_flce_inputs(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, lse_square_scale)
    n_rows, vocab = x.shape[0], weight.shape[0]
    if reduction == "none":
        grad_x = grad_weight = grad_bias = False
    grad_bias = grad_bias and bias is not None
    scale = target_scale(target, ignore_index, reduction, vocab)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    gx = new_like(x) if grad_x else None
    gw = new_like(weight) if grad_weight else None
    gb32 = torch.zeros((vocab,), dtype=torch.float32, device=x.device) if grad_bias else None
    _run_chunks(x, weight, target, bias, ignore_index, label_smoothing, softcap, lse_square_scale, scale, row_losses,
                gx, gw, gb32)
    loss = reduce_rows(row_losses, scale, reduction)
    return (loss, _empty(x) if gx is None else gx, _empty(weight) if gw is None else gw,
            _empty(x) if gb32 is None else gb32.to(x.dtype))


def fused_linear_cross_entropy_backward(grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                        target: torch.Tensor, bias: Optional[torch.Tensor], ignore_index: int,
                                        label_smoothing: float, softcap: Optional[float], lse_square_scale: float,
                                        grad_x: bool, grad_weight: bool, grad_bias: bool
                                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for ``reduction="none"`` with the per-row incoming gradient ``grad_loss`` (BT,): the chunks are
    recomputed with each row's gradient scaled by its entry. Not-asked-for gradients are empty (0,) tensors."""
    check_flce_inputs(x, weight, target, bias, ignore_index, "none", label_smoothing, softcap, lse_square_scale)
    check_float_tensor("grad_loss", grad_loss)
    if grad_loss.shape != (x.shape[0],):
        raise ValueError(f"grad_loss must have shape (BT,) = ({x.shape[0]},), got {tuple(grad_loss.shape)}")
    grad_bias = grad_bias and bias is not None
    scale = grad_loss.to(torch.float32).contiguous()
    row_losses = torch.empty((x.shape[0],), dtype=torch.float32, device=x.device)  # recomputed, unused
    gx = new_like(x) if grad_x else None
    gw = new_like(weight) if grad_weight else None
    gb32 = torch.zeros((weight.shape[0],), dtype=torch.float32, device=x.device) if grad_bias else None
    _run_chunks(x, weight, target, bias, ignore_index, label_smoothing, softcap, lse_square_scale, scale, row_losses,
                gx, gw, gb32)
    return (_empty(x) if gx is None else gx, _empty(weight) if gw is None else gw,
            _empty(x) if gb32 is None else gb32.to(x.dtype))
