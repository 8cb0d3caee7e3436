import time, torch
from triton.testing import do_bench
import npu_liger
from npu_liger.npu_ops import _norm, rms_norm as rk, layer_norm as lk, embedding as ek
dev = "cuda"
print("rms bwd plan", _norm.plan_rows("cuda", 16384, 8192, rk.BACKWARD_MEMORY_MULTIPLIER, True))
print("rms fwd plan", _norm.plan_rows("cuda", 16384, 8192, rk.FORWARD_MEMORY_MULTIPLIER, False, rk.CUDA_FORWARD_WIDE_ROWS) if hasattr(rk, "FORWARD_MEMORY_MULTIPLIER") else "")
def bench_norm(name, fn, shape, n_w=1):
    x = torch.randn(*shape, device=dev, dtype=torch.bfloat16, requires_grad=True)
    ws = [torch.randn(shape[-1], device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(n_w)]
    dy = torch.randn_like(x)
    y = fn(x, *ws)
    def fwd():
        return fn(x, *ws)
    def fb():
        y = fn(x, *ws)
        torch.autograd.grad(y, [x, *ws], dy)
    def bwd_only():
        torch.autograd.grad(y, [x, *ws], dy, retain_graph=True)
    t_f, t_fb, t_b = do_bench(fwd), do_bench(fb), do_bench(bwd_only)
    # host time per f+b call (no sync inside)
    torch.cuda.synchronize(); t0 = time.perf_counter(); n = 50
    for _ in range(n): fb()
    host = (time.perf_counter() - t0) / n * 1e3; torch.cuda.synchronize()
    print(f"{name} {shape}: fwd {t_f:.4f} ms  f+b {t_fb:.4f} ms  bwd-only {t_b:.4f} ms  host-enqueue f+b {host:.4f} ms")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3): fb()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
bench_norm("rms", lambda x, w: npu_liger.rms_norm(x, w), (16384, 8192))
bench_norm("rms", lambda x, w: npu_liger.rms_norm(x, w), (8192, 4096))
bench_norm("ln", lambda x, w, b: npu_liger.layer_norm(x, w, b), (16384, 8192), 2)
# embedding: device-flag check (new) vs the min/max check (old), same process
w = torch.randn(128256, 4096, device=dev, dtype=torch.bfloat16)
new_flag = ek.index_check_flag
for tokens in (16, 1024, 4096, 8192, 16384):
    idx = torch.randint(0, 128256, (tokens,), device=dev)
    row = []
    for label, flag_fn in (("new", new_flag), ("old", lambda d: None)):
        ek.index_check_flag = flag_fn
        f = lambda: npu_liger.embedding(w, idx)
        f(); torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(200): f()
        host = (time.perf_counter() - t0) / 200 * 1e6; torch.cuda.synchronize()
        row.append(f"{label}: do_bench {do_bench(f) * 1e3:.1f} us, host {host:.1f} us")
    ek.index_check_flag = new_flag
    print("embedding", tokens, " | ".join(row))
