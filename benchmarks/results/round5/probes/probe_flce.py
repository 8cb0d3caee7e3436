import os, torch
from triton.testing import do_bench
import npu_liger
BT, H, V = 8192, 4096, 128256
x = (torch.randn(BT, H, device="cuda") * 0.5).bfloat16().requires_grad_(True)
w = (torch.randn(V, H, device="cuda") * H ** -0.5).bfloat16().requires_grad_(True)
t = torch.randint(0, V, (BT,), device="cuda")
def fb():
    loss = npu_liger.fused_linear_cross_entropy(x, w, t)
    torch.autograd.grad(loss, [x, w])
for rows in ("256", "1024"):
    os.environ["NPU_LIGER_FLCE_CHUNK_ROWS"] = rows
    ms = do_bench(fb, rep=500)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fb(); torch.cuda.synchronize()
    print(f"chunk {rows}: f+b {ms:.2f} ms")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
        print(f"   {e.device_time_total/1e3:8.2f} ms  x{e.count:4d}  {e.key[:110]}")
