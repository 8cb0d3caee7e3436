"""Round twenty-five's CPU probe (no GPU was lent): the host cost of one forward+backward that is Python, ours next
to Liger-Kernel's, with every Triton launch a no-op (``benchmarks.host_overhead``'s ``faked_launches``) and the
CPU path's own extras kept out (the emulated chip is read once, not from the environment per launch). What is
left is each package's Python per call (entry, checks, allocations, plans, autograd node, the ATen ops around its
kernels) plus the ``torch.autograd.grad`` floor both pay, on the harness's tiny shapes. Neither the direct launch
(ours) nor Triton's own launch path (Liger's) is in it. Run from the repository root with liger-kernel importable:

    python -m pip install --no-deps --target /tmp/site .whl/liger_kernel-0.8.5-py3-none-any.whl
    TRITON_INTERPRET=1 PYTHONPATH=.:/tmp/site python benchmarks/results/round25/host_vs_liger_cpu.py
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

from benchmarks import liger  # noqa: E402
from benchmarks.host_overhead import faked_launches  # noqa: E402
from benchmarks.measure import _gen, _per_call_us, forward_backward  # noqa: E402
from benchmarks.specs import SPECS  # noqa: E402
from npu_liger.tiling import chips, launch  # noqa: E402

OPS = ("swiglu,embedding,rope,qwen2vl_mrope,llama4_rope,rms_norm,layer_norm,softmax,dyt,poly_norm,kl_div,jsd,"
       "tvd").split(",")


def floor_us() -> float:
    """torch.autograd.grad through a Python autograd.Function that only allocates: what every variant pays."""
    class Allocate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, g):
            return torch.empty_like(g)

    x = torch.randn(4, 64, requires_grad=True)
    g = torch.randn(4, 64)
    return best_us(lambda: torch.autograd.grad(Allocate.apply(x), (x,), (g,)))


def best_us(fn) -> float:
    """µs per call, the best of 5 x 1000 calls (the harness's host-cost timer, on the CPU)."""
    return _per_call_us(fn, "cpu", 1000, 5)


def main() -> None:
    chip = chips.emulated_chip()
    launch.emulated_chip = lambda: chip  # the CPU path reads it from the environment on every launch
    print(f"host µs per forward+backward on this CPU, launches faked; floor (autograd.grad + an allocating "
          f"Function): {floor_us():.1f} µs")
    print("| op | shape | npu_liger | Liger-Kernel | eager formula | npu_liger - Liger |")
    print("|---|---|---|---|---|---|")
    with faked_launches():
        for op in sys.argv[1].split(",") if len(sys.argv) > 1 else OPS:
            spec = SPECS[op]
            case = spec.cases("tiny")[0]
            inp = spec.make(case.params, case.dtype, "cpu", _gen("cpu", 7))
            cells = {}
            for name, make in (("npu_liger", lambda: spec.npu_variant("functional")),
                               ("liger", lambda: liger.variant(op)), ("eager", spec.eager_variant)):
                try:
                    fn = make()
                    cells[name] = best_us(lambda fn=fn: forward_backward(fn, inp))
                except Exception as exc:  # Liger's CPU path needs a driver for some ops
                    cells[name] = f"{type(exc).__name__}"
            ours, theirs = cells["npu_liger"], cells["liger"]
            diff = f"{ours - theirs:+.1f}" if isinstance(theirs, float) else "-"
            fmt = [f"{v:.1f}" if isinstance(v, float) else v for v in (ours, theirs, cells["eager"])]
            print(f"| {op} | {case.label} | {' | '.join(fmt)} | {diff} |")


if __name__ == "__main__":
    main()
