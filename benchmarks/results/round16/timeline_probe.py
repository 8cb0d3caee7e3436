"""Round sixteen's probe (run from the repository root as ``python benchmarks/results/round16/timeline_probe.py
rms_norm,layer_norm``): where does a whole forward+backward call at the harness's main shape spend its time on
the host and the GPU? For npu_liger, Liger-Kernel and eager PyTorch it profiles a few calls of the harness's
forward+backward (each after an L2 flush, as do_bench times them) and prints the last call's timeline: every
kernel's launch time on the host, its start and end on the GPU (µs from the call's start), and the GPU's idle
time inside the call."""
import sys

import torch
from torch.autograd.profiler import record_function

from benchmarks import liger, reference  # noqa: F401
from benchmarks.measure import make_pool
from benchmarks.specs import SPECS


def fb_fn(fn, inp):
    def fb():
        outs = fn(*inp.args)
        torch.autograd.grad(outs, inp.leaves, inp.grads_out, allow_unused=True)
    return fb


def timeline(fb, flush):
    for _ in range(5):
        flush.zero_()
        fb()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(4):
            flush.zero_()
            with record_function(f"call{i}"):
                fb()
        torch.cuda.synchronize()
    events = list(prof.profiler.kineto_results.events())
    call = [e for e in events if e.name() == "call3"][0]
    t0, t1 = call.start_ns(), call.start_ns() + call.duration_ns()
    launches = {e.correlation_id(): e for e in events if e.device_type() == torch.autograd.DeviceType.CPU
                and ("LaunchKernel" in e.name() or "Memset" in e.name() or "Memcpy" in e.name())}
    kernels = sorted((e for e in events if e.device_type() == torch.autograd.DeviceType.CUDA
                      and e.correlation_id() in launches and t0 <= launches[e.correlation_id()].start_ns() <= t1),
                     key=lambda e: e.start_ns())
    rows, busy, last_end = [], 0, None
    for k in kernels:
        launch = launches[k.correlation_id()]
        rows.append(f"    launch {(launch.start_ns() - t0) / 1e3:7.1f}  gpu {(k.start_ns() - t0) / 1e3:7.1f}"
                    f"-{(k.start_ns() + k.duration_ns() - t0) / 1e3:7.1f}  {k.name()[:70]}")
        busy += k.duration_ns()
        last_end = k.start_ns() + k.duration_ns()
    first = kernels[0].start_ns() if kernels else t0
    span = (last_end - first) / 1e3 if kernels else 0.0
    host = (t1 - t0) / 1e3
    return rows, host, span, busy / 1e3


def main():
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for op in sys.argv[1].split(","):
        spec = SPECS[op]
        case = spec.cases("main")[0]
        inp = make_pool(case, "cuda", 1)[0]
        variants = {"npu_liger": spec.npu_variant("functional"), "eager": spec.eager_variant()}
        try:
            variants["liger"] = liger.variant(op)
        except ImportError as exc:
            print("no liger:", exc)
        for name, fn in variants.items():
            rows, host, span, busy = timeline(fb_fn(fn, inp), flush)
            print(f"{op} {case.label} {name}: host {host:.1f} us for the call; "
                  f"GPU from first kernel start to last kernel end {span:.1f} us, kernels busy {busy:.1f} us")
            print("\n".join(rows))


if __name__ == "__main__":
    main()
