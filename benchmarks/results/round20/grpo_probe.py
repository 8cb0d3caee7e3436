"""Round twenty's grpo_loss probe (from the repository root on a CUDA machine, liger-kernel importable:
PYTHONPATH=. python benchmarks/results/round20/grpo_probe.py; --cpu: a smoke test under the Triton interpreter).

The harness row grpo_loss B8 L1024 V128256 bf16 (``benchmarks/specs.py``: ~25% of the tokens masked, dapo, beta
0.04), forward+backward as the harness calls it (torch.autograd.grad of the public function), under the kernel's
walk switches of ``npu_liger/npu_ops/grpo_loss.py`` (CUDA_PREFETCH, REVERSE_GRAD_PASS), its gradient tile
(CUDA_GRAD_BLOCK / CUDA_GRAD_WARPS), each set for one variant and restored, against
Liger-Kernel. ``VARIANTS_FIRST`` is what the first H200 call ran (``round20/call2/grpo_probe.txt``); two of its
knobs, streaming gradient stores (CUDA_STREAM_GRAD) and the gradient as a kernel of its own (CUDA_SPLIT_GRAD and its
tile), measured no gain and were removed from the kernel; so was num_stages (CUDA_STAGES) after the second set,
``VARIANTS_SECOND``. ``VARIANTS`` (the default and Liger-Kernel's 16 warps) runs now.
Printed per variant: do_bench median ms of the whole call, the summed kernel time per call (torch.profiler), and
whether the gradient is bitwise equal to the first variant's (none of the switches changes any arithmetic). Then
the loss alone (forward under no_grad) with and without the prefetch, on the loss-only tile (CUDA_BLOCK/WARPS).
"""
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from benchmarks import liger, measure  # noqa: E402
from benchmarks.specs import SPECS  # noqa: E402
from npu_liger.npu_ops import grpo_loss as G  # noqa: E402

DEV = "cpu" if CPU else "cuda"
T0 = time.time()
SPEC = SPECS["grpo_loss"]
PARAMS = dict(B=2, L=5, V=300) if CPU else dict(SPEC.main[0])
KNOBS = ("CUDA_PREFETCH", "REVERSE_GRAD_PASS", "CUDA_STREAM_GRAD", "CUDA_GRAD_BLOCK", "CUDA_GRAD_WARPS",
         "CUDA_BLOCK", "CUDA_WARPS", "CUDA_SPLIT_GRAD", "CUDA_SPLIT_GRAD_BLOCK", "CUDA_SPLIT_GRAD_WARPS", "CUDA_STAGES",
         "CUDA_SPLIT_GRAD_STAGES")


def bench(fn):
    if CPU:
        fn()
        return float("nan")
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def kernel_ms(fn):
    return float("nan") if CPU else measure.kernel_ms(fn)


def with_knobs(knobs, body):
    missing = [k for k in knobs if not hasattr(G, k)]
    if missing:
        raise AttributeError(f"grpo_loss has no knob {', '.join(missing)} (removed after the first call)")
    saved = {k: getattr(G, k) for k in KNOBS if hasattr(G, k)}
    try:
        for k, v in knobs.items():
            setattr(G, k, v)
        G._plan.cache_clear() if hasattr(G._plan, "cache_clear") else None
        return body()
    finally:
        for k, v in saved.items():
            setattr(G, k, v)
        G._plan.cache_clear() if hasattr(G._plan, "cache_clear") else None


def on(prefetch=False, reverse=False, stream=False, block=8192, warps=8):
    return dict(CUDA_PREFETCH=prefetch, REVERSE_GRAD_PASS=reverse, CUDA_STREAM_GRAD=stream, CUDA_GRAD_BLOCK=block,
                CUDA_GRAD_WARPS=warps, CUDA_SPLIT_GRAD=False)


def split(prefetch=False, stream=False, block=4096, warps=16, reverse=False):
    """The gradient as a kernel of its own (after the loss kernel on its own tile, CUDA_BLOCK/CUDA_WARPS)."""
    return dict(CUDA_PREFETCH=prefetch, REVERSE_GRAD_PASS=reverse, CUDA_STREAM_GRAD=stream, CUDA_SPLIT_GRAD=True,
                CUDA_SPLIT_GRAD_BLOCK=block, CUDA_SPLIT_GRAD_WARPS=warps)


