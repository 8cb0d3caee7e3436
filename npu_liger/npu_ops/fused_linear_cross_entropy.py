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
so only the cross-chunk sums round (as Liger's chunked version does). ``accum_dtype`` (Liger's option, e.g.
torch.float32) accumulates grad_weight and grad_bias in that dtype instead, for runs that need it: each chunk's
product then goes through one more (V, H) buffer in weight's dtype, added into the accumulator.

The options, class weights (``ce_weight``), statistics and token scaling are cross_entropy's (``_loss.py``,
``_cross_entropy_rows.py``); the loss is fp32 (Hugging Face upcasts the logits before its loss, and Liger's
fused loss is fp32 too).

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
from ._cross_entropy_rows import launch_rows
from ._loss import LossOptions, check_loss_options, check_targets, empty_stats, loss_stats, reduce_rows, target_scale
from ._triton import check_float_tensor, new_like

ACCUM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_like_x(name: str, t: torch.Tensor, x: torch.Tensor, shape, shape_name: str) -> None:
    check_float_tensor(name, t)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {shape_name} = {tuple(shape)}, got {tuple(t.shape)}")
    if t.dtype != x.dtype:
        raise TypeError(f"{name} must have the dtype of x ({x.dtype}), got {t.dtype}")
    if t.device != x.device:
        raise RuntimeError(f"{name} must be on the device of x ({x.device}), got {t.device}")


def check_flce_inputs(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                      ce_weight: Optional[torch.Tensor], options: LossOptions,
                      accum_dtype: Optional[torch.dtype] = None) -> None:
    check_float_tensor("x", x)
    check_float_tensor("weight", weight)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (BT, H), got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must have shape (V, H) with H = {x.shape[1]} to match x, got {tuple(weight.shape)}")
    _check_like_x("weight", weight, x, weight.shape, "(V, H)")
    if bias is not None:
        _check_like_x("bias", bias, x, (weight.shape[0],), "(V,)")
    check_targets(target, x.shape[0], ce_weight, weight.shape[0], "x", x, weight_name="ce_weight")
    check_loss_options(options)
    if accum_dtype is not None and accum_dtype not in ACCUM_DTYPES:
        raise TypeError(f"accum_dtype must be None or one of float32, float16, bfloat16, got {accum_dtype}")


def _empty(ref: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=ref.dtype, device=ref.device)


