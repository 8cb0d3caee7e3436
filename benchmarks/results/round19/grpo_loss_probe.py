"""Round nineteen's grpo_loss probe (run from the repository root on a CUDA machine: PYTHONPATH=. python
benchmarks/results/round19/grpo_loss_probe.py [--no-compile] [--quick]; CPU smoke test: --cpu, which sets
TRITON_INTERPRET=1 and uses tiny shapes). Harness row grpo_loss B8 L1024 V128256 bf16 (benchmarks/specs.py
``_make_grpo``: logits (8, 1025, 128256), ~25% of the completion tokens masked, dapo, beta 0.04, old and ref
log-probabilities), called as the harness calls it (the public function; forward under no_grad, forward+backward
as torch.autograd.grad). Bytes as the harness counts them: forward N = B (L+1) V * 2, forward+backward 3 N.

Printed per line: do_bench median ms, GB/s of the harness bytes, that as a fraction of the device copy bandwidth
(measured here as the harness does), and the max error against an fp32 eager reference (loss abs error; for
forward+backward also the gradient's max abs error; the bf16 eager gradient's own error is printed for scale).

Variants (blk = BLOCK_V, w = num_warps, pps = persistent programs per SM, '-' = one program per token):
  new default      what npu_liger now launches (loss only 8192/4, with the gradient 4096/8, one program per token)
  old              the previous kernel (copied below: unspecialised row strides -> scalar 2-byte accesses; the
                   tile budget's 2048 columns on 4 warps) with its old plan
  fwd blk/w/pps    loss-only launches (forward timing only)
  fb  blk/w/pps    with-gradient launches (forward+backward timing only: the eager training path computes the
                   gradient in the forward kernel; the backward only checks the incoming gradient is 1)
  stages           the default tiles with num_stages 1 (Triton 3.9 emits no cp.async for these loads: expected
                   to change little)
--quick: only new default, old, liger and torch.compile. torch.compile is skipped when 45 s are already gone.
  liger            liger_kernel.transformers.grpo_loss.triton_grpo_loss as benchmarks/liger.py calls it (inplace:
                   it gets its own copy of the logits)
  eager, compile   benchmarks/reference.grpo_loss eagerly and under torch.compile
To adopt a variant: set CUDA_BLOCK/CUDA_WARPS/CUDA_PROGRAMS_PER_SM (loss only) or CUDA_GRAD_* (with the gradient)
and CUDA_NUM_STAGES in npu_liger/npu_ops/grpo_loss.py.
"""
import os
import sys

if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import contextlib  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

import npu_liger  # noqa: E402,F401
from benchmarks import reference, specs  # noqa: E402
from npu_liger.npu_ops import grpo_loss as G  # noqa: E402
from npu_liger.npu_ops._triton import flat_plan, grid_stride, launched_kernel, program_start  # noqa: E402
from npu_liger.tiling import LaunchPlan  # noqa: E402

CPU = "--cpu" in sys.argv
QUICK = "--quick" in sys.argv
COMPILE = not CPU and "--no-compile" not in sys.argv
DEVICE = "cpu" if CPU else "cuda"
T0 = time.time()


# --- the previous kernel, verbatim (same signature as the new one) -------------------------------------------------
@launched_kernel(do_not_specialize=["n_tokens", "seq_len", "logits_stride_b", "logits_stride_t", "ids_stride_b",
                                       "old_stride_b", "ref_stride_b", "grad_stride_b"])
