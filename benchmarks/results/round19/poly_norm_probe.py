"""Round nineteen's poly_norm probe (from the repository root on a CUDA machine: PYTHONPATH=. python
benchmarks/results/round19/poly_norm_probe.py; smoke test on CPU: TRITON_INTERPRET=1 PYTHONPATH=. python
benchmarks/results/round19/poly_norm_probe.py --cpu). Harness shape x (16384, 8192) bf16, weight (3,), 0-d bias,
eps 1e-6. Bytes as benchmarks/specs.py counts them: forward 2 N, forward+backward 5 N (backward alone 3 N).

Prints (do_bench medians, GB/s, fraction of copy, max error against eager fp32 PyTorch):
- op level: npu_liger.poly_norm forward and forward+backward (new code, its default plan), Liger-Kernel
  (LigerPolyNormFunction, in_place=True as the harness calls it), torch.compile of the eager reference;
- forward kernel variants, called directly: the OLD kernel (copied below) at its old plan (1 row, 16 warps), and
  the new kernel over (rows per program, warps, FUSED_SUMS, HORNER); "persist" rows use a grid of k programs/SM;
- backward kernel variants (alone): the OLD kernel at its old plan (16 warps, 2 programs/SM), and the new kernel
  over (warps, programs per SM, FUSED_SUMS, PREFETCH).
Each variant is checked (y; dx, dw, db) and wrapped in try/except.
"""
import argparse
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import npu_liger  # noqa: E402
from npu_liger.npu_ops import poly_norm as P  # noqa: E402
from npu_liger.npu_ops._triton import grid_stride, program_start  # noqa: E402

EPS = 1e-6
T0 = time.time()


# ---- the OLD kernels (before round 19), verbatim but for the decorator ------------------------------------------

@triton.jit
def _old_rstd(sum_sq, n_cols, eps):
    return 1.0 / tl.sqrt(sum_sq / n_cols + eps)


@triton.jit
def _old_poly_dx(x, x2, x3, dy, c3, k3, c2, k2, c1, k1):
    return c3 * x2 * (dy - k3 * x3) + c2 * x * (dy - k2 * x2) + c1 * (dy - k1 * x)


