"""Round seventeen's probe (run from the repository root on a CUDA machine:
``python benchmarks/results/round17/tvd_teacher.py``): TVD forward+backward where only p (the student) needs a
gradient, as in distillation, at the harness shape (8192 x 32000 fp32, batchmean). Whole-call do_bench medians,
the variants interleaved over 3 rounds; GB/s of the minimal bytes of this case (read p and q, write grad_p: 3N)."""
import statistics

import torch
import triton

import npu_liger
from benchmarks import reference

ROWS, COLS = 8192, 32000


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = torch.softmax(torch.randn(ROWS, COLS, device="cuda", generator=gen), -1).requires_grad_(True)
    q = torch.softmax(torch.randn(ROWS, COLS, device="cuda", generator=gen), -1)  # the teacher: no grad
    variants = {
        "npu_liger": lambda: npu_liger.tvd(p, q),
        "eager": lambda: reference.tvd_batchmean(p, q),
        "torch.compile": torch.compile(lambda: reference.tvd_batchmean(p, q)),
    }
    try:
        from liger_kernel.ops.tvd import LigerTVDLossFunction
        variants["liger"] = lambda: LigerTVDLossFunction.apply(p, q, None, "batchmean", -100)
    except ImportError as e:
        print(f"liger unavailable: {e}")
    expected = None
    for name, fn in variants.items():  # check the gradients first (and warm up / compile)
        p.grad = None
        fn().backward()
        if expected is None:
            expected = p.grad.clone()
        print(f"{name:14s} max |grad_p - npu_liger's| = {(p.grad - expected).abs().max().item():.1e}")

    def fb(fn):
        def run():
            p.grad = None
            fn().backward()
        return run

    times = {name: [] for name in variants}
    for _ in range(3):
        for name, fn in variants.items():
            times[name].append(triton.testing.do_bench(fb(fn), warmup=25, rep=100))
    minimal = 3 * ROWS * COLS * 4
    print(f"tvd f+b, q needs no grad, {ROWS}x{COLS} fp32, {torch.cuda.get_device_name()}")
    for name, ms in times.items():
        median = statistics.median(ms)
        print(f"{name:14s} {median:.4f} ms  {minimal / median / 1e6:6.0f} GB/s  rounds {min(ms):.4f}-{max(ms):.4f}")


if __name__ == "__main__":
    main()