def old_grpo_loss_fwd_kernel(logits_ptr, ids_ptr, adv_ptr, w_ptr, old_ptr, ref_ptr, token_loss_ptr, kl_ptr,
                             clipped_ptr, grad_ptr, n_tokens, seq_len, n_cols, logits_stride_b, logits_stride_t,
                             logits_stride_v, ids_stride_b, ids_stride_t, adv_stride, old_stride_b, old_stride_t,
                             ref_stride_b, ref_stride_t, grad_stride_b, grad_stride_t, inv_temperature, beta, eps_low,
                             eps_high, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_KL_PENALTY: tl.constexpr,
                             COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
                             ORDER_TARGET_STORE: tl.constexpr = False):
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    inv_temperature = tl.cast(inv_temperature, tl.float32)
    beta = tl.cast(beta, tl.float32)
    eps_low = tl.cast(eps_low, tl.float32)
    eps_high = tl.cast(eps_high, tl.float32)
    for token in tl.range(program_start(1), n_tokens, grid_stride(1)):
        b = token // seq_len
        t = token - b * seq_len
        row_ptr = logits_ptr + b * logits_stride_b + t * logits_stride_t
        w = tl.load(w_ptr + token)
        valid = w != 0.0
        read_cols = tl.where(valid, n_cols, 0)  # a masked token reads nothing
        # Pass 1: online log-sum-exp of z = logits / T (m starts finite: exp(m - m_new) never sees inf - inf)
        m = -1e30
        d = 0.0
        for start in tl.range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            z = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_v, mask=cols < read_cols,
                        other=float("-inf")).to(tl.float32) * inv_temperature
            m_new = tl.maximum(m, tl.max(z, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        token_id = tl.load(ids_ptr + b * ids_stride_b + t * ids_stride_t).to(tl.int64)
        in_range = (token_id >= 0) & (token_id < n_cols)
        safe_id = tl.where(in_range, token_id, 0)  # a bad id never reads outside the row
        z_id = tl.load(row_ptr + safe_id * logits_stride_v).to(tl.float32) * inv_temperature
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
            # Pass 2: d / d logits = c * (onehot - softmax), c = w * dlogp / T; exact zeros for a masked token
            c = dlogp * w * inv_temperature
            lse = m + log_d
            grad_row = grad_ptr + b * grad_stride_b + t * grad_stride_t
            for start in tl.range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                load_mask = cols < read_cols
                z = tl.load(row_ptr + cols.to(tl.int64) * logits_stride_v, mask=load_mask,
                               other=0.0).to(tl.float32) * inv_temperature
                dz = tl.where(load_mask, -tl.exp(z - lse) * c, 0.0)
                tl.store(grad_row + cols.to(tl.int64), dz.to(grad_ptr.dtype.element_ty), mask=cols < n_cols)
            if ORDER_TARGET_STORE:  # CUDA: the block store above wrote this column from another thread
                tl.debug_barrier()
            dz_id = (1.0 - tl.exp(z_id - lse)) * c
            tl.store(grad_row + safe_id, dz_id.to(grad_ptr.dtype.element_ty), mask=valid & in_range)


def old_plan(device_type, n_cols, compute_grad):
    return flat_plan(device_type, n_cols, G.GRAD_MEMORY_MULTIPLIER if compute_grad else G.MEMORY_MULTIPLIER)


def fixed_plan(block, warps, per_sm):
    """A plan function giving BLOCK_V ``block`` on ``warps`` warps (CUDA) and a persistent grid of ``per_sm``
    programs per SM (None: one per token); on the CPU the block is capped at 64 so tiles still loop."""

    def plan(device_type, n_cols, compute_grad):
        if device_type == "cuda":
            from npu_liger.tiling.launch import cuda_sm_count

            return LaunchPlan("cuda", ((block,),), per_sm * cuda_sm_count() if per_sm else None, warps)
        return LaunchPlan("cpu", ((min(block, 64),),), 4 * per_sm if per_sm else None, None)

    return plan


@contextlib.contextmanager
def configured(plan_fn=None, kernel=None, stages=None):
    saved = G._plan, G._grpo_loss_fwd_kernel, G.CUDA_NUM_STAGES
    try:
        if plan_fn is not None:
            G._plan = plan_fn
        if kernel is not None:
            G._grpo_loss_fwd_kernel = kernel
        G.CUDA_NUM_STAGES = stages
        yield
    finally:
        G._plan, G._grpo_loss_fwd_kernel, G.CUDA_NUM_STAGES = saved


def bench(fn):
    if CPU:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def main():
    spec = specs.SPECS["grpo_loss"]
    p = dict(B=2, L=5, V=300) if CPU else dict(spec.main[0])
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    inp = spec.make(p, spec.dtype, DEVICE, gen)
    logits, ids, adv, mask, old, ref = inp.args
    n_fwd, n_fb = spec.bytes_fwd(p, 2), spec.bytes_fb(p, 2)
    if CPU:
        copy = float("nan")
    else:
        src = torch.ones(n_fwd // 4, dtype=torch.float32, device=DEVICE)
        dst = torch.empty_like(src)
        copy = 2 * src.numel() * 4 / bench(lambda: dst.copy_(src)) / 1e6
        del src, dst
    name = torch.cuda.get_device_name() if not CPU else "cpu (interpreter)"
    print(f"{name}  copy {copy:.0f} GB/s  shape {p}  bytes fwd {n_fwd / 1e9:.3f} GB, fb {n_fb / 1e9:.3f} GB  "
          f"valid tokens {mask.float().mean().item():.3f}", flush=True)

    # fp32 reference (and the bf16 eager gradient's own error, for scale)
    leaf32 = logits.detach().float().requires_grad_(True)
    ref_loss = reference.grpo_loss(leaf32, ids, adv, mask, old, ref)
    (ref_grad,) = torch.autograd.grad(ref_loss, (leaf32,))
    ref_loss = ref_loss.detach()
    del leaf32
    eager_out = reference.grpo_loss(logits, ids, adv, mask, old, ref)
    (eager_grad,) = torch.autograd.grad(eager_out, (logits,))
    print(f"reference loss {ref_loss.item():.6f}; eager bf16: loss err {abs(eager_out.item() - ref_loss.item()):.2e}"
          f" grad err {(eager_grad.float() - ref_grad).abs().max().item():.2e} (max |grad| "
          f"{ref_grad.abs().max().item():.2e})", flush=True)
    del eager_out, eager_grad

    def errors(fn, leaf, with_grad):
        if with_grad:
            (out,) = fn(leaf, ids, adv, mask, old, ref)
            (grad,) = torch.autograd.grad(out, (leaf,))
            g = (grad.float() - ref_grad).abs().max().item()
            return f"loss err {abs(out.item() - ref_loss.item()):.2e} grad err {g:.2e}"
        with torch.no_grad():
            (out,) = fn(leaf, ids, adv, mask, old, ref)
        return f"loss err {abs(out.item() - ref_loss.item()):.2e}"

    def row(label, fn, fwd=True, fb=True, fresh_leaf=None):
        """Time and check ``fn`` (the harness's convention: fn(*args) -> (loss,)). ``fresh_leaf`` gives a new
        logits leaf per check (Liger writes its gradient into the logits)."""
        try:
            leaf = fresh_leaf() if fresh_leaf else logits
            parts = []
            if fwd:
                err = errors(fn, leaf, False)

                def run_fwd():
                    with torch.no_grad():
                        fn(leaf, ids, adv, mask, old, ref)

                ms = bench(run_fwd)
                gb = n_fwd / ms / 1e6
                parts.append(f"fwd {ms:8.3f} ms {gb:6.0f} GB/s {gb / copy:5.2f}x copy ({err})")
            if fb:
                err = errors(fn, fresh_leaf() if fresh_leaf else leaf, True)
                leaf = fresh_leaf() if fresh_leaf else leaf

                def run_fb():
                    (out,) = fn(leaf, ids, adv, mask, old, ref)
                    torch.autograd.grad(out, (leaf,))

                ms = bench(run_fb)
                gb = n_fb / ms / 1e6
                parts.append(f"fb {ms:8.3f} ms {gb:6.0f} GB/s {gb / copy:5.2f}x copy ({err})")
            print(f"[{time.time() - T0:5.1f}s] {label:24s} " + " | ".join(parts), flush=True)
        except Exception as exc:  # one failure must not lose the rest
            print(f"[{time.time() - T0:5.1f}s] {label:24s} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc(limit=3)

    ours = spec.npu_variant()
    row("new default", ours)
    with configured(old_plan, old_grpo_loss_fwd_kernel):
        row("old", ours)
    try:
        from benchmarks import liger

        lig = liger.variant("grpo_loss")
        row("liger", lig, fresh_leaf=lambda: logits.detach().clone().requires_grad_(True))
    except Exception as exc:
        print(f"liger unavailable: {type(exc).__name__}: {exc}", flush=True)
    if QUICK:
        if COMPILE:
            row("compile", spec.compiled_variant())
        return
    fwd_configs = [(4096, 4, None), (8192, 8, None), (16384, 8, None), (2048, 1, None), (2048, 4, None),
                   (8192, 4, 4)]
    fb_configs = [(2048, 4, None), (4096, 4, None), (4096, 16, None), (8192, 8, None), (8192, 16, 1),
                  (8192, 16, 2)]
    for blk, w, pps in fwd_configs:
        with configured(fixed_plan(blk, w, pps)):
            row(f"fwd {blk}/{w}/{pps or '-'}", ours, fb=False)
    for blk, w, pps in fb_configs:
        with configured(fixed_plan(blk, w, pps)):
            row(f"fb  {blk}/{w}/{pps or '-'}", ours, fwd=False)
    with configured(stages=1):
        row("new default stages 1", ours)
    row("eager", spec.eager_variant())
    if COMPILE and time.time() - T0 > 45:
        print("torch.compile skipped: 45 s gone already (the 60 s budget); rerun with --quick to get it", flush=True)
    elif COMPILE:
        start = time.time()
        compiled = spec.compiled_variant()
        row("compile", compiled)
        print(f"(torch.compile row took {time.time() - start:.1f}s with compilation)", flush=True)


if __name__ == "__main__":
    main()
