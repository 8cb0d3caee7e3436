"""Per-step timing of one training-step variant, with what could make a step slow: Triton compilations, gc
pauses, cudaMalloc calls, and (if the run is slow) a CPU+CUDA profile of two steps."""
import gc, sys, time, json, torch
sys.path.insert(0, ".")
from benchmarks import train_step as ts
from npu_liger.npu_ops import _triton

family, variant, tag = sys.argv[1], sys.argv[2], sys.argv[3]
size = ts.SIZES["default"]
dev = torch.device("cuda")
model, note = ts.build_model(family, size, ts.VARIANTS[variant], dev, torch.bfloat16)
run = torch.compile(model) if ts.VARIANTS[variant].compiled else model
step = ts.training_step(run, model, ts.make_batches(size, 4, dev), dev)

def n_compiled():
    n = 0
    for obj in gc.get_objects():
        if isinstance(obj, _triton.LaunchedKernel):
            n += len(obj._compiled)
    return n

gc_pauses = []
_t = {}
def _cb(phase, info):
    if phase == "start": _t["s"] = time.perf_counter()
    else: gc_pauses.append((info["generation"], (time.perf_counter() - _t["s"]) * 1e3))
for i in range(3): step(i)
torch.cuda.synchronize()
c0 = n_compiled(); m0 = torch.cuda.memory_stats()
gc.callbacks.append(_cb)
N = 12
ev = [torch.cuda.Event(enable_timing=True) for _ in range(N + 1)]
host = []
t_start = time.perf_counter()
ev[0].record()
for i in range(N):
    t0 = time.perf_counter(); step(3 + i); host.append((time.perf_counter() - t0) * 1e3); ev[i + 1].record()
torch.cuda.synchronize()
wall = (time.perf_counter() - t_start) * 1e3 / N
gc.callbacks.remove(_cb)
c1 = n_compiled(); m1 = torch.cuda.memory_stats()
gpu = [ev[i].elapsed_time(ev[i + 1]) for i in range(N)]
med = sorted(gpu)[N // 2]
print(f"[{tag}] {family} {variant}: mean {wall:.1f} ms/step; per step (event) " + " ".join(f"{t:.0f}" for t in gpu))
print(f"[{tag}]   host enqueue ms: " + " ".join(f"{t:.0f}" for t in host))
print(f"[{tag}]   triton keys compiled during timed steps: {c1 - c0}; cudaMalloc calls: "
      f"{m1.get('num_device_alloc', 0) - m0.get('num_device_alloc', 0)}; alloc retries: "
      f"{m1.get('num_alloc_retries', 0) - m0.get('num_alloc_retries', 0)}; gc pauses: "
      + ", ".join(f"g{g}:{t:.1f}ms" for g, t in gc_pauses if t > 0.5))
slow = wall > 1.25 * 78 if family == "qwen3" else False
if slow or "--profile" in sys.argv:
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(2): step(i)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    print(f"[{tag}]   PROFILE (slow={slow}) GPU kernel time per step: {sum(e.self_device_time_total for e in ka) / 2e3:.1f} ms")
    for e in sorted(ka, key=lambda e: -e.self_device_time_total)[:12]:
        print(f"[{tag}]   gpu {e.self_device_time_total / 2e3:7.2f} ms x{e.count // 2:4d} {e.key[:90]}")
    for e in sorted(ka, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"[{tag}]   cpu {e.self_cpu_time_total / 2e3:7.2f} ms x{e.count // 2:4d} {e.key[:90]}")
    prof.export_chrome_trace(f"{sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].startswith('--') else '/tmp'}/trace_{tag}.json")
