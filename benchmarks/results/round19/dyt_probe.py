"""Round nineteen's dyt probe (from the repository root: ``PYTHONPATH=. python benchmarks/results/round19/dyt_probe.py``
on a CUDA machine; ``--cpu`` smoke-tests every variant's code path under the Triton interpreter at tiny shapes).

The harness row dyt x (16384, 8192) bf16, alpha (1,) = 0.5, gamma/beta (8192,) bf16, timed as the harness times
it (forward under no_grad; forward+backward = torch.autograd.grad of the output), do_bench medians, GB/s of the
harness's bytes (forward 2 N, forward+backward 5 N, 2 bytes an element) and the fraction of the copy bandwidth:

- ``new``: npu_ops/dyt.py as it is (CUDA_FORWARD_TILES, CUDA_BACKWARD_TILES, CUDA_FAST_MATH);
- ``old``: the round-18 kernels and plan (copied below): 1 x 1024 tiles, shared _triton.tanh, backward 2 programs
  per SM with a per-row cross-thread dalpha sum;
- ``liger``, ``compile``: Liger-Kernel 0.8.5's liger_dyt, torch.compile of the eager formula;
- ``fwd ...`` / ``bwd ...`` variants: other CudaTiles for one kernel (the other keeps the default), and the
  portable math (CUDA_FAST_MATH off). CudaTiles(rows, cols, warps, programs_per_sm or None, prefetch, maxnreg).
  The forward variants' f+b column includes the default backward and vice versa; compare like columns.
Every variant's output and gradients are checked against float64 eager (max |err| / max |ref|, per tensor). Then a
precision check of tanh itself: fp32 x over [-12, 12] (dense around 0.6, the branch point), alpha = gamma = 1:
forward's max relative error and dx's (dy = 1, against 1 / cosh^2), in fp32 unit roundoffs (2^-24).

The whole run stops starting new entries after --budget seconds (default 50; compiles dominate a cold cache):
entries run in the order new, old, liger, compile, forward variants, backward variants. ``--skip liger,compile``
(names or prefixes ``fwd``/``bwd``) leaves entries out; a second run has a warm Triton cache.
"""
import argparse
import os
import sys
import time
import traceback

ARGS = argparse.ArgumentParser()
ARGS.add_argument("--cpu", action="store_true", help="interpreter smoke test of every variant (no timing)")
ARGS.add_argument("--budget", type=float, default=50.0, help="seconds after which no new entry starts")
ARGS.add_argument("--skip", default="", help="comma-separated entry names or prefixes to leave out")
ARGS.add_argument("--no-precision", action="store_true")
OPTS = ARGS.parse_args()
if OPTS.cpu:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import npu_liger  # noqa: E402,F401
from npu_liger.npu_ops import dyt as D  # noqa: E402
from npu_liger.npu_ops._norm import as_rows, cuda_programs_per_sm, param_row, sum_partials  # noqa: E402
from npu_liger.npu_ops._triton import (COMPUTE_DTYPE_SIZE, cdiv, launched_kernel, new_like, tanh,  # noqa: E402
                                       tanh_derivative)
from npu_liger.tiling import TileRequest, plan_launch  # noqa: E402

T0 = time.perf_counter()
DEV = "cpu" if OPTS.cpu else "cuda"
SHAPE = (37, 300) if OPTS.cpu else (16384, 8192)
CT = D.CudaTiles


# ---- the round-18 kernels (old), verbatim but for names -------------------------------------------------------

