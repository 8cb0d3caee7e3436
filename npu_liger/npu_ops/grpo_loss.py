"""GRPO policy loss from logits and completion ids (TRL's GRPOTrainer ``_compute_loss``), loss and gradient w.r.t.
the logits in one pass over each token's vocabulary row.

Per completion token (b, t), with z = logits[b, t] / temperature (logits (B, L + 1, V), whose last position is
dropped as TRL's ``logits[:, :-1]`` does, or (B, L, V)) and A = advantages[b]:

    logp    = z[id] - logsumexp(z)                         (selective log-softmax of the completion token id)
    coef_1  = exp(logp - old_logp)                         (1 without old_logp: old_logp = logp.detach())
    coef_2  = clamp(coef_1, 1 - eps_low, 1 + eps_high)
    loss_t  = -min(coef_1 * A, coef_2 * A) + beta * kl     kl = exp(ref - logp) - (ref - logp) - 1  (k3 estimator)
    clipped = (coef_1 < 1 - eps_low and A < 0) or (coef_1 > 1 + eps_high and A > 0)

and the loss is ``sum(w * loss_t)`` with per-token weights w from the completion mask m (tokens with m == 0 have
w = 0: they are not read at all, their gradient is 0, and they count for nothing):

    grpo     w = m / (max(sum_t m, 1) * B)         per-sequence token mean, then the batch mean
    bnpo     w = m / max(sum m, 1)                 token mean over the batch
    dr_grpo  w = m / (B * max_completion_length)   (max_completion_length defaults to L)
    dapo     w = m / max(num_items_in_batch, 1)    token mean over the global batch: TRL's num_items_in_batch /
                                                   num_processes; the batch's own sum m without it

The weights and every count stay on the device (no host synchronisation). Gradient w.r.t. logp (TRL's autograd):
``-coef_1 * A`` where the unclipped term is the minimum (ties included), else 0, plus ``beta * (1 - exp(ref -
logp))``; then ``d loss / d logits[b, t] = w * dlogp / T * (onehot(id) - softmax(z))``, for an incoming gradient of 1
(the autograd formula scales it). old_logp, ref_logp and advantages are constants (TRL detaches them).

Outputs: the fp32 loss, per-token kl (B, L) (0 where masked, or everywhere without ref_logp), per-token
is_clipped (B, L) as 0./1. (0 where masked) and clip_ratio = sum(is_clipped) / max(sum m, 1): what TRL logs.

One program walks whole token rows (persistent grid-stride loop over the B * L tokens): pass 1 an online
log-sum-exp over V in UB-sized blocks (no iteration at all for a masked token), the token's logit one scalar load;
pass 2 (with the gradient) writes ``-softmax * c`` per block (zeros for a masked token, no load), from the row's end
back to its start (``REVERSE_GRAD_PASS``: the blocks pass 1 read last are still in the L2), and then the token's own
column, ``(1 - p) * c``, as a scalar store (as cross_entropy does). On CUDA both passes load the next block before
working on this one (``CUDA_PREFETCH``). The logits' and gradient's row
strides are specialised by Triton (16-element divisibility), so a contiguous bf16 row is read and written in
16-byte vectors on CUDA. A completion id outside [0, V) gives a NaN loss (its column is clamped before the load,
never read out of the row) and a ValueError on CPU or a device-side assert on CUDA.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch
from ._triton import (COMPUTE_DTYPE_SIZE, check_float_tensor, chunk_walk, grid_stride, launched_kernel, new_like,
                      program_start, require_launchable)

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
ID_DTYPES = (torch.int32, torch.int64)

# Memory analysis (fp32 arithmetic: tiles sized in fp32 elements). One token row at a time, V tiled by BLOCK_V.
# Pass 1, per element: the logit (upcast), z, exp(z - m): ~3 live. Pass 2: the logit, z, softmax, its scaled
#   negation: ~4 live. Loss only: memory_multiplier 6.0 (Ascend910B3: 192 KiB * 0.8 / (6.0 * 4 B) = 6553 ->
#   BLOCK_V 4096); with the gradient both passes share BLOCK_V at 8.0 (4915 -> 4096), room for the mask and
#   select temporaries; proven by the Ascend compile check.
# shapes: ((V,),), tiling_dims: (0,) -> the vocab dimension is tiled, no fixed dims.
MEMORY_MULTIPLIER = 6.0
GRAD_MEMORY_MULTIPLIER = 8.0
# CUDA launch (ignored by the NPU and CPU plans), one program per token: (columns per block, warps) of the loss
# alone and of the loss with its gradient. Round 19's probe (H100, B8 L1024 V128256 bf16,
# benchmarks/results/round19/grpo_loss_probe.py): loss alone 0.602-0.610 ms at 2048-8192 columns on 4-8 warps
# (Liger-Kernel 0.706, our old 1024-column tile with unspecialised strides 0.749). Round 20's probe (H200,
# benchmarks/results/round20/grpo_probe.py, forward+backward whole call): 8192 on 8 warps 1.805 ms; with the
# prefetch 1.671, the reversed gradient pass 1.607, both 1.614, both on 4096 x 8 warps 1.577 (4096 x 4 1.630,
# 16384 x 16 1.794); streaming gradient stores changed nothing (1.807 alone) and the gradient as a kernel of its
# own, as Liger-Kernel splits it, was slower (1.666-1.691 on 2048-8192 columns, 8-16 warps): both removed.
# Liger-Kernel 1.475. Round 21's probe (H100, round21/call2/grpo_probe2.txt): num_stages 1, 2 or 4 changed nothing
# (2.058 ms each; the knob is gone), Liger-Kernel's backward launch (16 warps, 1 stage) on this kernel 2.041,
# inside the harness rounds' 2% spread (Liger-Kernel 2.014).
CUDA_BLOCK, CUDA_WARPS = 8192, 4
CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS = 4096, 8
# CUDA: each pass loads the next block before reducing / storing this one (Triton does not pipeline these loops).
CUDA_PREFETCH = True
# Every backend: the gradient pass walks the row from its end back to its start (the blocks pass 1 read last are
# the likeliest still in the L2: 1.805 -> 1.607 ms above).
REVERSE_GRAD_PASS = True


# The logits' and gradient's strides are specialised (% 16 tells Triton a row's start is 16-element aligned: vector
# loads and stores; unspecialised, each element is its own access); a new sequence length never recompiles while
# V % 16 == 0 (else at most two variants).
@launched_kernel(do_not_specialize=["n_tokens", "seq_len", "ids_stride_b", "old_stride_b", "ref_stride_b"])
def _grpo_loss_fwd_kernel(logits_ptr, ids_ptr, adv_ptr, w_ptr, old_ptr, ref_ptr, token_loss_ptr, kl_ptr,
                          clipped_ptr, grad_ptr, n_tokens, seq_len, n_cols, logits_stride_b, logits_stride_t,
                          logits_stride_v, ids_stride_b, ids_stride_t, adv_stride, old_stride_b, old_stride_t,
                          ref_stride_b, ref_stride_t, grad_stride_b, grad_stride_t, inv_temperature, beta, eps_low,
                          eps_high, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_KL_PENALTY: tl.constexpr,
                          COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr, ORDER_TARGET_STORE: tl.constexpr = False,
                          PREFETCH: tl.constexpr = False, REVERSE: tl.constexpr = False):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    inv_temperature = tl.cast(inv_temperature, tl.float32)
    beta = tl.cast(beta, tl.float32)
    eps_low = tl.cast(eps_low, tl.float32)
    eps_high = tl.cast(eps_high, tl.float32)
    col_ids = tl.arange(0, BLOCK_V)
    for token in tl.range(program_start(1), n_tokens, grid_stride(1)):
        b = token // seq_len
        t = token - b * seq_len
        row_ptr = logits_ptr + b * logits_stride_b + t * logits_stride_t
        w = tl.load(w_ptr + token)
        valid = w != 0.0
        read_cols = tl.where(valid, n_cols, 0)  # a masked token reads nothing
        # Pass 1: online log-sum-exp of z = logits / T (m starts finite: exp(m - m_new) never sees inf - inf);
        # no iteration for a masked token (m = -1e30, d = 0, as if every load were masked off)
        m = -1e30
        d = 0.0
        if PREFETCH:  # CUDA only: the next block, as stored, is in flight while this one is reduced
            z_next = tl.load(row_ptr + col_ids.to(tl.int64) * logits_stride_v, mask=col_ids < read_cols,
                             other=float("-inf"))
        for start in tl.range(0, read_cols, BLOCK_V):
            if PREFETCH:
                z = z_next.to(tl.float32) * inv_temperature
                ahead = start + BLOCK_V + col_ids
                z_next = tl.load(row_ptr + ahead.to(tl.int64) * logits_stride_v, mask=ahead < read_cols,
                                 other=float("-inf"))
            else:
                cols = start + col_ids
                z = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_v, mask=cols < read_cols,
                            other=float("-inf")).to(tl.float32) * inv_temperature
            m_new = tl.maximum(m, tl.max(z, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        token_id = tl.load(ids_ptr + b * ids_stride_b + t * ids_stride_t).to(tl.int64)
        in_range = (token_id >= 0) & (token_id < n_cols)
        safe_id = tl.where(in_range, token_id, 0)  # a bad id never reads outside the row
        z_id = tl.load(row_ptr + safe_id * logits_stride_v, mask=valid, other=0.0).to(tl.float32) * inv_temperature
        # no clamp on d: a NaN or +inf logit makes it NaN and must reach the loss; a masked token has d = 0
        log_d = tl.log(tl.where(valid, d, 1.0))
        logp = tl.where(in_range, (z_id - m) - log_d, float("nan"))
        if HAS_OLD:
            old = tl.load(old_ptr + b * old_stride_b + t * old_stride_t).to(tl.float32)
            coef_1 = tl.exp(logp - old)
        else:  # old_logp = logp.detach(): the ratio is 1 (NaN where logp is)
            coef_1 = tl.exp(logp - logp)
        advantage = tl.load(adv_ptr + b * adv_stride).to(tl.float32)
        low = 1.0 - eps_low
        high = 1.0 + eps_high
        coef_2 = tl.where(coef_1 < low, low, tl.where(coef_1 > high, high, coef_1))  # NaN stays NaN
        unclipped_loss = coef_1 * advantage
        clipped_loss = coef_2 * advantage
        takes_clipped = clipped_loss < unclipped_loss  # False for ties and NaN: the unclipped term's gradient
        loss = -tl.where(takes_clipped, clipped_loss, unclipped_loss)
        dlogp = tl.where(takes_clipped, 0.0, -unclipped_loss)
        clipped = ((coef_1 < low) & (advantage < 0.0)) | ((coef_1 > high) & (advantage > 0.0))
        kl = 0.0
        if HAS_REF:
            ref = tl.load(ref_ptr + b * ref_stride_b + t * ref_stride_t).to(tl.float32)
            delta = ref - logp
            ratio = tl.exp(delta)
            kl = ratio - delta - 1.0
            if HAS_KL_PENALTY:
                loss += kl * beta
                dlogp += (1.0 - ratio) * beta
        tl.store(token_loss_ptr + token, tl.where(valid, loss * w, 0.0))
        tl.store(kl_ptr + token, tl.where(valid, kl, 0.0))
        tl.store(clipped_ptr + token, tl.where(valid & clipped, 1.0, 0.0))
        if COMPUTE_GRAD:
            # Pass 2: d / d logits = c * (onehot - softmax), c = w * dlogp / T; exact zeros for a masked token,
            # walked from the row's end when REVERSE
            c = dlogp * w * inv_temperature
            lse = m + log_d
            grad_row = grad_ptr + b * grad_stride_b + t * grad_stride_t
            n_blocks, first, step = chunk_walk(n_cols, BLOCK_V, REVERSE)
            if PREFETCH:  # CUDA only: the next block, as stored, is in flight while this one is written
                z_next = tl.load(row_ptr + (first + col_ids).to(tl.int64) * logits_stride_v,
                                 mask=first + col_ids < read_cols, other=0.0)
            for i in tl.range(0, n_blocks):
                cols = first + i * step + col_ids
                load_mask = cols < read_cols
                if PREFETCH:
                    z = z_next.to(tl.float32) * inv_temperature
                    ahead = cols + step
                    z_next = tl.load(row_ptr + ahead.to(tl.int64) * logits_stride_v,
                                     mask=(ahead >= 0) & (ahead < read_cols), other=0.0)
                else:
                    z = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_v, mask=load_mask,
                                other=0.0).to(tl.float32) * inv_temperature
                dz = tl.where(load_mask, -tl.exp(z - lse) * c, 0.0)
                tl.store(grad_row + cols.to(tl.int64), dz.to(grad_ptr.dtype.element_ty), mask=cols < n_cols)
            if ORDER_TARGET_STORE:  # CUDA: the block store above wrote this column from another thread
                tl.debug_barrier()
            dz_id = (1.0 - tl.exp(z_id - lse)) * c
            tl.store(grad_row + safe_id, dz_id.to(grad_ptr.dtype.element_ty), mask=valid & in_range)


def _check_per_token(name: str, tensor: Optional[torch.Tensor], shape, ref: torch.Tensor) -> None:
    if tensor is None:
        return
    check_float_tensor(name, tensor)
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape (B, L) = {tuple(shape)}, got {tuple(tensor.shape)}")
    if tensor.device != ref.device:
        raise RuntimeError(f"{name} must be on the device of logits ({ref.device}), got {tensor.device}")


def check_grpo_options(temperature: float, beta: float, eps_low: float, eps_high: float, loss_type: str,
                       max_completion_length: Optional[int]) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(map(repr, LOSS_TYPES))}, got {loss_type!r}")
    if not 0.0 < temperature < float("inf"):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if not (eps_low >= 0.0 and eps_high >= 0.0):
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low} and {eps_high}")
    if not beta == beta:
        raise ValueError("beta must not be NaN")
    if max_completion_length is not None and not max_completion_length >= 1:
        raise ValueError(f"max_completion_length must be None or >= 1, got {max_completion_length}")


def check_grpo_inputs(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature, beta,
                      eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch) -> None:
    check_float_tensor("logits", logits)
    if logits.dim() != 3:
        raise ValueError(f"logits must be 3-D (B, L + 1, V) or (B, L, V), got shape {tuple(logits.shape)}")
    if not isinstance(completion_ids, torch.Tensor) or completion_ids.dtype not in ID_DTYPES:
        raise TypeError("completion_ids must be an int32 or int64 tensor, got "
                        f"{getattr(completion_ids, 'dtype', type(completion_ids).__name__)}")
    if completion_ids.dim() != 2 or completion_ids.shape[0] != logits.shape[0] or \
            logits.shape[1] - completion_ids.shape[1] not in (0, 1):
        raise ValueError(f"completion_ids must have shape (B, L) with logits of shape (B, L + 1, V) or (B, L, V), "
                         f"got {tuple(completion_ids.shape)} for logits {tuple(logits.shape)}")
    if completion_ids.device != logits.device:
        raise RuntimeError(f"completion_ids must be on the device of logits ({logits.device}), "
                           f"got {completion_ids.device}")
    shape = tuple(completion_ids.shape)
    check_float_tensor("advantages", advantages)
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(f"advantages must have shape (B,) = ({shape[0]},), got {tuple(advantages.shape)}")
    if advantages.device != logits.device:
        raise RuntimeError(f"advantages must be on the device of logits ({logits.device}), got {advantages.device}")
    if completion_mask is not None:
        if not isinstance(completion_mask, torch.Tensor) or completion_mask.is_complex():
            raise TypeError("completion_mask must be a real tensor (bool, integer or float) or None")
        if tuple(completion_mask.shape) != shape:
            raise ValueError(f"completion_mask must have shape (B, L) = {shape}, got {tuple(completion_mask.shape)}")
        if completion_mask.device != logits.device:
            raise RuntimeError(f"completion_mask must be on the device of logits ({logits.device}), "
                               f"got {completion_mask.device}")
    _check_per_token("old_logp", old_logp, shape, logits)
    _check_per_token("ref_logp", ref_logp, shape, logits)
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"ref_logp is required when beta != 0 (got beta={beta}): the KL penalty needs the reference "
                         "model's log-probabilities")
    if num_items_in_batch is not None:
        if not isinstance(num_items_in_batch, torch.Tensor) or num_items_in_batch.dim() != 0 or \
                num_items_in_batch.is_complex():
            raise TypeError("num_items_in_batch must be a 0-d tensor or None")
        if num_items_in_batch.device != logits.device:
            raise RuntimeError(f"num_items_in_batch must be on the device of logits ({logits.device}), "
                               f"got {num_items_in_batch.device}")
    check_grpo_options(temperature, beta, eps_low, eps_high, loss_type, max_completion_length)


def token_weights(valid: torch.Tensor, loss_type: str, max_completion_length: Optional[int],
                  num_items_in_batch: Optional[torch.Tensor]) -> torch.Tensor:
    """w (B, L) fp32 contiguous: each token's share of the loss (module docstring), computed on the device."""
    n_seq, seq_len = valid.shape
    if loss_type == "grpo":
        return valid / (valid.sum(-1, keepdim=True).clamp_min(1.0) * n_seq)
    if loss_type == "bnpo":
        return valid / valid.sum().clamp_min(1.0)
    if loss_type == "dr_grpo":
        return valid / float(n_seq * (max_completion_length or seq_len))
    normalizer = valid.sum() if num_items_in_batch is None else num_items_in_batch.to(torch.float32)
    return valid / normalizer.clamp_min(1.0)


