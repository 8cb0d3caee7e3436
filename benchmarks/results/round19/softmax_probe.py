"""Round nineteen's softmax probe (from the repository root on a CUDA machine: PYTHONPATH=. python
benchmarks/results/round19/softmax_probe.py [--quick]). At the harness's three bf16 shapes (16384x8192 whole rows,
2048x65536 looped rows, 65536x1024 narrow rows), forward and forward+backward (torch.autograd.grad, as the
harness) do_bench medians of npu_liger.softmax under launch-policy variants (the CUDA knobs of
npu_liger/npu_ops/softmax.py, set for one variant and restored), Liger-Kernel's LigerSoftmaxFunction and
torch.compile, as GB/s of the harness's bytes (forward 2N, f+b 5N elements) and fractions of the copy bandwidth,
each with its max error against an fp32 eager reference (y and grad of x).

Variants: "new" = the file's defaults; "old" = the previous round's launch (8 warps forward at 8192, no
prefetch, forward second walk, plain stores), i.e. the old kernel; the others change one or two knobs from "new".
Order: new, old, Liger, torch.compile, then the sweep; a variant that would start after BUDGET_S seconds is
skipped (printed as such; each shape has its share of the budget) so the probe ends within about a minute even
with cold compile caches (run it twice for all).
--narrow: also 65536x1024 (already ahead of every peer: a regression check). --quick: no torch.compile.
--cpu: a smoke test under the Triton interpreter (tiny shapes, the CUDA plan forced, one timed call each).
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
import triton  # noqa: E402

import npu_liger  # noqa: E402
from npu_liger.npu_ops import softmax as S  # noqa: E402
from npu_liger.npu_ops._norm import CudaWideRows  # noqa: E402

DEV = "cpu" if CPU else "cuda"
DTYPE = torch.bfloat16
if CPU:  # exercise the CUDA launch policy (its constexpr switches) under the interpreter
    _orig_plan = S._plan
    S._plan = lambda device_type, *a: _orig_plan("cuda", *a)
    SHAPES = [(5, 8192), (3, 40000), (9, 1024)]
else:
    SHAPES = [(16384, 8192), (2048, 65536)] + ([(65536, 1024)] if "--narrow" in sys.argv else [])
BUDGET_S = 1e9 if CPU else 50.0
T0 = time.time()

W8 = (CudaWideRows(min_cols=8192, rows=1, warps=8),)
W16 = (CudaWideRows(min_cols=8192, rows=1, warps=16),)
W32 = (CudaWideRows(min_cols=8192, rows=1, warps=32),)
W2R16 = (CudaWideRows(min_cols=8192, rows=2, warps=16),)
OLD = dict(CUDA_FORWARD_WIDE_ROWS=W8, CUDA_BACKWARD_WIDE_ROWS=W8, CUDA_PREFETCH=False, REVERSE_SECOND_PASS=False,
           CUDA_STREAM_MIN_COLS=1 << 40, CUDA_LOOPED={"forward": (16384, 16), "backward": (16384, 16)})


def looped(block, warps):
    return {"CUDA_LOOPED": {"forward": (block, warps), "backward": (block, warps)}}


WHOLE_VARIANTS = {  # rows of 8192 (whole rows)
    "new": {},
    "old": OLD,
    "fwd 8w, .cs": dict(CUDA_FORWARD_WIDE_ROWS=W8),
    "fwd 16w, plain": dict(CUDA_STREAM_MIN_COLS=1 << 40),
    "fwd 32w, .cs": dict(CUDA_FORWARD_WIDE_ROWS=W32),
    "fwd 2 rows/16w": dict(CUDA_FORWARD_WIDE_ROWS=W2R16),
    "bwd 16w": dict(CUDA_BACKWARD_WIDE_ROWS=W16),
}
LOOPED_VARIANTS = {  # rows of 65536 (looped; or whole with CUDA_WHOLE_ROW_LIMIT)
    "new": {},
    "old": OLD,
    "no prefetch": dict(CUDA_PREFETCH=False),
    "no reverse": dict(REVERSE_SECOND_PASS=False),
    "plain stores": dict(CUDA_STREAM_MIN_COLS=1 << 40),
    "chunk 8192/8w": looped(8192, 8),
    "chunk 8192/16w": looped(8192, 16),
    "chunk 4096/8w": looped(4096, 8),
    "chunk 16384/8w": looped(16384, 8),
    "chunk 32768/32w": looped(32768, 32),
    "whole row 32w": dict(CUDA_WHOLE_ROW_LIMIT=1 << 17, CUDA_WIDEST_WARPS=32),
    "whole row 16w": dict(CUDA_WHOLE_ROW_LIMIT=1 << 17, CUDA_WIDEST_WARPS=16),
}
NARROW_VARIANTS = {"new": {}, "old": OLD, ".cs stores": dict(CUDA_STREAM_MIN_COLS=0)}


@contextlib.contextmanager
def knobs(**kw):
    saved = {k: getattr(S, k) for k in kw}
    for k, v in kw.items():
        setattr(S, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(S, k, v)


def bench(fn):
    if CPU:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


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
    peers = {}
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        peers["liger"] = LigerSoftmaxFunction.apply
    except Exception as exc:
        print(f"liger unavailable: {exc}")
    if not CPU and not QUICK:
        peers["torch.compile"] = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
    for index, shape in enumerate(SHAPES):
        deadline = T0 + BUDGET_S * (index + 1) / len(SHAPES)  # each shape its share of the budget
        n = shape[0] * shape[1]
        gen = torch.Generator(device=DEV).manual_seed(0)
        x = (2.0 * torch.randn(shape, generator=gen, device=DEV)).to(DTYPE).requires_grad_(True)
        dy = torch.randn(shape, generator=gen, device=DEV).to(DTYPE)
        xr = x.detach().float().requires_grad_(True)
        y_ref = torch.softmax(xr, -1)
        (g_ref,) = torch.autograd.grad(y_ref, xr, dy.float())
        y_ref = y_ref.detach()
        cols = shape[1]
        table = WHOLE_VARIANTS if cols >= 8192 and cols <= 16384 else LOOPED_VARIANTS if cols > 16384 \
            else NARROW_VARIANTS
        print(f"\n== softmax {shape[0]}x{shape[1]} bf16  (fwd bytes {2 * n * 2 / 1e9:.3f} GB, f+b "
              f"{5 * n * 2 / 1e9:.3f} GB)")
        runs = [(f"ours {name}", npu_liger.softmax, kw) for name, kw in table.items()]
        runs[2:2] = [(name, fn, {}) for name, fn in peers.items()]
        for rank, (name, fn, kw) in enumerate(runs):
            if rank >= 2 + len(peers) and time.time() > deadline:  # new, old and the peers always run
                print(f"  {name:<24} skipped (past this shape's share of {BUDGET_S:.0f} s; caches are warm now)")
                continue
            try:
                with knobs(**kw):
                    if not CPU:
                        tiles, switches = S._plan("cuda", *shape, "forward")
                        btiles, bswitches = S._plan("cuda", *shape, "backward")
                        plan = (f"fwd R{tiles.block_rows}xN{tiles.block_cols} whole={tiles.whole_row} "
                                f"{tiles.options} {switches} | bwd R{btiles.block_rows}xN{btiles.block_cols} "
                                f"{btiles.options}") if name.startswith("ours") else ""
                    else:
                        plan = ""
                    y = fn(x)
                    (g,) = torch.autograd.grad(y, x, dy)
                    err_y = (y.float() - y_ref).abs().max().item()
                    err_g = (g.float() - g_ref).abs().max().item()
                    del y, g
                    f_ms = bench(lambda: fn(x))
                    fb_ms = bench(lambda: torch.autograd.grad(fn(x), x, dy))
                f_gbs, fb_gbs = 2 * n * 2 / f_ms / 1e6, 5 * n * 2 / fb_ms / 1e6
                print(f"  {name:<24} fwd {f_ms:8.4f} ms {f_gbs:6.0f} GB/s ({f_gbs / copy:.3f})  "
                      f"f+b {fb_ms:8.4f} ms {fb_gbs:6.0f} GB/s ({fb_gbs / copy:.3f})  "
                      f"max err y {err_y:.2e} grad {err_g:.2e}  {plan}")
            except Exception as exc:
                print(f"  {name:<24} ERROR {type(exc).__name__}: {str(exc)[:300]}")
                if CPU:
                    traceback.print_exc()
        if not CPU:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
    print(f"\nprobe took {time.time() - T0:.1f} s")