VARIANTS_FIRST = {
    "base 8192/8": on(),
    "prefetch": on(prefetch=True),
    "reverse": on(reverse=True),
    "stream": on(stream=True),
    "prefetch+reverse": on(prefetch=True, reverse=True),
    "prefetch+stream": on(prefetch=True, stream=True),
    "reverse+stream": on(reverse=True, stream=True),
    "all three": on(True, True, True),
    "all three 4096/8": on(True, True, True, 4096, 8),
    "all three 4096/4": on(True, True, True, 4096, 4),
    "all three 16384/16": on(True, True, True, 16384, 16),
    "prefetch+reverse 4096/8": on(True, True, False, 4096, 8),
    "base 4096/8": on(block=4096),
    "split 4096/16": split(),
    "split 4096/16 prefetch": split(prefetch=True),
    "split 4096/16 stream": split(stream=True),
    "split 4096/16 prefetch+stream": split(prefetch=True, stream=True),
    "split 4096/8": split(warps=8),
    "split 8192/16": split(block=8192),
    "split 2048/8 prefetch": split(prefetch=True, block=2048, warps=8),
    "split 4096/16 reverse": split(reverse=True),
}
# The second set (after the first set the defaults to prefetch + reverse on 4096 x 8): num_stages, and Liger-Kernel's
# backward launch (16 warps, 1 stage) on the fused kernel. Ran in round twenty-one (``round21/call2/grpo_probe2.txt``,
# an H100): num_stages changed nothing, and its knob (CUDA_STAGES) was removed, so this set stops with that message.
VARIANTS_SECOND = {
    "default (prefetch+reverse 4096/8)": {},
    "default, 1 stage": dict(CUDA_STAGES=1),
    "default, 2 stages": dict(CUDA_STAGES=2),
    "default, 4 stages": dict(CUDA_STAGES=4),
    "reverse 4096/8, 1 stage": dict(CUDA_PREFETCH=False, CUDA_STAGES=1),
    "default 4096/16, 1 stage": dict(CUDA_GRAD_WARPS=16, CUDA_STAGES=1),
}
VARIANTS = {
    "default (prefetch+reverse 4096/8)": {},
    "default 4096/16": dict(CUDA_GRAD_WARPS=16),
}


def main():
    inp = SPEC.make(PARAMS, SPEC.dtype, DEV, measure._gen(DEV, 7))
    fn = SPEC.npu_variant()
    print(f"grpo_loss {PARAMS} {SPEC.dtype} on {torch.cuda.get_device_name() if not CPU else 'cpu'}; "
          f"the plan's memo: {hasattr(G._plan, 'cache_clear')}")

    def fb():
        return torch.autograd.grad(fn(*inp.args), inp.leaves, inp.grads_out, allow_unused=True)

    first = None
    for name, knobs in VARIANTS.items():
        def run():
            grads = fb()
            return bench(fb), kernel_ms(fb), grads[0]

        try:
            wall, kern, grad = with_knobs(knobs, run)
            same = "first" if first is None else ("bitwise equal" if torch.equal(grad, first) else
                                                  f"DIFFERS max {(grad.float() - first.float()).abs().max().item():.2e}")
            first = grad if first is None else first
            print(f"f+b {name:<26} wall {wall:.4f} ms  kernels {kern:.4f} ms  grad {same}", flush=True)
        except Exception as exc:
            print(f"f+b {name:<26} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
    if not CPU:
        lfn = liger.variant("grpo_loss")

        def lfb():
            return torch.autograd.grad(lfn(*inp.args), inp.leaves, inp.grads_out, allow_unused=True)

        # (Liger writes its gradient into its copy of the logits, which the timed calls then overwrite: its gradient
        # is compared once, before them)
        lgrad_diff = (lfb()[0].float() - first.float()).abs().max().item()
        print(f"f+b {'liger':<26} wall {bench(lfb):.4f} ms  kernels {kernel_ms(lfb):.4f} ms  grad max diff to "
              f"ours {lgrad_diff:.2e}", flush=True)

        def lfwd():
            with torch.no_grad():
                lfn(*inp.args)
        print(f"fwd {'liger':<26} wall {bench(lfwd):.4f} ms  kernels {kernel_ms(lfwd):.4f} ms")

    def fwd():
        with torch.no_grad():
            fn(*inp.args)

    for name, knobs in {"loss only 8192/4": {}, "loss only 8192/4 prefetch": dict(CUDA_PREFETCH=True),
                        "loss only 4096/4 prefetch": dict(CUDA_PREFETCH=True, CUDA_BLOCK=4096),
                        "loss only 8192/8 prefetch": dict(CUDA_PREFETCH=True, CUDA_WARPS=8)}.items():
        wall, kern = with_knobs(knobs, lambda: (bench(fwd), kernel_ms(fwd)))
        print(f"fwd {name:<26} wall {wall:.4f} ms  kernels {kern:.4f} ms", flush=True)
    print(f"done in {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