class _Accumulator:
    """grad_weight (and grad_bias) summed over chunks: in place in the gradient (weight's dtype), or in an
    ``accum_dtype`` buffer with each chunk's product through a scratch buffer in weight's dtype."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], grad_weight: bool, grad_bias: bool,
                 accum_dtype: Optional[torch.dtype]):
        wide = accum_dtype is not None and accum_dtype != weight.dtype
        self.dtype = weight.dtype
        self.weight = None
        if grad_weight:
            self.weight = torch.zeros_like(weight, dtype=accum_dtype) if wide else new_like(weight)
        self.scratch = new_like(weight) if grad_weight and wide else None
        self.bias = torch.zeros((weight.shape[0],), dtype=torch.float32, device=weight.device) if grad_bias else None

    def add(self, grad_logits: torch.Tensor, x_chunk: torch.Tensor, first: bool) -> None:
        if self.weight is not None:
            if self.scratch is None:  # the first chunk overwrites (beta=0): no zero fill
                self.weight.addmm_(grad_logits.t(), x_chunk, beta=0.0 if first else 1.0)
            else:
                self.weight += torch.mm(grad_logits.t(), x_chunk, out=self.scratch)
        if self.bias is not None:
            self.bias += grad_logits.sum(0, dtype=torch.float32)

    def results(self, n_rows: int, ref: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        weight = _empty(ref) if self.weight is None else self.weight
        if self.weight is not None and n_rows == 0 and self.scratch is None:
            weight.zero_()  # no chunk ran: a sum over nothing
        return weight.to(self.dtype), _empty(ref) if self.bias is None else self.bias.to(self.dtype)


def _run_chunks(x, weight, target, bias, ce_weight, options: LossOptions, scale, row_losses, grad_x,
                accumulator: Optional[_Accumulator], z_rows=None, argmax_rows=None) -> None:
    """The chunk loop; grad_x is computed when its buffer is given, grad_weight / grad_bias through
    ``accumulator`` (None: not wanted). ``scale`` is 0-d or per row."""
    n_rows, vocab = x.shape[0], weight.shape[0]
    wants_grad = grad_x is not None or accumulator is not None
    rows = chunk_rows(n_rows, x.shape[1], vocab)
    logits_buffer = torch.empty((min(rows, n_rows), vocab), dtype=x.dtype, device=x.device)
    weight_t = weight.t()
    weight_sum = None if ce_weight is None else ce_weight.sum(dtype=torch.float32)
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        x_chunk = x[start:end]
        logits = logits_buffer[: end - start]
        if bias is None:
            torch.mm(x_chunk, weight_t, out=logits)
        else:
            torch.addmm(bias, x_chunk, weight_t, out=logits)
        chunk_scale = scale[start:end] if scale.dim() else scale
        chunk_stats = () if z_rows is None else (z_rows[start:end], argmax_rows[start:end])
        launch_rows(logits, target[start:end], ce_weight, weight_sum, row_losses[start:end],
                    logits if wants_grad else None, chunk_scale, options, *chunk_stats)
        if grad_x is not None:
            torch.mm(logits, weight, out=grad_x[start:end])
        if accumulator is not None:
            accumulator.add(logits, x_chunk, first=start == 0)


def fused_linear_cross_entropy_forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                       bias: Optional[torch.Tensor] = None, ce_weight: Optional[torch.Tensor] = None,
                                       ignore_index: int = -100, reduction: str = "mean",
                                       label_smoothing: float = 0.0, softcap: Optional[float] = None,
                                       lse_square_scale: float = 0.0, use_token_scaling: bool = False,
                                       accum_dtype: Optional[torch.dtype] = None, grad_x: bool = False,
                                       grad_weight: bool = False, grad_bias: bool = False, stats: bool = False
                                       ) -> Tuple[torch.Tensor, ...]:
    """(loss, grad_x, grad_weight, grad_bias, z_loss, token_accuracy, predicted_tokens): the fp32 loss ((BT,) for
    ``none``, else 0-d), the gradients asked for (for an incoming gradient of 1; each an empty (0,) tensor when
    not asked for, and always for ``reduction="none"``, whose gradients come from
    ``fused_linear_cross_entropy_backward``) and, with ``stats``, the ``_loss.LossStats`` (else empty tensors)."""
    options = LossOptions(ignore_index, reduction, label_smoothing, softcap, lse_square_scale, use_token_scaling)
    check_flce_inputs(x, weight, target, bias, ce_weight, options, accum_dtype)
    n_rows, vocab = x.shape[0], weight.shape[0]
    if reduction == "none":
        grad_x = grad_weight = grad_bias = False
    grad_bias = grad_bias and bias is not None
    scale = target_scale(target, ce_weight, ignore_index, reduction, vocab)
    row_losses = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    gx = new_like(x) if grad_x else None
    accumulator = _Accumulator(weight, bias, grad_weight, grad_bias, accum_dtype) if grad_weight or grad_bias else None
    z_rows = torch.empty((n_rows,), dtype=torch.float32, device=x.device) if stats else None
    argmax_rows = torch.empty((n_rows,), dtype=torch.int64, device=x.device) if stats else None
    _run_chunks(x, weight, target, bias, ce_weight, options, scale, row_losses, gx, accumulator, z_rows, argmax_rows)
    loss = reduce_rows(row_losses, scale, reduction)
    gw, gb = accumulator.results(n_rows, x) if accumulator is not None else (_empty(weight), _empty(x))
    extra = loss_stats(z_rows, argmax_rows, target, scale, options, loss.dtype) if stats else empty_stats(x)
    return (loss, _empty(x) if gx is None else gx, gw, gb, *extra)


def fused_linear_cross_entropy_backward(grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                        target: torch.Tensor, bias: Optional[torch.Tensor],
                                        ce_weight: Optional[torch.Tensor], ignore_index: int,
                                        label_smoothing: float, softcap: Optional[float], lse_square_scale: float,
                                        use_token_scaling: bool, accum_dtype: Optional[torch.dtype], grad_x: bool,
                                        grad_weight: bool, grad_bias: bool
                                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for ``reduction="none"`` with the per-row incoming gradient ``grad_loss`` (BT,): the chunks are
    recomputed with each row's gradient scaled by its entry. Not-asked-for gradients are empty (0,) tensors."""
    options = LossOptions(ignore_index, "none", label_smoothing, softcap, lse_square_scale, use_token_scaling)
    check_flce_inputs(x, weight, target, bias, ce_weight, options, accum_dtype)
    check_float_tensor("grad_loss", grad_loss)
    if grad_loss.shape != (x.shape[0],):
        raise ValueError(f"grad_loss must have shape (BT,) = ({x.shape[0]},), got {tuple(grad_loss.shape)}")
    grad_bias = grad_bias and bias is not None
    scale = grad_loss.to(torch.float32).contiguous()
    row_losses = torch.empty((x.shape[0],), dtype=torch.float32, device=x.device)  # recomputed, unused
    gx = new_like(x) if grad_x else None
    accumulator = _Accumulator(weight, bias, grad_weight, grad_bias, accum_dtype) if grad_weight or grad_bias else None
    _run_chunks(x, weight, target, bias, ce_weight, options, scale, row_losses, gx, accumulator)
    gw, gb = accumulator.results(x.shape[0], x) if accumulator is not None else (_empty(weight), _empty(x))
    return _empty(x) if gx is None else gx, gw, gb
