"""Round nineteen's kl_div probe (from the repository root on a CUDA machine: PYTHONPATH=. python
benchmarks/results/round19/kl_div_probe.py [--quick]). At the harness shape (8192x128256 bf16, batchmean, y_true
probabilities, grad for y_pred only), forward and forward+backward (torch.autograd.grad, as the harness) do_bench
medians of npu_liger.kl_div under CUDA tile variants (kl_div.CUDA_FORWARD_TILE / CUDA_BACKWARD_TILE: (columns,
warps), or None for the 64 KiB budget's 1024 columns on 4 warps), Liger-Kernel's LigerKLDivLossFunction and
torch.compile, as GB/s of the harness's bytes (forward 2N, f+b 4N elements) and fractions of the copy bandwidth,
each with its error against an fp32 eager reference (loss relative error, grad max abs error).

Variants: "new" = the file's defaults; "old" = both tiles None (the previous round's launch, the old kernel);
"fwd C/W" change the forward tile only; "bwd C/W" change the backward tile only (forward at "new").
Order: new, old, Liger, torch.compile, then the sweep; a variant that would start after BUDGET_S seconds is
skipped (printed as such) so the probe ends within a minute even with cold compile caches (run it twice for all).
--quick: forward-tile variants only, no torch.compile.
--cpu: a smoke test under the Triton interpreter (tiny shape, the CUDA plan forced, one timed call each).
"""
import contextlib
import os
import sys
import time
import traceback

CPU = "--cpu" in sys.argv
QUICK = "--quick" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import npu_liger  # noqa: E402
from npu_liger.npu_ops import kl_div as K  # noqa: E402

DEV = "cpu" if CPU else "cuda"
DTYPE = torch.bfloat16
BT, V = (6, 20000) if CPU else (8192, 128256)
BUDGET_S = 1e9 if CPU else 50.0
T0 = time.time()
if CPU:  # exercise the CUDA tile policy under the interpreter
    _orig_plan = K._row_plan
    K._row_plan = lambda device_type, *a: _orig_plan("cuda", *a)

VARIANTS = {"new": {}, "old": dict(CUDA_FORWARD_TILE=None, CUDA_BACKWARD_TILE=None)}
for tile in ((2048, 8), (4096, 8), (4096, 16), (8192, 8), (16384, 16), (16384, 32)):
    VARIANTS[f"fwd {tile[0]}/{tile[1]}w"] = dict(CUDA_FORWARD_TILE=tile)
if not QUICK:
    for tile in ((4096, 8), (8192, 16), (16384, 16)):
        VARIANTS[f"bwd {tile[0]}/{tile[1]}w"] = dict(CUDA_BACKWARD_TILE=tile)


@contextlib.contextmanager
def knobs(**kw):
    saved = {k: getattr(K, k) for k in kw}
    for k, v in kw.items():
        setattr(K, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(K, k, v)


def bench(fn):
    if CPU:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def copy_gbps():
    if CPU:
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * (1 << 30) / ms / 1e6


def main():
    copy = copy_gbps()
    print(f"{torch.cuda.get_device_name() if not CPU else 'cpu (interpreter)'}  copy {copy:.0f} GB/s  "
          f"torch {torch.__version__} triton {triton.__version__}")
    gen = torch.Generator(device=DEV).manual_seed(0)
    y_pred = torch.log_softmax(torch.randn((BT, V), generator=gen, device=DEV), -1).to(DTYPE).requires_grad_(True)
    y_true = torch.softmax(torch.randn((BT, V), generator=gen, device=DEV), -1).to(DTYPE)
    grad_out = torch.ones((), dtype=DTYPE, device=DEV)
    xr = y_pred.detach().float().requires_grad_(True)
    loss_ref = F.kl_div(xr, y_true.float(), reduction="batchmean")
    (g_ref,) = torch.autograd.grad(loss_ref, xr)
    loss_ref = loss_ref.item()
    del xr
    n = BT * V
    print(f"== kl_div {BT}x{V} bf16 batchmean  (fwd bytes {2 * n * 2 / 1e9:.3f} GB, f+b {4 * n * 2 / 1e9:.3f} GB)")
    runs = [(f"ours {name}", lambda a, b: npu_liger.kl_div(a, b, "batchmean", False, 1e-10), kw)
            for name, kw in VARIANTS.items()]
    peers = []
    try:
        from liger_kernel.ops.kl_div import LigerKLDivLossFunction
        peers.append(("liger", lambda a, b: LigerKLDivLossFunction.apply(a, b, "batchmean", False, 1e-10), {}))
    except Exception as exc:
        print(f"liger unavailable: {exc}")
    if not CPU and not QUICK:
        peers.append(("torch.compile", torch.compile(lambda a, b: F.kl_div(a, b, reduction="batchmean"),
                                                     dynamic=False), {}))
    runs[2:2] = peers
    for name, fn, kw in runs:
        if time.time() - T0 > BUDGET_S:
            print(f"  {name:<20} skipped (past the {BUDGET_S:.0f} s budget; compile caches are warm now)")
            continue
        try:
            with knobs(**kw):
                plan = ""
                if name.startswith("ours"):
                    f, b = (K._row_plan("cuda", V, m, t) for m, t in
                            ((K.FORWARD_MEMORY_MULTIPLIER, K.CUDA_FORWARD_TILE),
                             (K.BACKWARD_MEMORY_MULTIPLIER, K.CUDA_BACKWARD_TILE)))
                    plan = (f"fwd BLOCK_V {f.block} {f.launch_options()} grid {f.grid(BT)} | bwd BLOCK_V {b.block} "
                            f"{b.launch_options()}")
                loss = fn(y_pred, y_true)
                (g,) = torch.autograd.grad(loss, y_pred, grad_out)
                err_l = abs(loss.float().item() - loss_ref) / abs(loss_ref)
                err_g = (g.float() - g_ref).abs().max().item()
                del loss, g
                f_ms = bench(lambda: fn(y_pred, y_true))
                fb_ms = bench(lambda: torch.autograd.grad(fn(y_pred, y_true), y_pred, grad_out))
            f_gbs, fb_gbs = 2 * n * 2 / f_ms / 1e6, 4 * n * 2 / fb_ms / 1e6
            print(f"  {name:<20} fwd {f_ms:8.4f} ms {f_gbs:6.0f} GB/s ({f_gbs / copy:.3f})  "
                  f"f+b {fb_ms:8.4f} ms {fb_gbs:6.0f} GB/s ({fb_gbs / copy:.3f})  "
                  f"loss rel err {err_l:.2e} grad max err {err_g:.2e}  {plan}")
        except Exception as exc:
            print(f"  {name:<20} ERROR {type(exc).__name__}: {str(exc)[:300]}")
            if CPU:
                traceback.print_exc()


if __name__ == "__main__":
    main()
    print(f"\nprobe took {time.time() - T0:.1f} s")
