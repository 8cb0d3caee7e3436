"""Round fifteen's probe, kept as it ran (from the repository root, as ``scratch/diag.py rope,layer_norm,embedding``;
output: diag.txt). Is a whole call host-bound because of our Python or because the direct launch is off? Times
ours and Liger's forward+backward at the harness shapes (do_bench, then a host loop), and cProfiles both."""
import cProfile, pstats, sys, time, itertools
import torch, triton.testing
from benchmarks.specs import SPECS
from benchmarks.measure import make_pool, kernel_ms
from benchmarks import liger
from npu_liger.npu_ops import _triton as T

def fb_fn(fn, pool):
    cyc = itertools.cycle(pool)
    def fb():
        inp = next(cyc)
        outs = fn(*inp.args)
        torch.autograd.grad(outs, inp.leaves, inp.grads_out, allow_unused=True)
    return fb

def state():
    return f"direct={T.LaunchedKernel._direct} hooks={T._launch_hooks_set()}"

for op in sys.argv[1].split(","):
    spec = SPECS[op]; case = spec.cases("main")[0]
    pool = make_pool(case, "cuda", 3)
    fns = {"npu_liger": spec.npu_variant("functional")}
    try:
        fns["liger"] = liger.variant(op)
    except ImportError as exc:
        print("no liger:", exc)
    for name, fn in fns.items():
        fb = fb_fn(fn, pool)
        ms = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
        # host time alone: no sync inside, sync at end, the GPU queue may fill
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(50): fb()
        host_sync = (time.perf_counter() - t) / 50 * 1e3
        torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 50 * 1e3
        print(f"{op} {name}: do_bench fb {ms:.3f} ms; loop host {host_sync:.3f} ms, wall {wall:.3f} ms; {state()}")
    fb = fb_fn(fns["npu_liger"], pool)
    kernel_ms(fb)
    print(f"after profiler: {state()}")
    ms = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
    print(f"{op} npu_liger after profiler: do_bench fb {ms:.3f} ms")
    p = cProfile.Profile(); p.enable()
    for _ in range(100): fb()
    torch.cuda.synchronize(); p.disable()
    print(f"--- cProfile npu_liger {op} fb x100 ---")
    pstats.Stats(p, stream=sys.stdout).sort_stats("tottime").print_stats(22)
    if "liger" in fns:
        fb = fb_fn(fns["liger"], pool)
        p = cProfile.Profile(); p.enable()
        for _ in range(100): fb()
        torch.cuda.synchronize(); p.disable()
        print(f"--- cProfile liger {op} fb x100 ---")
        pstats.Stats(p, stream=sys.stdout).sort_stats("tottime").print_stats(14)
    del pool