@memoised_plan
def _plan(device_type: str, n_cols: int, compute_grad: bool):
    """BLOCK_V plan of the kernel: the UB manager's tile from the memory multipliers on the NPU and CPU, the CUDA
    constants above on CUDA."""
    multiplier, cuda_block, cuda_warps = ((GRAD_MEMORY_MULTIPLIER, CUDA_GRAD_BLOCK, CUDA_GRAD_WARPS) if compute_grad
                                          else (MEMORY_MULTIPLIER, CUDA_BLOCK, CUDA_WARPS))
    return plan_launch(device_type, TileRequest(multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE,
                                                cuda_num_warps=cuda_warps, cuda_max_block=cuda_block))


def _switches(device_type: str) -> dict:
    """The kernel's walk switches on this backend (the knobs above, read on every call so that a probe may change
    them)."""
    return dict(PREFETCH=device_type == "cuda" and CUDA_PREFETCH, REVERSE=REVERSE_GRAD_PASS)


def _report_bad_ids(completion_ids: torch.Tensor, valid: torch.Tensor, n_cols: int) -> None:
    """Ids of unmasked tokens outside [0, V): a ValueError on CPU (no cost there), a device-side assert on CUDA
    (no host synchronisation); elsewhere the kernel's NaN loss."""
    if completion_ids.device.type not in ("cpu", "cuda"):
        return
    bad = ((completion_ids < 0) | (completion_ids >= n_cols)) & valid.bool()
    if completion_ids.device.type == "cpu":
        if bad.any():
            raise ValueError(f"completion id {completion_ids[bad][0].item()} is out of range for {n_cols} classes")
    else:
        torch._assert_async(~bad.any(), f"grpo_loss: a completion id is outside [0, {n_cols})")


