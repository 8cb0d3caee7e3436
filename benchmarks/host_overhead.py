"""Host cost per call: µs of one forward and one forward+backward on tiny tensors (where the GPU work is a few µs,
so the time is the host's), for the public function ``npu_liger.<op>``, the eager PyTorch formula of the same op
(``reference.py``, what the issue's target compares against) and Liger-Kernel when importable.

    python -m benchmarks.host_overhead [--ops swiglu,rope] [--iters 2000] [--profile swiglu] [--out FILE.json]

``--profile OP`` prints the cProfile top entries of each variant's forward+backward loop (where the µs go).
Runs on CPU too (the Triton interpreter: the numbers then measure the interpreter, not the launch path).
``--fake-launch`` (CPU only) turns every Triton launch into a no-op, so the npu_liger column is the package's own
Python per call (checks, allocation, plans, autograd) without any kernel: a host-cost measurement that needs no
GPU. Ops whose host code reads a kernel's output (cross_entropy's target flag) are skipped then.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sys

import torch

from . import liger, reference
from .measure import _gen, _per_call_us, forward_backward, sync
from .specs import SPECS


# Ops whose host code reads what a kernel wrote (the CPU target check reads the target-statistics flag), so a
# faked launch leaves it garbage.
READS_KERNEL_OUTPUT = ("cross_entropy", "fused_linear_cross_entropy")


@contextlib.contextmanager
def faked_launches():
    """Every launch of an interpreted Triton kernel (CPU) does nothing inside the block."""
    from triton.runtime import interpreter

    original = interpreter.InterpretedFunction.__getitem__
    interpreter.InterpretedFunction.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        interpreter.InterpretedFunction.__getitem__ = original


def _variants(spec, use_liger: bool):
    variants = {"npu_liger": spec.npu_variant("functional"), "eager": spec.eager_variant()}
    if use_liger and liger.variant(spec.name) is not None:
        variants["liger"] = liger.variant(spec.name)
    return variants


def measure(spec, device: str, iters: int, repeats: int, use_liger: bool) -> dict:
    case = spec.cases("tiny")[0]
    inp = spec.make(case.params, case.dtype, device, _gen(device, 7))
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in inp.args)
    row = {"op": spec.name, "shape": case.label}
    for name, fn in _variants(spec, use_liger).items():
        with torch.no_grad():
            row[f"{name}_fwd_us"] = _per_call_us(lambda: fn(*plain), device, iters, repeats)
        row[f"{name}_fb_us"] = _per_call_us(lambda: forward_backward(fn, inp), device, iters, repeats)
    return row


def profile(spec, device: str, iters: int, use_liger: bool) -> None:
    """cProfile of each variant's forward+backward loop (npu_liger, eager, Liger when importable): where the µs go,
    ours next to the peers'."""
    case = spec.cases("tiny")[0]
    inp = spec.make(case.params, case.dtype, device, _gen(device, 7))
    for name, fn in _variants(spec, use_liger).items():
        for _ in range(50):
            forward_backward(fn, inp)
        sync(device)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(iters):
            forward_backward(fn, inp)
        sync(device)
        prof.disable()
        print(f"--- cProfile: {name} {spec.name} forward+backward x {iters} (tottime, top 25) ---")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", default=",".join(SPECS))
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-liger", action="store_true")
    parser.add_argument("--profile", default="", help="comma-separated ops to cProfile")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    parser.add_argument("--fake-launch", action="store_true",
                        help="CPU: every Triton launch is a no-op (the package's own Python cost per call)")
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    if args.fake_launch:
        if args.device != "cpu":
            parser.error("--fake-launch replaces the Triton interpreter's launches: CPU only")
        ops = [op for op in ops if op not in READS_KERNEL_OUTPUT]
    reference.sources()  # resolve the HF formulas before Liger can patch transformers
    use_liger = args.device == "cuda" and not args.no_liger and liger.available()
    with faked_launches() if args.fake_launch else contextlib.nullcontext():
        rows = [measure(SPECS[op], args.device, args.iters, args.repeats, use_liger) for op in ops]
    names = ["npu_liger", "eager", "liger"]
    print(f"host µs per call on {args.device} (tiny tensors), forward / forward+backward")
    print("| op | shape | " + " | ".join(names) + " | npu_liger f+b / eager f+b |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for row in rows:
        cells = [f"{row[f'{n}_fwd_us']:.1f} / {row[f'{n}_fb_us']:.1f}" if f"{n}_fwd_us" in row else "-" for n in names]
        print(f"| {row['op']} | {row['shape']} | " + " | ".join(cells)
              + f" | {row['npu_liger_fb_us'] / row['eager_fb_us']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    with faked_launches() if args.fake_launch else contextlib.nullcontext():  # profile what was measured
        for op in filter(None, args.profile.split(",")):
            profile(SPECS[op], args.device, max(200, args.iters // 4), use_liger)


if __name__ == "__main__":
    main()
