"""TVD: total variation distance between two (BT, V) distributions, ``0.5 * |p - q|`` per element.

    none      -> (BT, V) elementwise 0.5|p - q|, rows whose label == ignore_index set to 0
    sum       -> sum over valid rows
    mean      -> sum / (valid rows * V)     (0 when no row is valid)
    batchmean -> sum / valid rows           (0 when no row is valid)

p and q may differ in dtype (fp32, fp16, bf16 in any mix, as Liger-Kernel allows: a bf16 student against an
fp32 teacher); the math is fp32 either way. The loss is in ``torch.promote_types(p.dtype, q.dtype)`` (p's dtype
when they agree: what the loss is in elsewhere in a half-precision model); scalar reductions accumulate in
fp32. grad_p is in p's dtype and grad_q in q's.

Two passes and no host synchronisation: a Triton row kernel writes either the elementwise output or one fp32
partial sum per row; the scalar is then ``row_sums.sum() / divisor`` in torch, the divisor counted on the
device from the labels. The gradient is ``grad_p = 0.5 * sign(p - q) * g`` and ``grad_q = -grad_p`` with
``g = grad_out / divisor`` (a device scalar) or grad_out itself, (BT, V), for ``none``; sign(0) = 0, so the
gradients are exactly 0 where p == q, as autograd of ``torch.abs`` gives, and ignored rows get exact zeros.

The backward comes in two forms with bitwise-identical results:
- from p and q (``tvd_backward``, the ``npu_liger::tvd_backward`` op): reads p, q (and the labels), writes
  grad_p and grad_q. Forward + backward then moves 6 (BT x V) tensors.
- from codes (``tvd_forward(..., save_codes=True)`` + ``tvd_backward_from_codes``, the eager training path):
  the forward also stores the sign of p - q as a 2-bit code per element (0: p == q, 1: p > q, 2: p < q,
  3: ignored row), four to a byte, 1/16 of p's bytes in fp32; the backward reads only those codes (and an
  elementwise grad_out) and writes grad_p and grad_q. Forward + backward moves 4 tensors and the codes, 3 when
  one input needs no gradient (a distillation teacher's q): that gradient is neither allocated nor written.
  Codes layout: a forward tile is (4, QUARTER) columns ``start + slot * QUARTER + lane``; byte
  ``start // 4 + lane`` of the row holds its four slots (slot j in bits 2j, 2j+1). A row has
  ``cdiv(V, 4 * QUARTER) * QUARTER`` bytes; the backward's tasks are (row, tile of BYTES bytes), BYTES a divisor
  of QUARTER, in row-major order over the whole tensor (each forward program walks one row).

All kernels run a persistent grid-stride loop (over rows; over (row, tile) tasks for the codes backward; offsets
in int64) and tile V with the UB manager's block; p, q and an elementwise grad_out are addressed through (row,
column) strides, so views need no copy.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
import triton.language as tl

from ._triton import (cdiv, check_float_tensor, flat_plan, grid_stride, launched_kernel, new_like, program_start,
                     require_launchable)

REDUCTIONS = ("none", "sum", "mean", "batchmean")
LABEL_DTYPES = (torch.int32, torch.int64)

# Memory analysis (all arithmetic in fp32, so tiles are sized in fp32 elements: dtype_size = 4). One row is
# processed at a time, V tiled by BLOCK_V.
# Forward, per element of the V tile: p, q (upcast), |p - q| / 2, and the fp32 row accumulator (scalar
#   reductions) or the value before the cast (none): ~4 live fp32 values -> memory_multiplier 4.0
#   (Ascend910B3: 192 KiB * 0.8 / (4.0 * 4 B) = 9830 -> BLOCK_V 8192). Storing codes adds the fp32 code and
#   its weighted copy (the packed byte is 1/4 of a value): ~6 -> memory_multiplier 6.0 (6553 -> 4096).
# Backward from p and q: p, q, p - q, sign, the incoming gradient (elementwise for none), grad_p and its
#   negation: ~6 live fp32 values -> memory_multiplier 6.0 (6553 -> BLOCK_V 4096).
# Backward from codes: the unpacked int32 code, sign, the incoming gradient, grad_p and its negation, plus
#   the packed byte (1/4): ~6 -> memory_multiplier 6.0.
# The Ascend compile check (docs/ASCEND_CHECK.md) found the fp32 forward with labels at BLOCK_V 8192 4% over
#   the 910B UB (1639168 of 1572864 bits): fp32 inputs use 5.0 (7864 -> 4096); fp16/bf16 fit at 4.0.
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims, unit_param = 1.
FORWARD_MEMORY_MULTIPLIER = 4.0
FORWARD_MEMORY_MULTIPLIER_FP32 = 5.0
FORWARD_CODES_MEMORY_MULTIPLIER = 6.0
BACKWARD_MEMORY_MULTIPLIER = 6.0


@launched_kernel
def _tvd_fwd_kernel(p_ptr, q_ptr, labels_ptr, out_ptr, row_sums_ptr, codes_ptr, n_rows, n_cols,
                    p_stride_row, p_stride_col, q_stride_row, q_stride_col, labels_stride, out_stride_row,
                    codes_stride_row, ignore_index, HAS_LABELS: tl.constexpr, ELEMENTWISE: tl.constexpr,
                    SAVE_CODES: tl.constexpr, QUARTER: tl.constexpr):
    """A V tile is (4, QUARTER): column ``start + slot * QUARTER + lane``, contiguous along the lanes."""
    slots = tl.arange(0, 4)[:, None]
    lanes = tl.arange(0, QUARTER)
    slot_weights = (1 << (slots * 2)).to(tl.float32)  # slot j's code goes to bits 2j, 2j + 1
    # int64 rows from the start (program_start/grid_stride with a block of 1): the interpreter's loop variable
    # is a Python int, which has no .to(), so the row cannot be widened inside the loop.
    for row64 in tl.range(program_start(1), n_rows, grid_stride(1)):
        p_row = p_ptr + row64 * p_stride_row
        q_row = q_ptr + row64 * q_stride_row
        read_cols = n_cols
        if HAS_LABELS:  # an ignored row reads nothing (its loads are masked off) and yields zeros
            read_cols = tl.where(tl.load(labels_ptr + row64 * labels_stride) != ignore_index, n_cols, 0)
        acc = tl.zeros((4, QUARTER), dtype=tl.float32)
        for start in tl.range(0, n_cols, QUARTER * 4):
            cols = start + slots * QUARTER + lanes[None, :]
            mask = cols < n_cols
            load_mask = cols < read_cols
            cols64 = cols.to(tl.int64)
            p = tl.load(p_row + cols64 * p_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            q = tl.load(q_row + cols64 * q_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            diff = p - q
            tv = tl.abs(diff) * 0.5
            if ELEMENTWISE:
                tl.store(out_ptr + row64 * out_stride_row + cols64, tv.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                acc += tv
            if SAVE_CODES:  # packed in fp32 arithmetic (exact below 2**24): cheaper than byte-wise integer ops
                code = tl.where(diff > 0.0, 1.0, 0.0) + tl.where(diff < 0.0, 2.0, 0.0)
                if HAS_LABELS:
                    code = tl.where(load_mask, code, 3.0)  # 3: ignored row (and the padding past V, never read)
                packed = tl.sum(code * slot_weights, axis=0).to(tl.int32)
                tl.store(codes_ptr + row64 * codes_stride_row + start // 4 + lanes, packed.to(tl.uint8))
        if not ELEMENTWISE:
            tl.store(row_sums_ptr + row64, tl.sum(tl.sum(acc, axis=0), axis=0))


@launched_kernel
def _tvd_bwd_kernel(grad_ptr, p_ptr, q_ptr, labels_ptr, grad_p_ptr, grad_q_ptr, n_rows, n_cols,
                    grad_stride_row, grad_stride_col, p_stride_row, p_stride_col, q_stride_row, q_stride_col,
                    labels_stride, ignore_index, HAS_LABELS: tl.constexpr, ELEMENTWISE_GRAD: tl.constexpr,
                    BLOCK_V: tl.constexpr):
    if not ELEMENTWISE_GRAD:
        half_scale = tl.load(grad_ptr).to(tl.float32) * 0.5  # grad_out / divisor, computed on the device
    # int64 rows from the start (program_start/grid_stride with a block of 1): the interpreter's loop variable
    # is a Python int, which has no .to(), so the row cannot be widened inside the loop.
    for row64 in tl.range(program_start(1), n_rows, grid_stride(1)):
        p_row = p_ptr + row64 * p_stride_row
        q_row = q_ptr + row64 * q_stride_row
        read_cols = n_cols
        if HAS_LABELS:  # an ignored row reads nothing (its loads are masked off) and yields zeros
            read_cols = tl.where(tl.load(labels_ptr + row64 * labels_stride) != ignore_index, n_cols, 0)
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            load_mask = cols < read_cols
            cols64 = cols.to(tl.int64)
            p = tl.load(p_row + cols64 * p_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            q = tl.load(q_row + cols64 * q_stride_col, mask=load_mask, other=0.0).to(tl.float32)
            diff = p - q
            sign = tl.where(diff > 0.0, 1.0, 0.0) - tl.where(diff < 0.0, 1.0, 0.0)
            if ELEMENTWISE_GRAD:
                g = tl.load(grad_ptr + row64 * grad_stride_row + cols64 * grad_stride_col, mask=load_mask,
                            other=0.0).to(tl.float32)
                grad_p = sign * g * 0.5
            else:
                grad_p = sign * half_scale
            if HAS_LABELS:
                grad_p = tl.where(load_mask, grad_p, 0.0)  # exact zeros for ignored rows, even for a non-finite grad
            offsets = row64 * n_cols + cols64
            tl.store(grad_p_ptr + offsets, grad_p.to(grad_p_ptr.dtype.element_ty), mask=mask)
            tl.store(grad_q_ptr + offsets, (-grad_p).to(grad_q_ptr.dtype.element_ty), mask=mask)


@launched_kernel
def _tvd_bwd_codes_kernel(grad_ptr, codes_ptr, grad_p_ptr, grad_q_ptr, n_tasks, tiles_per_row, n_cols,
                          grad_stride_row, grad_stride_col, codes_stride_row, HAS_IGNORED: tl.constexpr,
                          ELEMENTWISE_GRAD: tl.constexpr, STORE_P: tl.constexpr, STORE_Q: tl.constexpr,
                          QUARTER: tl.constexpr, BYTES: tl.constexpr):
    """grad_p / grad_q from the forward's codes. Task = (row, tile of BYTES code bytes) = (4, BYTES) columns
    ``group * 4 * QUARTER + slot * QUARTER + byte % QUARTER``, tasks in row-major order, so the programs running
    at a time write neighbouring memory (an elementwise kernel's pattern). p, q and the labels are never read.
    HAS_IGNORED: the forward had labels, so code 3 (ignored row) may occur. STORE_P / STORE_Q: whether that
    gradient is wanted (a distillation teacher's q needs none: a quarter of the bytes saved)."""
    if not ELEMENTWISE_GRAD:
        half_scale = tl.load(grad_ptr).to(tl.float32) * 0.5  # grad_out / divisor, computed on the device
    slots = tl.arange(0, 4)[:, None]
    lanes = tl.arange(0, BYTES)
    for task in tl.range(program_start(1), n_tasks, grid_stride(1)):
        row64 = task // tiles_per_row
        b_start = (task % tiles_per_row) * BYTES
        packed = tl.load(codes_ptr + row64 * codes_stride_row + b_start + lanes).to(tl.int32)
        code = (packed[None, :] >> (slots * 2)) & 3
        cols = (b_start // QUARTER) * (4 * QUARTER) + slots * QUARTER + (b_start % QUARTER) + lanes[None, :]
        mask = cols < n_cols
        sign = ((code & 1) - (code >> 1)).to(tl.float32)  # codes 0, 1, 2 -> 0, 1, -1 (3 -> 0)
        if ELEMENTWISE_GRAD:
            g_mask = mask
            if HAS_IGNORED:  # ignored rows read nothing (an element mask: the loads are not vectorised then)
                g_mask = mask & (code != 3)
            g = tl.load(grad_ptr + row64 * grad_stride_row + cols * grad_stride_col, mask=g_mask,
                        other=0.0).to(tl.float32)
            grad_p = sign * g * 0.5
        else:
            grad_p = sign * half_scale
        if HAS_IGNORED:  # exact zeros for ignored rows, even for a non-finite grad
            grad_p = tl.where(code == 3, 0.0, grad_p)
        offsets = row64 * n_cols + cols
        if STORE_P:
            tl.store(grad_p_ptr + offsets, grad_p.to(grad_p_ptr.dtype.element_ty), mask=mask)
        if STORE_Q:
            tl.store(grad_q_ptr + offsets, (-grad_p).to(grad_q_ptr.dtype.element_ty), mask=mask)


def loss_dtype(p: torch.Tensor, q: torch.Tensor) -> torch.dtype:
    """The dtype of the loss (and of its incoming gradient): p's and q's promoted, p's when they agree."""
    return torch.promote_types(p.dtype, q.dtype)


def check_tvd_inputs(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor], reduction: str,
                     ignore_index: int) -> None:
    check_float_tensor("p", p)
    check_float_tensor("q", q)  # any supported dtype: it need not be p's
    if p.dim() != 2:
        raise ValueError(f"p must be 2-D (BT, V), got shape {tuple(p.shape)}")
    if q.shape != p.shape:
        raise ValueError(f"q must have the shape of p {tuple(p.shape)}, got {tuple(q.shape)}")
    if q.device != p.device:
        raise RuntimeError(f"q must be on the device of p ({p.device}), got {q.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, torch.SymInt)):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if shift_labels is None:
        return
    if not isinstance(shift_labels, torch.Tensor):
        raise TypeError(f"shift_labels must be a torch.Tensor or None, got {type(shift_labels).__name__}")
    if shift_labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"shift_labels must be int32 or int64, got {shift_labels.dtype}")
    if shift_labels.dim() != 1 or shift_labels.shape[0] != p.shape[0]:
        raise ValueError(f"shift_labels must have shape (BT,) = ({p.shape[0]},) to match p, "
                         f"got {tuple(shift_labels.shape)}")
    if shift_labels.device != p.device:
        raise RuntimeError(f"shift_labels must be on the device of p ({p.device}), got {shift_labels.device}")


def check_tvd_grad(grad_out: torch.Tensor, shape: torch.Size, device: torch.device, reduction: str,
                   dtype: torch.dtype) -> None:
    """``shape``, ``device``: p's; ``dtype``: the loss's (``loss_dtype(p, q)``)."""
    check_float_tensor("grad_out", grad_out)
    if reduction == "none" and grad_out.shape != shape:
        raise ValueError(f"grad_out must have the shape of p {tuple(shape)}, got {tuple(grad_out.shape)}")
    if reduction != "none" and grad_out.dim() != 0:
        raise ValueError(
            f"grad_out must be a 0-d tensor for reduction={reduction!r}, got shape {tuple(grad_out.shape)}"
        )
    if grad_out.dtype != dtype:
        raise TypeError(f"grad_out must have the dtype of the loss ({dtype}), got {grad_out.dtype}")
    if grad_out.device != device:
        raise RuntimeError(f"grad_out must be on the device of p ({device}), got {grad_out.device}")


def _divisor(shift_labels: Optional[torch.Tensor], reduction: str, ignore_index: int, n_rows: int,
             n_cols: int) -> Union[int, torch.Tensor]:
    """What the summed loss is divided by: a Python int without labels, else a device tensor (no sync).
    Clamped to >= 1: with no valid element the sum is 0, and 0 / 1 gives the documented 0."""
    if reduction == "sum":
        return 1
    per_row = n_cols if reduction == "mean" else 1
    if shift_labels is None:
        return max(n_rows * per_row, 1)
    return ((shift_labels != ignore_index).sum() * per_row).clamp_min(1)


def _labels_args(shift_labels: Optional[torch.Tensor], dummy: torch.Tensor) -> Tuple[torch.Tensor, int]:
    if shift_labels is None:
        return dummy, 0  # never read: HAS_LABELS is off
    return shift_labels, shift_labels.stride(0)


def _quarter(block_v: int) -> int:
    return max(block_v // 4, 1)


class TvdCodes(NamedTuple):
    """What ``tvd_forward(..., save_codes=True)`` keeps for ``tvd_backward_from_codes``."""

    codes: Optional[torch.Tensor]  # (BT, cdiv(V, 4 * quarter) * quarter) uint8; None for an empty input
    quarter: int  # the forward tile's QUARTER: the codes layout
    divisor: Union[int, torch.Tensor, None]  # what the summed loss was divided by (None for "none")
    has_labels: bool  # code 3 (ignored row) may occur


def tvd_forward(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
                reduction: str = "batchmean", ignore_index: int = -100, save_codes: bool = False):
    """The loss; with ``save_codes`` the pair ``(loss, TvdCodes)`` for ``tvd_backward_from_codes``."""
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    n_rows, n_cols = p.shape
    elementwise = reduction == "none"
    if elementwise:
        out = torch.empty((n_rows, n_cols), dtype=loss_dtype(p, q), device=p.device)
        row_sums = out  # never written: ELEMENTWISE is on
    else:
        alloc = torch.empty if p.numel() > 0 else torch.zeros  # V == 0: the kernel is skipped, rows sum to 0
        row_sums = alloc((n_rows,), dtype=torch.float32, device=p.device)
        out = row_sums  # never written: ELEMENTWISE is off
    codes, quarter = None, 1
    if p.numel() > 0:
        require_launchable(p.device)
        any_fp32 = torch.float32 in (p.dtype, q.dtype)
        multiplier = (FORWARD_CODES_MEMORY_MULTIPLIER if save_codes else
                      FORWARD_MEMORY_MULTIPLIER_FP32 if any_fp32 else FORWARD_MEMORY_MULTIPLIER)
        plan = flat_plan(p.device.type, n_cols, multiplier)  # one row at a time
        quarter = _quarter(plan.block)
        codes = row_sums  # never written: SAVE_CODES is off
        if save_codes:
            codes = torch.empty((n_rows, cdiv(n_cols, 4 * quarter) * quarter), dtype=torch.uint8,
                                device=p.device)
        labels, labels_stride = _labels_args(shift_labels, p)
        _tvd_fwd_kernel[(plan.grid(n_rows),)](
            p, q, labels, out, row_sums, codes, n_rows, n_cols, p.stride(0), p.stride(1), q.stride(0), q.stride(1),
            labels_stride, out.stride(0), codes.stride(0), ignore_index, HAS_LABELS=shift_labels is not None,
            ELEMENTWISE=elementwise, SAVE_CODES=save_codes, QUARTER=quarter, **plan.launch_options()
        )
    divisor = None if elementwise else _divisor(shift_labels, reduction, ignore_index, n_rows, n_cols)
    loss = out if elementwise else (row_sums.sum() / divisor).to(loss_dtype(p, q))
    if not save_codes:
        return loss
    return loss, TvdCodes(codes if p.numel() > 0 else None, quarter, divisor, shift_labels is not None)


def tvd_backward_from_codes(grad_out: torch.Tensor, saved: TvdCodes, n_rows: int, n_cols: int,
                            p_dtype: torch.dtype, q_dtype: torch.dtype,
                            reduction: str, need_p: bool = True,
                            need_q: bool = True) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """grad_p, grad_q (in p's and q's dtypes) from what ``tvd_forward(..., save_codes=True)`` saved (bitwise the
    same as ``tvd_backward``); p, q and the labels are not needed. A gradient not needed (``need_p``,
    ``need_q``: autograd's ``needs_input_grad``) is None, neither allocated nor written."""
    device = grad_out.device
    grad_p = torch.empty((n_rows, n_cols), dtype=p_dtype, device=device) if need_p else None
    grad_q = torch.empty((n_rows, n_cols), dtype=q_dtype, device=device) if need_q else None
    codes = saved.codes
    if codes is None or not (need_p or need_q):
        return grad_p, grad_q
    require_launchable(device)
    elementwise = reduction == "none"
    if elementwise:
        grad, grad_strides = grad_out, (grad_out.stride(0), grad_out.stride(1))
    else:
        grad = grad_out.to(torch.float32) / saved.divisor
        grad_strides = (0, 0)
    plan = flat_plan(device.type, n_cols, BACKWARD_MEMORY_MULTIPLIER)
    code_bytes = min(saved.quarter, _quarter(plan.block))  # powers of two: divides QUARTER
    tiles_per_row = codes.stride(0) // code_bytes
    n_tasks = n_rows * tiles_per_row
    # a gradient not needed gets the other's pointer, never stored to
    _tvd_bwd_codes_kernel[(plan.grid(n_tasks),)](
        grad, codes, grad_p if need_p else grad_q, grad_q if need_q else grad_p, n_tasks,
        tiles_per_row, n_cols, *grad_strides, codes.stride(0), HAS_IGNORED=saved.has_labels,
        ELEMENTWISE_GRAD=elementwise, STORE_P=need_p, STORE_Q=need_q, QUARTER=saved.quarter, BYTES=code_bytes,
        **plan.launch_options()
    )
    return grad_p, grad_q


def tvd_backward(grad_out: torch.Tensor, p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor],
                 reduction: str, ignore_index: int) -> Tuple[torch.Tensor, torch.Tensor]:
    check_tvd_inputs(p, q, shift_labels, reduction, ignore_index)
    check_tvd_grad(grad_out, p.shape, p.device, reduction, loss_dtype(p, q))
    n_rows, n_cols = p.shape
    grad_p, grad_q = new_like(p), new_like(p, q.dtype)
    if p.numel() == 0:
        return grad_p, grad_q
    require_launchable(p.device)
    elementwise = reduction == "none"
    if elementwise:
        grad, grad_strides = grad_out, (grad_out.stride(0), grad_out.stride(1))
    else:
        grad = grad_out.to(torch.float32) / _divisor(shift_labels, reduction, ignore_index, n_rows, n_cols)
        grad_strides = (0, 0)
    plan = flat_plan(p.device.type, n_cols, BACKWARD_MEMORY_MULTIPLIER)
    labels, labels_stride = _labels_args(shift_labels, p)
    _tvd_bwd_kernel[(plan.grid(n_rows),)](
        grad, p, q, labels, grad_p, grad_q, n_rows, n_cols, *grad_strides, p.stride(0), p.stride(1),
        q.stride(0), q.stride(1), labels_stride, ignore_index, HAS_LABELS=shift_labels is not None,
        ELEMENTWISE_GRAD=elementwise, BLOCK_V=plan.block, **plan.launch_options()
    )
    return grad_p, grad_q
