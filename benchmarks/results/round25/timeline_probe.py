"""Round twenty-five's timeline probe, for a GPU session (not yet run on one; on the CPU only its host column means
anything): where a forward+backward row that is slower than its kernels loses the time. For each op's main harness
case and each variant (ours, Liger-Kernel when importable), it runs the harness's forward+backward call back to
back under torch.profiler and reports, per call:

    host     the host's time per call while it runs ahead of the device (its Python, autograd and launches)
    kernels  the device time of its kernels (as the harness's kernel column)
    idle     the device's idle time inside the calls' window: the gaps between consecutive kernels
    gaps     the three longest gaps, each with the last host event that began before the kernel that ended it

A row is host-bound when host >= kernels and idle is most of the difference between the whole call and its
kernels; the longest gaps name the host work the device waited for. Run from the repository root:

    PYTHONPATH=.:/tmp/site python benchmarks/results/round25/timeline_probe.py embedding,qwen2vl_mrope,poly_norm
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import liger
from benchmarks.measure import _gen, forward_backward, sync
from benchmarks.specs import SPECS

CALLS = 20


def _kineto_events(prof):
    """(device type, start µs, end µs, name) of every event Kineto recorded (what torch.profiler's own queue-depth
    analysis reads, ``torch/profiler/_utils.py``)."""
    out = []
    for e in prof.profiler.kineto_results.events():
        name = e.name() if callable(e.name) else e.name
        start = e.start_ns() / 1e3
        out.append((e.device_type(), start, start + e.duration_ns() / 1e3, str(name)))
    return out


def device_intervals(prof):
    """Sorted (start, end, name) of the device activity (kernels, memsets, copies), in µs."""
    return sorted((start, end, name) for kind, start, end, name in _kineto_events(prof)
                  if kind == torch.autograd.DeviceType.CUDA)


def host_ops(prof):
    """Sorted (start, name) of the host events (ops, runtime calls such as launches), in µs."""
    return sorted((start, name) for kind, start, _, name in _kineto_events(prof)
                  if kind == torch.autograd.DeviceType.CPU)


def host_us_per_call(fn, inp, device: str) -> float:
    """Wall time of CALLS back-to-back calls before the device is waited for, per call (no profiler): the host's
    cost whenever it runs ahead of the device."""
    sync(device)
    start = time.perf_counter()
    for _ in range(CALLS):
        forward_backward(fn, inp)
    host = (time.perf_counter() - start) / CALLS * 1e6
    sync(device)
    return host


def probe(op: str, name: str, fn, inp, device: str) -> str:
    for _ in range(5):
        forward_backward(fn, inp)
    host = min(host_us_per_call(fn, inp, device) for _ in range(3))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(CALLS):
            forward_backward(fn, inp)
        sync(device)
    kernels = device_intervals(prof)
    if not kernels:
        return f"{op:14s} {name:10s} host {host:8.1f} µs/call (no device activity recorded)"
    busy = sum(end - start for start, end, _ in kernels) / CALLS
    gaps = [(nxt[0] - cur[1], nxt[0], nxt[2]) for cur, nxt in zip(kernels, kernels[1:]) if nxt[0] > cur[1]]
    idle = sum(gap for gap, _, _ in gaps) / CALLS
    ops = host_ops(prof)
    longest = []
    for gap, kernel_start, kernel in sorted(gaps, reverse=True)[:3]:
        before = [n for t, n in ops if t <= kernel_start]
        longest.append(f"{gap:.0f} µs before {kernel[:40]} (host: {before[-1][:40] if before else '?'})")
    return (f"{op:14s} {name:10s} host {host:8.1f}  kernels {busy:8.1f}  idle {idle:8.1f} µs/call;  "
            + "; ".join(longest))


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ops = sys.argv[1].split(",") if len(sys.argv) > 1 else ["embedding", "qwen2vl_mrope", "poly_norm"]
    for op in ops:
        spec = SPECS[op]
        case = spec.cases("main" if device == "cuda" else "tiny")[0]
        inp = spec.make(case.params, case.dtype, device, _gen(device, 7))
        variants = [("npu_liger", spec.npu_variant("functional"))]
        if device == "cuda" and liger.available():
            variants.append(("liger", liger.variant(op)))
        for name, fn in variants:
            print(probe(op, name, fn, inp, device), flush=True)
    print(f"({CALLS} back-to-back calls per row; host: the best of 3 unprofiled runs; kernels and idle: one "
          "profiled run)")


if __name__ == "__main__":
    main()