@triton.jit(do_not_specialize=["n_rows"])
def old_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, x_stride, eps, BLOCK_R: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    col_mask = col_ids < n_cols
    for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
        rows = start + row_ids
        mask = (rows < n_rows) & col_mask
        x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        s3 = w0 * _old_rstd(tl.sum(x3 * x3, axis=1)[:, None], n_cols, eps)
        s2 = w1 * _old_rstd(tl.sum(x2 * x2, axis=1)[:, None], n_cols, eps)
        s1 = w2 * _old_rstd(tl.sum(x2, axis=1)[:, None], n_cols, eps)
        y = x3 * s3 + x2 * s2 + x * s1 + b
        tl.store(y_ptr + rows * n_cols + col_ids, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def old_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, partial_ptr, n_rows, n_cols, dy_stride, x_stride, eps,
                   BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.cast(eps, tl.float32)
    row_ids = tl.arange(0, BLOCK_R)[:, None]
    col_ids = tl.arange(0, BLOCK_N)[None, :]
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    dw0 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    dw1 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    dw2 = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    db = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    for start in tl.range(program_start(BLOCK_R), n_rows, grid_stride(BLOCK_R)):
        rows = start + row_ids
        row_ok = rows < n_rows
        mask = row_ok & (col_ids < n_cols)
        x = tl.load(x_ptr + rows * x_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows * dy_stride + col_ids, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        r3 = _old_rstd(tl.sum(x3 * x3, axis=1)[:, None], n_cols, eps)
        r2 = _old_rstd(tl.sum(x2 * x2, axis=1)[:, None], n_cols, eps)
        r1 = _old_rstd(tl.sum(x2, axis=1)[:, None], n_cols, eps)
        t3 = tl.sum(dy * x3, axis=1)[:, None]
        t2 = tl.sum(dy * x2, axis=1)[:, None]
        t1 = tl.sum(dy * x, axis=1)[:, None]
        tb = tl.sum(dy, axis=1)[:, None]
        dx = _old_poly_dx(x, x2, x3, dy, w0 * r3 * 3.0, r3 * r3 * t3 / n_cols, w1 * r2 * 2.0, r2 * r2 * t2 / n_cols,
                          w2 * r1, r1 * r1 * t1 / n_cols)
        tl.store(dx_ptr + rows * n_cols + col_ids, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw0 += tl.where(row_ok, r3 * t3, 0.0)
        dw1 += tl.where(row_ok, r2 * t2, 0.0)
        dw2 += tl.where(row_ok, r1 * t1, 0.0)
        db += tb
    row = partial_ptr + tl.program_id(0).to(tl.int64) * 4
    tl.store(row, tl.sum(tl.sum(dw0, axis=1), axis=0))
    tl.store(row + 1, tl.sum(tl.sum(dw1, axis=1), axis=0))
    tl.store(row + 2, tl.sum(tl.sum(dw2, axis=1), axis=0))
    tl.store(row + 3, tl.sum(tl.sum(db, axis=1), axis=0))


# ---- harness ------------------------------------------------------------------------------------------------------

def reference(x, w, b, eps=EPS):
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)
    return w[0] * norm(x ** 3) + w[1] * norm(x ** 2) + w[2] * norm(x) + b


def bench(fn):
    if CPU:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="tiny shape through the Triton interpreter (smoke test)")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=8192)
    args = parser.parse_args()
    device = "cpu" if CPU else "cuda"
    rows, cols = (6, 64) if CPU else (args.rows, args.cols)
    sms = 2 if CPU else torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16
    x = torch.randn(rows, cols, device=device, dtype=dtype, generator=gen)
    dy = torch.randn(rows, cols, device=device, dtype=dtype, generator=gen)
    w = (1.0 / 3.0 + 0.05 * torch.randn(3, device=device, generator=gen)).to(dtype)
    b = torch.ones((), device=device, dtype=dtype)
    n = x.numel()
    B_FWD, B_BWD, B_FB = 2 * n * 2, 3 * n * 2, 5 * n * 2
    copy = float("nan")
    if not CPU:
        src = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        copy = 2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
        del src, dst
        print(f"{torch.cuda.get_device_name()}  copy {copy:.0f} GB/s  triton {triton.__version__}  "
              f"torch {torch.__version__}")
    plan_f = P.plan_rows(device, rows, cols, P.FORWARD_MEMORY_MULTIPLIER, False, P.CUDA_FORWARD_WIDE_ROWS)
    plan_b = P.plan_rows(device, rows, cols, P.BACKWARD_MEMORY_MULTIPLIER, True)
    print(f"x {tuple(x.shape)} {dtype}; new plan (rows, cols, whole, grid, options): fwd {plan_f[:5]} "
          f"bwd {plan_b[:5]} prefetch {plan_b.prefetch}")

    # eager fp32 references
    xr = x.float().requires_grad_(True)
    wr = w.float().requires_grad_(True)
    br = b.float().requires_grad_(True)
    y_ref = reference(xr, wr, br)
    dx_ref, dw_ref, db_ref = torch.autograd.grad(y_ref, (xr, wr, br), dy.float())
    y_ref = y_ref.detach()

    def err(a, ref):
        return (a.float() - ref).abs().max().item()

    def line(name, ms, nbytes, errs):
        gbps = nbytes / ms / 1e6
        print(f"  {name:<44s} {ms * 1e3:9.1f} us {gbps:7.0f} GB/s {gbps / copy:5.2f} of copy   {errs}  "
              f"[{time.time() - T0:.0f}s]", flush=True)

    def fwd_errs(y):
        return f"max|y-ref| {err(y, y_ref):.3g}"

    def fb_errs(dx, dw, db):
        return (f"max|dx-ref| {err(dx, dx_ref):.3g} |dw-ref| {err(dw, dw_ref):.3g} "
                f"|db-ref| {err(db.reshape(()), db_ref):.3g}")

    def run(name, nbytes, fn, check):
        try:
            out = fn()
            errs = check(out)
            line(name, bench(fn), nbytes, errs)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:<44s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)

    def autograd_call(f):
        def call():
            xg = x.detach().requires_grad_(True)
            wg = w.detach().requires_grad_(True)
            bg = b.detach().requires_grad_(True)
            return torch.autograd.grad(f(xg, wg, bg), (xg, wg, bg), dy)
        return call

    print("op level (forward, then forward+backward):")
    ours = lambda xx, ww, bb: npu_liger.poly_norm(xx, ww, bb, EPS)  # noqa: E731
    run("npu_liger.poly_norm fwd (new)", B_FWD, lambda: ours(x, w, b), fwd_errs)
    run("npu_liger.poly_norm fwd+bwd (new)", B_FB, autograd_call(ours), lambda o: fb_errs(*o))
    liger = None
    if not CPU:
        try:
            from liger_kernel.ops.poly_norm import LigerPolyNormFunction
            liger = lambda xx, ww, bb: LigerPolyNormFunction.apply(xx, ww, bb, EPS, True)  # noqa: E731
        except Exception as e:  # noqa: BLE001
            print(f"  liger import FAILED: {e}")
    if liger is not None:
        run("Liger fwd", B_FWD, lambda: liger(x, w, b), fwd_errs)
        # Liger's in_place backward writes dx into dy: checked on a copy of dy, then timed in place (dy's values
        # drift over the repetitions; the time does not depend on them)
        dy_keep = dy.clone()
        try:
            print(f"  (Liger fwd+bwd check: {fb_errs(*autograd_call(liger)())})")
        except Exception as e:  # noqa: BLE001
            print(f"  Liger fwd+bwd check FAILED: {type(e).__name__}: {str(e)[:300]}")
        dy.copy_(dy_keep)
        dy_liger = dy.clone()

        def liger_fb():
            xg = x.detach().requires_grad_(True)
            wg = w.detach().requires_grad_(True)
            bg = b.detach().requires_grad_(True)
            return torch.autograd.grad(liger(xg, wg, bg), (xg, wg, bg), dy_liger)
        run("Liger fwd+bwd (timed in place)", B_FB, liger_fb, lambda o: "checked above")
        del dy_liger

    print("forward kernel variants (kernel alone):")
    y = torch.empty_like(x)

    def fwd_new(r, warps, fused, horner, grid=None):
        def call():
            g = grid or triton.cdiv(rows, r)
            P._poly_norm_fwd_kernel[(g,)](x, w, b, y, rows, cols, cols, EPS, WHOLE_ROW=True, FUSED_SUMS=fused,
                                          HORNER=horner, BLOCK_R=r, BLOCK_N=triton.next_power_of_2(cols),
                                          num_warps=warps)
            return y
        return call

    def fwd_old(r=1, warps=16):
        def call():
            old_fwd_kernel[(triton.cdiv(rows, r),)](x, w, b, y, rows, cols, cols, EPS, BLOCK_R=r,
                                                    BLOCK_N=triton.next_power_of_2(cols), num_warps=warps)
            return y
        return call

    run("OLD kernel, 1 row, 16 warps (old plan)", B_FWD, fwd_old(), fwd_errs)
    run("OLD kernel, 1 row, 8 warps", B_FWD, fwd_old(1, 8), fwd_errs)
    for r, warps, fused, horner in [(1, 8, True, True), (1, 16, True, True), (1, 4, True, True), (1, 16, False, False),
                                    (1, 8, False, False), (1, 8, True, False), (1, 8, False, True),
                                    (1, 16, False, True), (2, 8, True, True), (2, 16, True, True),
                                    (4, 16, True, True)]:
        run(f"new r{r} w{warps} fused={int(fused)} horner={int(horner)}", B_FWD, fwd_new(r, warps, fused, horner),
            fwd_errs)
    for k in (4, 8):
        run(f"new r1 w8 fused horner, persist {k}/SM", B_FWD, fwd_new(1, 8, True, True, k * sms), fwd_errs)

    print("backward kernel variants (kernel alone; bytes 3 N):")
    dx = torch.empty_like(x)

    def bwd_check(o):
        dxo, part = o
        return fb_errs(dxo, part[:, :3].sum(0), part[:, 3].sum())

    def bwd_new(warps, per_sm, fused, prefetch, r=1):
        grid = min(per_sm * sms, triton.cdiv(rows, r))
        part = torch.empty((grid, 4), dtype=torch.float32, device=device)

        def call():
            P._poly_norm_bwd_kernel[(grid,)](dy, x, w, dx, part, rows, cols, cols, cols, EPS, WHOLE_ROW=True,
                                             FUSED_SUMS=fused, PREFETCH=prefetch, BLOCK_R=r,
                                             BLOCK_N=triton.next_power_of_2(cols), num_warps=warps)
            return dx, part
        return call

    def bwd_old(warps=16, per_sm=2):
        grid = min(per_sm * sms, rows)
        part = torch.empty((grid, 4), dtype=torch.float32, device=device)

        def call():
            old_bwd_kernel[(grid,)](dy, x, w, dx, part, rows, cols, cols, cols, EPS, BLOCK_R=1,
                                    BLOCK_N=triton.next_power_of_2(cols), num_warps=warps)
            return dx, part
        return call

    run("OLD kernel, w16, 2/SM (old plan)", B_BWD, bwd_old(), bwd_check)
    for warps, per_sm, fused, prefetch in [(16, 2, True, True), (16, 2, False, False), (16, 2, True, False),
                                           (16, 2, False, True), (8, 2, True, True), (8, 4, True, True),
                                           (16, 1, True, True), (16, 4, True, True), (32, 1, True, True)]:
        run(f"new w{warps} {per_sm}/SM fused={int(fused)} prefetch={int(prefetch)}", B_BWD,
            bwd_new(warps, per_sm, fused, prefetch), bwd_check)

    if CPU or args.skip_compile:
        print("torch.compile skipped")
    elif time.time() - T0 > 40:
        print(f"torch.compile skipped: {time.time() - T0:.0f} s spent already (rerun with fewer variants)")
    else:
        print("torch.compile of the eager reference:")
        compiled = torch.compile(reference)
        run("torch.compile fwd", B_FWD, lambda: compiled(x, w, b), fwd_errs)
        run("torch.compile fwd+bwd", B_FB, autograd_call(compiled), lambda o: fb_errs(*o))
    print(f"done in {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