def grpo_loss_forward(logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor,
                      completion_mask: Optional[torch.Tensor] = None, old_logp: Optional[torch.Tensor] = None,
                      ref_logp: Optional[torch.Tensor] = None, temperature: float = 1.0, beta: float = 0.0,
                      eps_low: float = 0.2, eps_high: float = 0.2, loss_type: str = "dapo",
                      max_completion_length: Optional[int] = None, num_items_in_batch: Optional[torch.Tensor] = None,
                      compute_grad: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, per_token_kl, is_clipped, clip_ratio, grad_logits): grad_logits (logits' shape and dtype, for an
    incoming gradient of 1; zeros at a dropped last position) with ``compute_grad``, else an empty (0,) tensor."""
    check_grpo_inputs(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, temperature, beta,
                      eps_low, eps_high, loss_type, max_completion_length, num_items_in_batch)
    n_seq, seq_len = completion_ids.shape
    n_cols = logits.shape[2]
    device = logits.device
    if completion_mask is None:
        valid = torch.ones((n_seq, seq_len), dtype=torch.float32, device=device)
    else:
        valid = (completion_mask != 0).to(torch.float32)
    w = token_weights(valid, loss_type, max_completion_length, num_items_in_batch).contiguous()
    token_loss = torch.empty((n_seq, seq_len), dtype=torch.float32, device=device)
    kl = torch.empty((n_seq, seq_len), dtype=torch.float32, device=device)
    clipped = torch.empty((n_seq, seq_len), dtype=torch.float32, device=device)
    grad = new_like(logits) if compute_grad else None
    n_tokens = n_seq * seq_len
    if n_tokens > 0 and n_cols == 0:  # no class to be right about: every unmasked token is out of range
        token_loss = torch.where(valid != 0, float("nan"), 0.0)
        kl.zero_()
        clipped.zero_()
    elif n_tokens > 0:
        _report_bad_ids(completion_ids, valid, n_cols)
        require_launchable(device)
        plan = _plan(device.type, n_cols, compute_grad)  # tiles: see MEMORY_MULTIPLIER and the CUDA launch above
        dummy = token_loss  # never read: HAS_OLD / HAS_REF off
        old, ref = (old_logp if old_logp is not None else dummy), (ref_logp if ref_logp is not None else dummy)
        _grpo_loss_fwd_kernel[(plan.grid(n_tokens),)](
            logits, completion_ids, advantages, w, old, ref, token_loss, kl, clipped,
            grad if grad is not None else token_loss, n_tokens, seq_len, n_cols, *logits.stride(),
            *completion_ids.stride(), advantages.stride(0), *old.stride(), *ref.stride(),
            grad.stride(0) if grad is not None else 0, grad.stride(1) if grad is not None else 0,
            1.0 / temperature, float(beta), float(eps_low), float(eps_high), HAS_OLD=old_logp is not None,
            HAS_REF=ref_logp is not None, HAS_KL_PENALTY=ref_logp is not None and beta != 0.0,
            COMPUTE_GRAD=grad is not None, BLOCK_V=plan.block, ORDER_TARGET_STORE=logits.is_cuda,
            **_switches(device.type), **plan.launch_options()
        )
    if grad is not None and logits.shape[1] > seq_len:
        grad[:, seq_len:].zero_()  # the last position predicts past the completion: no gradient
    if grad is not None and n_tokens == 0:
        grad.zero_()
    clip_ratio = clipped.sum() / valid.sum().clamp_min(1.0)
    return token_loss.sum(), kl, clipped, clip_ratio, grad if grad is not None else logits.new_empty((0,))
