import sys, time, torch
sys.path.insert(0, ".")
from benchmarks import train_step as ts
family, variant = sys.argv[1], sys.argv[2]
size = ts.SIZES["default"]
dev = torch.device("cuda")
model, note = ts.build_model(family, size, ts.VARIANTS[variant], dev, torch.bfloat16)
step = ts.training_step(model, model, ts.make_batches(size, 4, dev), dev)
for i in range(3): step(i)
torch.cuda.synchronize()
host, total = [], []
for i in range(8):
    t0 = time.perf_counter(); step(i); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    host.append((t1 - t0) * 1e3); total.append((t2 - t0) * 1e3)
print(f"{family} {variant} step ms: " + " ".join(f"{t:.0f}" for t in total) + " | host enqueue ms: " + " ".join(f"{t:.0f}" for t in host))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    step(0); torch.cuda.synchronize()
ev = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
print(f"   GPU kernel time in one step: {sum(e.self_device_time_total for e in ev) / 1e3:.1f} ms")
for e in ev[:8]:
    print(f"   {e.device_time_total / 1e3:7.2f} ms x{e.count:4d} {e.key[:100]}")