@launched_kernel(do_not_specialize=["n_rows", "row_programs"])
def old_fwd_kernel(x_ptr, alpha_ptr, gamma_ptr, beta_ptr, y_ptr, n_rows, n_cols, x_stride, col_programs,
                   row_programs, HAS_BETA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    row_start = (pid // col_programs).to(tl.int64) * BLOCK_R
    row_step = (pid * 0 + row_programs).to(tl.int64) * BLOCK_R
    alpha = tl.load(alpha_ptr).to(tl.float32)
    for c in tl.range((pid % col_programs) * BLOCK_N, n_cols, col_programs * BLOCK_N):
        cols = c + col_ids
        col_mask = cols < n_cols
        gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BETA:
            beta = tl.load(beta_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        for start in tl.range(row_start, n_rows, row_step):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
            y = gamma * tanh(x * alpha)
            if HAS_BETA:
                y += beta
            tl.store(y_ptr + rows * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "row_programs"])
def old_bwd_kernel(dy_ptr, x_ptr, alpha_ptr, gamma_ptr, dx_ptr, dalpha_ptr, dgamma_ptr, dbeta_ptr, n_rows, n_cols,
                   dy_stride, x_stride, col_programs, row_programs, col_blocks, BLOCK_R: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    p_cols = tl.arange(0, BLOCK_N)
    row_prog = (pid // col_programs).to(tl.int64)
    row_start = row_prog * BLOCK_R
    row_step = (pid * 0 + row_programs).to(tl.int64) * BLOCK_R
    alpha = tl.load(alpha_ptr).to(tl.float32)
    for c in tl.range((pid % col_programs) * BLOCK_N, n_cols, col_programs * BLOCK_N):
        cols = c + col_ids
        col_mask = cols < n_cols
        gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dbeta_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dalpha_acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for start in tl.range(row_start, n_rows, row_step):
            rows = start + row_ids
            mask = (rows < n_rows) & col_mask
            x = tl.load(x_ptr + rows * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + rows * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
            y = x * alpha
            t = tanh(y)
            g = dy * gamma * tanh_derivative(y)
            tl.store(dx_ptr + rows * n_cols + cols, (g * alpha).to(dx_ptr.dtype.element_ty), mask=mask)
            dalpha_acc += tl.sum(g * x, axis=1)
            dgamma_acc += tl.sum(dy * t, axis=0)
            dbeta_acc += tl.sum(dy, axis=0)
        p_mask = c + p_cols < n_cols
        tl.store(dgamma_ptr + row_prog * n_cols + c + p_cols, dgamma_acc, mask=p_mask)
        tl.store(dbeta_ptr + row_prog * n_cols + c + p_cols, dbeta_acc, mask=p_mask)
        tl.store(dalpha_ptr + row_prog * col_blocks + c // BLOCK_N, tl.sum(dalpha_acc, axis=0))


def old_plan(device_type, n_rows, n_cols, memory_multiplier, persistent):
    cuda = {"cuda_programs_per_sm": cuda_programs_per_sm(n_cols)} if persistent else {}
    cols = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE, **cuda))
    block_cols = cols.block
    col_blocks = cdiv(n_cols, block_cols)
    block_rows, options = 1, cols.launch_options()
    if col_blocks == 1:
        wanted = n_rows if cols.max_programs is None else cdiv(n_rows, cols.max_programs)
        rows = plan_launch(device_type, TileRequest(memory_multiplier, ((wanted, block_cols),), (0,),
                                                    COMPUTE_DTYPE_SIZE, **cuda))
        block_rows, options = rows.block, rows.launch_options()
    programs = cols.grid(cdiv(n_rows, block_rows) * col_blocks)
    col_programs = min(col_blocks, programs)
    return block_rows, block_cols, col_programs, max(1, programs // col_programs), options


def old_forward(x, alpha, gamma, beta):
    y = new_like(x)
    n_cols = x.shape[-1]
    x2, alpha, gamma, beta = as_rows(x, n_cols), alpha.contiguous(), param_row(gamma), param_row(beta)
    n_rows = x2.shape[0]
    br, bc, cp, rp, options = old_plan(x.device.type, n_rows, n_cols, 10.0, False)
    old_fwd_kernel[(cp * rp,)](x2, alpha, gamma, beta if beta is not None else gamma, y, n_rows, n_cols,
                               x2.stride(0), cp, rp, HAS_BETA=beta is not None, BLOCK_R=br, BLOCK_N=bc, **options)
    return y


def old_backward(dy, x, alpha, gamma, beta):
    n_cols = x.shape[-1]
    dx = new_like(x)
    b_dtype = beta.dtype if beta is not None else gamma.dtype
    x2, dy2, gamma = as_rows(x, n_cols), as_rows(dy, n_cols), param_row(gamma)
    n_rows = x2.shape[0]
    br, bc, cp, rp, options = old_plan(x.device.type, n_rows, n_cols, 12.0, True)
    col_blocks = cdiv(n_cols, bc)
    partials = torch.empty((2, rp, n_cols), dtype=torch.float32, device=x.device)
    dalpha = torch.empty((rp, col_blocks), dtype=torch.float32, device=x.device)
    old_bwd_kernel[(cp * rp,)](dy2, x2, alpha.contiguous(), gamma, dx, dalpha, partials[0], partials[1], n_rows,
                               n_cols, dy2.stride(0), x2.stride(0), cp, rp, col_blocks, BLOCK_R=br, BLOCK_N=bc,
                               **options)
    return (dx, dalpha.sum().reshape(alpha.shape).to(alpha.dtype), *sum_partials(partials, (gamma.dtype, b_dtype)))


class OldDyT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, gamma, beta):
        ctx.save_for_backward(x, alpha, gamma, beta)
        return old_forward(x, alpha, gamma, beta)

    @staticmethod
    def backward(ctx, dy):
        dx, da, dg, db = old_backward(dy.contiguous(), *ctx.saved_tensors)
        return dx, da, dg, db if ctx.saved_tensors[3] is not None else None


# ---- variants of the new code ------------------------------------------------------------------------------------

DEFAULTS = (D.CUDA_FORWARD_TILES, D.CUDA_BACKWARD_TILES, D.CUDA_FAST_MATH)
FWD_VARIANTS = {
    "fwd 1x1024 w4": CT(1, 1024, 4, None, False),
    "fwd 2x1024 w4": CT(2, 1024, 4, None, False),
    "fwd 4x1024 w4": CT(4, 1024, 4, None, False),
    "fwd 8x1024 w4": CT(8, 1024, 4, None, False),
    "fwd 4x1024 w8": CT(4, 1024, 8, None, False),
    "fwd 2x2048 w8": CT(2, 2048, 8, None, False),
    "fwd 4x2048 w8": CT(4, 2048, 8, None, False),
    "fwd 1x4096 w8": CT(1, 4096, 8, None, False),
    "fwd 4x1024 w4 persistent 8/SM": CT(4, 1024, 4, 8, False),
    "fwd 4x1024 w4 persistent 8/SM prefetch": CT(4, 1024, 4, 8, True),
    "fwd 2x1024 w4 persistent 12/SM prefetch": CT(2, 1024, 4, 12, True),
}
BWD_VARIANTS = {
    "bwd 1x1024 w4 4/SM prefetch": CT(1, 1024, 4, 4, True),
    "bwd 1x1024 w4 4/SM": CT(1, 1024, 4, 4, False),
    "bwd 1x1024 w4 5/SM prefetch": CT(1, 1024, 4, 5, True),
    "bwd 1x1024 w4 8/SM prefetch": CT(1, 1024, 4, 8, True),
    "bwd 1x1024 w4 8/SM maxnreg64": CT(1, 1024, 4, 8, False, 64),
    "bwd 1x1024 w4 6/SM prefetch maxnreg80": CT(1, 1024, 4, 6, True, 80),
    "bwd 2x1024 w4 2/SM prefetch": CT(2, 1024, 4, 2, True),
    "bwd 2x1024 w4 4/SM": CT(2, 1024, 4, 4, False),
    "bwd 1x2048 w8 2/SM prefetch": CT(1, 2048, 8, 2, True),
    "bwd 1x2048 w8 3/SM prefetch maxnreg80": CT(1, 2048, 8, 3, True, 80),
    "bwd 1x512 w2 10/SM prefetch": CT(1, 512, 2, 10, True),
    "bwd 1x1024 w4 4/SM prefetch, fast math off": (CT(1, 1024, 4, 4, True), False),
}


def configure(fwd=None, bwd=None, fast=None):
    D.CUDA_FORWARD_TILES = fwd or DEFAULTS[0]
    D.CUDA_BACKWARD_TILES = bwd or DEFAULTS[1]
    D.CUDA_FAST_MATH = DEFAULTS[2] if fast is None else fast


_REAL_PLAN = D.plan_dyt


def cpu_plan(device_type, n_rows, n_cols, memory_multiplier, persistent, cuda_tiles=None):
    """--cpu: the CUDA plan (4 fake SMs) under the interpreter, so every variant's tiles and PREFETCH run."""
    plan = D.plan_dyt_cuda(n_rows, n_cols, cuda_tiles, 4)
    return plan._replace(options={})  # the interpreter takes no maxnreg


def ours(*args):
    return npu_liger.dyt(*args)


def old(*args):
    return OldDyT.apply(*args)


def eager(x, a, g, b):
    return g * torch.tanh(a * x) + b


def peers():
    out = {}
    try:
        from liger_kernel.transformers.functional import liger_dyt
        out["liger"] = liger_dyt
    except Exception:
        try:
            from liger_kernel.ops.dyt import LigerDyTFunction
            out["liger"] = LigerDyTFunction.apply
        except Exception as exc:
            print(f"liger: not importable ({exc})")
    out["compile"] = torch.compile(eager)
    return out


def make_inputs():
    gen = torch.Generator(device=DEV).manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(SHAPE, generator=gen, device=DEV).to(dt).requires_grad_(True)
    alpha = torch.full((1,), 0.5, dtype=dt, device=DEV).requires_grad_(True)
    gamma = (1.0 + 0.1 * torch.randn(SHAPE[-1], generator=gen, device=DEV)).to(dt).requires_grad_(True)
    beta = (0.1 * torch.randn(SHAPE[-1], generator=gen, device=DEV)).to(dt).requires_grad_(True)
    dy = torch.randn(SHAPE, generator=gen, device=DEV).to(dt)
    return (x, alpha, gamma, beta), dy


def reference(args, dy):
    leaves = [t.detach().double().requires_grad_(True) for t in args]
    out = eager(*leaves)
    grads = torch.autograd.grad(out, leaves, dy.double())
    return out.detach(), grads


def check(fn, args, dy, ref):
    out = fn(*args)
    grads = torch.autograd.grad(out, args, dy)
    errs = []
    for got, want in zip((out, *grads), (ref[0], *ref[1])):
        errs.append(((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
    return "err y {:.1e} dx {:.1e} da {:.1e} dg {:.1e} db {:.1e}".format(*errs)


def regs(fn, name):
    """Registers / spills of the newest compiled kernel(s) this entry varies (ours only; '?' if unknown)."""
    if fn is not ours:
        return ""
    out = []
    for label, kernel in (("fwd", D._dyt_fwd_kernel), ("bwd", D._dyt_bwd_kernel)):
        if name[:4] in ("fwd ", "bwd ") and not name.startswith(label):
            continue
        try:
            compiled = list(kernel._compiled.values())[-1][0]
            out.append(f"{label} {compiled.n_regs} regs {compiled.n_spills} spills")
        except Exception:
            out.append(f"{label} ?")
    return ", ".join(out)


def timed(fn, args, dy):
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            fn(*args)

    def fb():
        torch.autograd.grad(fn(*args), args, dy)

    return (do_bench(fwd, warmup=5, rep=25, return_mode="median"),
            do_bench(fb, warmup=5, rep=40, return_mode="median"))


def precision(label, fn):
    """tanh's own precision on this device: fp32, alpha = gamma = 1, no beta."""
    xs = torch.cat([torch.linspace(-12, 12, 1 << 20), torch.linspace(0.55, 0.65, 1 << 18),
                    torch.linspace(-0.65, -0.55, 1 << 18), torch.linspace(-0.3, 0.3, 1 << 18)]).to(DEV)
    if OPTS.cpu:
        xs = xs[:: 1 << 8]
    x = xs.reshape(-1, 1024 if not OPTS.cpu else 64).contiguous().requires_grad_(True)
    a = torch.ones(1, device=DEV)
    g = torch.ones(x.shape[-1], device=DEV)
    y = fn(x, a, g, None) if fn is not old else OldDyT.apply(x, a, g, None)
    dx, = torch.autograd.grad(y, (x,), torch.ones_like(y))
    x64 = x.detach().double()
    t = torch.tanh(x64)
    nz = t != 0
    rel_y = ((y.detach().double() - t).abs() / t.abs())[nz].max().item() / 2**-24
    d64 = 1.0 / torch.cosh(x64) ** 2
    rel_dx = ((dx.double() - d64).abs() / d64)
    bound = (rel_dx / 2**-24 / (2 * x64.abs() + 8)).max().item()
    print(f"  precision {label:18s} tanh max {rel_y:6.2f} u   dx max {rel_dx.max().item() / 2**-24:8.2f} u  "
          f"dx err / (2|y| + 8) u max {bound:.2f}")


def main():
    skip = [s for s in OPTS.skip.split(",") if s]
    skipped = lambda name: any(name == s or name.startswith(s) for s in skip)  # noqa: E731
    if OPTS.cpu:
        D.plan_dyt = cpu_plan
    args, dy = make_inputs()
    ref = reference(args, dy)
    n = args[0].numel()
    fwd_bytes, fb_bytes = 2 * n * 2, 5 * n * 2
    copy = None
    if not OPTS.cpu:
        from triton.testing import do_bench
        src = torch.ones(256 << 18, dtype=torch.float32, device=DEV)
        dst = torch.empty_like(src)
        copy = 2 * src.numel() * 4 / do_bench(lambda: dst.copy_(src), warmup=5, rep=25, return_mode="median") / 1e6
        print(f"{torch.cuda.get_device_name()}  torch {torch.__version__} triton {triton.__version__}  "
              f"copy {copy:.0f} GB/s  shape {SHAPE} bf16")
        print(f"defaults: forward {DEFAULTS[0]}\n          backward {DEFAULTS[1]}\n          fast math {DEFAULTS[2]}")
        print(f"plans: forward {D.plan_dyt('cuda', SHAPE[0], SHAPE[1], 10.0, False, DEFAULTS[0])}\n"
              f"       backward {D.plan_dyt('cuda', SHAPE[0], SHAPE[1], 12.0, True, DEFAULTS[1])}")

    entries = [("new", ours, {}), ("old", old, {})]
    entries += [(name, None, {}) for name in ("liger", "compile")]
    entries += [("new, portable math (fast math off)", ours, {"fast": False})]
    entries += [(k, ours, {"fwd": v}) for k, v in FWD_VARIANTS.items()]
    entries += [(k, ours, {"bwd": v[0], "fast": v[1]} if isinstance(v[0], tuple) else {"bwd": v})
                for k, v in BWD_VARIANTS.items()]
    peer_fns = None
    for name, fn, cfg in entries:
        if skipped(name):
            continue
        if time.perf_counter() - T0 > OPTS.budget:
            print(f"  {name:42s} skipped: past the {OPTS.budget:.0f} s budget (rerun with --skip ...)")
            continue
        try:
            if fn is None:
                if OPTS.cpu:
                    continue
                if peer_fns is None:
                    peer_fns = peers()
                if name not in peer_fns:
                    continue
                fn = peer_fns[name]
            configure(**cfg)
            start = time.perf_counter()
            status = check(fn, args, dy, ref)
            if OPTS.cpu:
                print(f"  {name:42s} ok  {status}")
                continue
            f_ms, fb_ms = timed(fn, args, dy)
            f_gb, fb_gb = fwd_bytes / f_ms / 1e6, fb_bytes / fb_ms / 1e6
            print(f"  {name:42s} fwd {f_ms * 1e3:7.1f} us {f_gb:6.0f} GB/s ({f_gb / copy:.2f})  "
                  f"f+b {fb_ms * 1e3:7.1f} us {fb_gb:6.0f} GB/s ({fb_gb / copy:.2f})  {status}  "
                  f"{regs(fn, name)} [{time.perf_counter() - start:.1f} s]", flush=True)
        except Exception as exc:
            print(f"  {name:42s} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc(limit=2, file=sys.stdout)
        finally:
            configure()
    if not OPTS.no_precision:
        for label, fn, cfg in (("new", ours, {}), ("new, fast math off", ours, {"fast": False}), ("old", old, {})):
            try:
                configure(**cfg)
                precision(label, fn)
            except Exception as exc:
                print(f"  precision {label}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                configure()
    print(f"done in {time.perf_counter() - T0:.1f} s")


if __name__ == "__main__":
    main()
