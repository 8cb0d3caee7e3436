"""Round twenty's probe (from the repository root on a CUDA machine, liger-kernel importable:
PYTHONPATH=. python benchmarks/results/round20/rows_probe.py [--cpu]).

Part 1, host or device: for the harness rows whose forward+backward rounds scattered by tens of percent in round
twenty's harness run (dyt and poly_norm at both shapes, softmax 65536x1024, group_norm), each variant's
forward+backward (torch.autograd.grad, one input set) as do_bench's median, the summed duration of the kernels it
launches (torch.profiler; ``benchmarks.measure.kernel_ms``) and their count. A wall time well above the kernel
time is time the GPU waits on the host.

Part 2, softmax's narrow rows (65536x1024 bf16): the backward kernel alone (dx from y and dy) under (rows per
program, warps) plans against the default plan and Liger-Kernel's backward (LigerSoftmaxFunction), and the
forward kernel the same way.
--cpu: a smoke test under the Triton interpreter (tiny shapes, one timed call each, no compile, no Liger).
"""
import math
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import npu_liger  # noqa: E402
from benchmarks import liger, measure  # noqa: E402
from benchmarks.specs import SPECS, Case  # noqa: E402
from npu_liger.npu_ops import softmax as S  # noqa: E402

DEV = "cpu" if CPU else "cuda"
T0 = time.time()


def bench(fn):
    if CPU:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100)


def kernels(fn):
    """(device ms per call, kernel launches per call) from torch.profiler."""
    if CPU:
        return float("nan"), 0
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    return (sum(e.self_device_time_total for e in events) / 10 / 1e3,
            sum(e.count for e in events if e.self_device_time_total > 0) / 10)


def part1():
    print("== part 1: forward+backward wall (do_bench) against kernel time (profiler), ms")
    for name in ("dyt", "poly_norm", "softmax", "group_norm"):
        spec = SPECS[name]
        cases = [Case(name, "main", dict(p), spec.dtype) for p in spec.main]
        if CPU:
            cases = [Case(name, "smoke", dict(spec.smoke), spec.dtype)]
        elif name == "softmax":
            cases = [c for c in cases if c.label.startswith("65536x1024")]
        for case in cases:
            variants = [("npu_liger", spec.npu_variant())]
            if not CPU:
                variants += [("liger", liger.variant(name)), ("torch.compile", spec.compiled_variant())]
            variants += [("eager", spec.eager_variant())]
            for variant, fn in variants:
                inp = spec.make(case.params, case.dtype, DEV, measure._gen(DEV, 7))

                def fb():
                    torch.autograd.grad(fn(*inp.args), inp.leaves, inp.grads_out, allow_unused=True)

                try:
                    wall = bench(fb)
                    device_ms, launches = kernels(fb)
                    print(f"{name:<10} {case.label:<26} {variant:<13} wall {wall:.4f}  kernels {device_ms:.4f} "
                          f"({launches:.0f} launches)  wall-kernels {wall - device_ms:+.4f}", flush=True)
                except Exception as exc:
                    print(f"{name:<10} {case.label:<26} {variant:<13} failed: {type(exc).__name__}: {exc}"[:300])


def part2():
    print("== part 2: softmax narrow rows, kernels alone, ms")
    n_rows, n_cols = (96, 1024) if CPU else (65536, 1024)
    x = torch.randn(n_rows, n_cols, device=DEV, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y = S.softmax_forward(x)
    y64 = torch.softmax(x.double(), -1)
    dx64 = y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
    default_plan = S._plan
    for direction in ("forward", "backward"):
        tiles, switches = default_plan(DEV if not CPU else "cuda", n_rows, n_cols, direction)
        print(f"default {direction} plan: rows {tiles.block_rows} cols {tiles.block_cols} grid {tiles.grid} "
              f"{tiles.options} {switches}")
    if not CPU:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        leaf = x.clone().requires_grad_(True)
        ly = LigerSoftmaxFunction.apply(leaf)
        print(f"liger forward {bench(lambda: LigerSoftmaxFunction.apply(x)):.4f}  "
              f"f+b wall {bench(lambda: torch.autograd.grad(LigerSoftmaxFunction.apply(leaf), leaf, dy)):.4f}")
        del ly
    print(f"ours forward {bench(lambda: S.softmax_forward(x)):.4f} backward {bench(lambda: S.softmax_backward(dy, y)):.4f}")
    for rows in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4, 8):
            if rows * n_cols > 16384 or (CPU and warps != 4):
                continue

            def plan(device_type, n_rows, n_cols, direction, rows=rows, warps=warps):
                tiles, switches = default_plan(device_type, n_rows, n_cols, direction)
                return tiles._replace(block_rows=rows, grid=math.ceil(n_rows / rows),
                                      options={"num_warps": warps}), switches

            S._plan = plan
            try:
                dx = S.softmax_backward(dy, y)
                y_new = S.softmax_forward(x)
                err = ((dx.double() - dx64).norm() / dx64.norm()).item()
                yerr = ((y_new.double() - y64).norm() / y64.norm()).item()
                print(f"rows {rows:>2} warps {warps}: forward {bench(lambda: S.softmax_forward(x)):.4f} "
                      f"backward {bench(lambda: S.softmax_backward(dy, y)):.4f}  errors y {yerr:.1e} dx {err:.1e}",
                      flush=True)
            finally:
                S._plan = default_plan


if __name__ == "__main__":
    if "--part2" not in sys.argv:
        part1()
    part2()
    print(f"done in {time.time() - T0:.0f} s")
