"""What the distillation divergences share (jsd and fused_linear_jsd): the generalised Jensen-Shannon row kernel,
the ``shift_labels`` checks and the device-side count of valid rows.

Per element, with X = log Q (student) and Y = log P (teacher), both log-probabilities:

    beta == 0  (forward KL(P || Q))   loss = P * (Y - X)                      dX = -P
    beta == 1  (reverse KL(Q || P))   loss = Q * (X - Y)                      dX = Q * (X - Y + 1)
    otherwise  M = beta * P + (1 - beta) * Q
               loss = beta * P * (Y - log M) + (1 - beta) * Q * (X - log M)   dX = (1 - beta) * Q * (X - log M)

which is ``beta * KL(P || M) + (1 - beta) * KL(Q || M)`` (Liger-Kernel's ``LigerJSD``; dX is the derivative of
that expression in X, X treated as free, as autograd of the expression gives). ``log M`` is computed as a
log-sum-exp of ``Y + log(beta)`` and ``X + log(1 - beta)``: ``log(beta * e^Y + (1 - beta) * e^X)`` directly would
underflow to log(0) = -inf (and 0 * -inf = NaN) for log-probabilities below about -103 in fp32. The larger and
smaller of the two are picked with ``where`` rather than maximum/minimum, so a NaN reaches the result on GPUs
too (their maximum drops NaN).

A row's loss is the sum over V; rows whose label equals ignore_index give 0 and zero gradients; the total is
divided by the number of valid rows (all rows without labels), counted on the device (``valid_row_scale``, no
host synchronisation) and clamped to 1, so no valid row gives 0.

``FROM_LOGITS`` (fused_linear_jsd): the kernel reads raw logits and takes X = x / T - logsumexp(x / T) (and Y
likewise) itself: pass 1 is an online log-sum-exp of both rows, pass 2 the loss (and the row sum of dX), pass 3
the gradient through the log-softmax, ``dz = (dX - Q * sum(dX)) / T``, written into the student logits' buffer
(each block is read before the same program overwrites it, so in place is safe). Without it (jsd), one pass
gives the loss and dX.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ._triton import flat_plan, grid_stride, launched_kernel, program_start, require_launchable

LABEL_DTYPES = (torch.int32, torch.int64)
MODE_FORWARD_KL, MODE_REVERSE_KL, MODE_MIXTURE = 0, 1, 2

# Memory analysis (fp32 arithmetic: tiles sized in fp32 elements). One row at a time, V tiled by BLOCK_V.
# From log-probabilities, per element: X, Y (upcast), P, Q, the two shifted logs and their larger/smaller
#   (transient), log M, the loss term, dX and the fp32 row accumulator: ~10 live -> memory_multiplier 10.0
#   (Ascend910B3: 192 KiB * 0.8 / (10.0 * 4 B) = 3932 -> BLOCK_V 2048).
# From logits, pass 2 adds the shifted logits and the dX accumulator: ~12 live -> memory_multiplier 12.0
#   (192 KiB * 0.8 / (12.0 * 4 B) = 3276 -> BLOCK_V 2048); passes 1 and 3 hold fewer.
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims.
JSD_MEMORY_MULTIPLIER = 10.0
JSD_LOGITS_MEMORY_MULTIPLIER = 12.0


def jsd_mode(beta: float) -> int:
    return MODE_FORWARD_KL if beta == 0.0 else MODE_REVERSE_KL if beta == 1.0 else MODE_MIXTURE


@triton.jit
def _log_mixture(x, y, log_beta, log_1m_beta):
    """log(beta * e^y + (1 - beta) * e^x) as a log-sum-exp (no underflow; NaN kept: no maximum())."""
    a = y + log_beta
    b = x + log_1m_beta
    a_larger = a > b
    hi = tl.where(a_larger, a, b)
    lo = tl.where(a_larger, b, a)
    return hi + tl.log(1.0 + tl.exp(lo - hi))


@triton.jit
def _jsd_term(x, y, beta, log_beta, log_1m_beta, MODE: tl.constexpr):
    """The loss term of one element (module docstring)."""
    if MODE == 0:
        term = tl.exp(y) * (y - x)
    elif MODE == 1:
        term = tl.exp(x) * (x - y)
    else:
        log_m = _log_mixture(x, y, log_beta, log_1m_beta)
        term = tl.exp(y) * (y - log_m) * beta + tl.exp(x) * (x - log_m) * (1.0 - beta)
    return term


@triton.jit
def _jsd_grad(x, y, beta, log_beta, log_1m_beta, MODE: tl.constexpr):
    """d term / dX of one element (module docstring)."""
    if MODE == 0:
        dx = -tl.exp(y)
    elif MODE == 1:
        dx = tl.exp(x) * (x - y + 1.0)
    else:
        dx = tl.exp(x) * (x - _log_mixture(x, y, log_beta, log_1m_beta)) * (1.0 - beta)
    return dx


@triton.jit
def _load_row(row_ptr, stride_col, cols, load_mask, row_max, log_sum, inv_temperature, FROM_LOGITS: tl.constexpr):
    """One tile of a row in fp32: log-probabilities as stored, or logits made log-probabilities as log_softmax
    computes them, ``(z - max) - log(sum(exp(z - max)))``: subtracting the rounded ``max + log(sum)`` instead costs
    every log-probability ~|max| x 2^-24 of absolute error, which a confident row's top log-probability (near 0)
    and the loss of large logits cannot afford (tests/test_fused_linear_jsd.py)."""
    v = tl.load(row_ptr + cols.to(tl.int64) * stride_col, mask=load_mask, other=0.0).to(tl.float32)
    if FROM_LOGITS:
        v = (v * inv_temperature - row_max) - log_sum
    return v


@launched_kernel(do_not_specialize=["n_rows", "ignore_index"])
def _jsd_fwd_kernel(x_ptr, y_ptr, labels_ptr, scale_ptr, row_loss_ptr, grad_ptr, n_rows, n_cols, x_stride_row,
                    x_stride_col, y_stride_row, y_stride_col, labels_stride, grad_stride_row, ignore_index, beta,
                    log_beta, log_1m_beta, inv_temperature, MODE: tl.constexpr, HAS_LABELS: tl.constexpr,
                    FROM_LOGITS: tl.constexpr, COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per row: the loss (unscaled, fp32) into ``row_loss`` and, with COMPUTE_GRAD, the gradient times ``scale``
    (1 / valid rows, read on the device) into ``grad`` (unit column stride; the student logits' own buffer
    when FROM_LOGITS)."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    beta = tl.cast(beta, tl.float32)
    log_beta = tl.cast(log_beta, tl.float32)
    log_1m_beta = tl.cast(log_1m_beta, tl.float32)
    inv_temperature = tl.cast(inv_temperature, tl.float32)
    scale = tl.load(scale_ptr)
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride_row
        y_row = y_ptr + row * y_stride_row
        read_cols = n_cols
        if HAS_LABELS:  # an ignored row reads nothing and yields zeros
            read_cols = tl.where(tl.load(labels_ptr + row * labels_stride) != ignore_index, n_cols, 0)
        max_x = 0.0
        log_sum_x = 0.0
        max_y = 0.0
        log_sum_y = 0.0
        if FROM_LOGITS:  # pass 1: online log-sum-exp of both rows (m starts finite: no inf - inf)
            m_x = -1e30
            d_x = 0.0
            m_y = -1e30
            d_y = 0.0
            for start in tl.range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                load_mask = cols < read_cols
                zx = tl.load(x_row + cols.to(tl.int64) * x_stride_col, mask=load_mask,
                             other=float("-inf")).to(tl.float32) * inv_temperature
                zy = tl.load(y_row + cols.to(tl.int64) * y_stride_col, mask=load_mask,
                             other=float("-inf")).to(tl.float32) * inv_temperature
                mx_new = tl.maximum(m_x, tl.max(zx, axis=0))
                d_x = d_x * tl.exp(m_x - mx_new) + tl.sum(tl.exp(zx - mx_new), axis=0)
                m_x = mx_new
                my_new = tl.maximum(m_y, tl.max(zy, axis=0))
                d_y = d_y * tl.exp(m_y - my_new) + tl.sum(tl.exp(zy - my_new), axis=0)
                m_y = my_new
            # no clamp on d: a NaN or +inf logit makes d NaN and must reach the loss; an ignored row has d = 0
            row_read = read_cols > 0
            max_x = tl.where(row_read, m_x, 0.0)
            log_sum_x = tl.where(row_read, tl.log(tl.where(row_read, d_x, 1.0)), 0.0)
            max_y = tl.where(row_read, m_y, 0.0)
            log_sum_y = tl.where(row_read, tl.log(tl.where(row_read, d_y, 1.0)), 0.0)
        # pass 2: the row's loss (and dX: stored scaled from log-probabilities, summed from logits)
        acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        grad_acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        grad_row = grad_ptr + row * grad_stride_row
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            load_mask = cols < read_cols
            x = _load_row(x_row, x_stride_col, cols, load_mask, max_x, log_sum_x, inv_temperature, FROM_LOGITS)
            y = _load_row(y_row, y_stride_col, cols, load_mask, max_y, log_sum_y, inv_temperature, FROM_LOGITS)
            acc += tl.where(load_mask, _jsd_term(x, y, beta, log_beta, log_1m_beta, MODE), 0.0)
            if COMPUTE_GRAD:
                dx = tl.where(load_mask, _jsd_grad(x, y, beta, log_beta, log_1m_beta, MODE), 0.0)
                if FROM_LOGITS:
                    grad_acc += dx
                else:
                    tl.store(grad_row + cols.to(tl.int64), (dx * scale).to(grad_ptr.dtype.element_ty),
                             mask=cols < n_cols)
        tl.store(row_loss_ptr + row, tl.sum(acc, axis=0))
        if FROM_LOGITS and COMPUTE_GRAD:
            # pass 3: through the log-softmax and the temperature, dz = (dX - Q * sum(dX)) / T
            grad_sum = tl.sum(grad_acc, axis=0)
            for start in tl.range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                load_mask = cols < read_cols
                x = _load_row(x_row, x_stride_col, cols, load_mask, max_x, log_sum_x, inv_temperature, FROM_LOGITS)
                y = _load_row(y_row, y_stride_col, cols, load_mask, max_y, log_sum_y, inv_temperature, FROM_LOGITS)
                dx = _jsd_grad(x, y, beta, log_beta, log_1m_beta, MODE)
                dz = tl.where(load_mask, (dx - tl.exp(x) * grad_sum) * (inv_temperature * scale), 0.0)
                tl.store(grad_row + cols.to(tl.int64), dz.to(grad_ptr.dtype.element_ty), mask=cols < n_cols)


def check_labels(shift_labels: Optional[torch.Tensor], n_rows, ref_name: str, ref: torch.Tensor,
                 ignore_index: int) -> None:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, torch.SymInt)):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if shift_labels is None:
        return
    if not isinstance(shift_labels, torch.Tensor):
        raise TypeError(f"shift_labels must be a torch.Tensor or None, got {type(shift_labels).__name__}")
    if shift_labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"shift_labels must be int32 or int64, got {shift_labels.dtype}")
    if shift_labels.dim() != 1 or shift_labels.shape[0] != n_rows:
        raise ValueError(f"shift_labels must have shape (BT,) = ({n_rows},) to match {ref_name}, "
                         f"got {tuple(shift_labels.shape)}")
    if shift_labels.device != ref.device:
        raise RuntimeError(f"shift_labels must be on the device of {ref_name} ({ref.device}), "
                           f"got {shift_labels.device}")


def check_beta(name: str, beta: float) -> None:
    if not 0.0 <= beta <= 1.0:  # also refuses NaN
        raise ValueError(f"{name} must be in [0, 1], got {beta}")


def valid_row_scale(shift_labels: Optional[torch.Tensor], ignore_index: int, n_rows: int,
                    device: torch.device) -> torch.Tensor:
    """1 / max(valid rows, 1) as an fp32 0-d device tensor (no host synchronisation)."""
    if shift_labels is None:
        return torch.full((), 1.0 / max(n_rows, 1), dtype=torch.float32, device=device)
    return (shift_labels != ignore_index).sum().clamp_min(1).to(torch.float32).reciprocal()


def launch_jsd_rows(x: torch.Tensor, y: torch.Tensor, shift_labels: Optional[torch.Tensor], scale: torch.Tensor,
                    row_losses: torch.Tensor, grad: Optional[torch.Tensor], beta: float, ignore_index: int,
                    temperature: Optional[float] = None) -> None:
    """Run the JSD kernel over the rows of x (student) and y (teacher): per-row losses into ``row_losses`` and,
    with ``grad`` (unit column stride; may be ``x`` itself when ``temperature`` is given), the gradient w.r.t. x
    times ``scale``. ``temperature``: x and y are logits (FROM_LOGITS), else log-probabilities."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return
    if n_cols == 0:
        row_losses.zero_()
        return
    require_launchable(x.device)
    from_logits = temperature is not None
    # Tiles: see JSD_MEMORY_MULTIPLIER / JSD_LOGITS_MEMORY_MULTIPLIER above.
    plan = flat_plan(x.device.type, n_cols, JSD_LOGITS_MEMORY_MULTIPLIER if from_logits else JSD_MEMORY_MULTIPLIER)
    if grad is not None and grad.stride(1) != 1:
        raise RuntimeError("jsd: the gradient buffer must have unit column stride")
    mode = jsd_mode(beta)
    log_beta = math.log(beta) if mode == MODE_MIXTURE else 0.0
    log_1m_beta = math.log1p(-beta) if mode == MODE_MIXTURE else 0.0
    labels, labels_stride = (shift_labels, shift_labels.stride(0)) if shift_labels is not None else (row_losses, 0)
    grad_arg = grad if grad is not None else row_losses  # never written: COMPUTE_GRAD is off
    _jsd_fwd_kernel[(plan.grid(n_rows),)](
        x, y, labels, scale, row_losses, grad_arg, n_rows, n_cols, x.stride(0), x.stride(1), y.stride(0),
        y.stride(1), labels_stride, grad.stride(0) if grad is not None else 0, ignore_index, float(beta), log_beta,
        log_1m_beta, 1.0 / temperature if from_logits else 1.0, MODE=mode, HAS_LABELS=shift_labels is not None,
        FROM_LOGITS=from_logits, COMPUTE_GRAD=grad is not None, BLOCK_V=plan.block, **plan.launch_options()
    )
