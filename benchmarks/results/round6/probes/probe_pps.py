"""Backward kernel time of the norms against CUDA programs per SM (persistent grid), narrow and wide rows."""
import torch
from torch.profiler import profile, ProfilerActivity
from npu_liger.npu_ops import _norm, rms_norm as R, layer_norm as L

def kern_us(fn, n=20):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    ka = p.key_averages()
    return (sum(e.self_device_time_total for e in ka) / n,
            sum(e.self_device_time_total for e in ka if "bwd" in e.key) / n)

copy = 4217e9
for r, c in [(131072, 128), (65536, 128), (524288, 128), (65536, 256), (32768, 1024), (8192, 4096), (16384, 8192)]:
    x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16); dy = torch.randn_like(x)
    w = torch.randn(c, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
    ref = None
    for pps in (2, 4, 8, 16, 32):
        _norm.CUDA_PROGRAMS_PER_SM = pps; _norm.plan_rows.cache_clear()
        tiles = _norm.plan_rows("cuda", r, c, R.BACKWARD_MEMORY_MULTIPLIER, True)
        f = lambda: R.rms_norm_backward(dy, x, w, 1e-6, 0.0, "llama")
        dx, dw = f()
        if ref is None: ref = (dx, dw.float())
        err = max((dx.float() - ref[0].float()).abs().max().item(), ((dw.float() - ref[1]).abs().max() / ref[1].abs().max()).item())
        tot, bwd = kern_us(f)
        lt, lb = kern_us(lambda: L.layer_norm_backward(dy, x, w, b, 1e-5))
        print(f"{r}x{c} pps {pps:2d} grid {tiles.grid:5d} R{tiles.block_rows} w{tiles.options}: rms bwd total {tot:7.1f} us "
              f"(kernel {bwd:7.1f}) {3 * r * c * 2 / (tot * 1e-6) / copy:.2f} of copy | layer_norm total {lt:7.1f} us "
              f"{3 * r * c * 2 / (lt * 1e-6) / copy:.2f} | diff vs pps2 {err:.1e}", flush=True)
