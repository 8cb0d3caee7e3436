"""Round sixteen's A/B probe (run from a tree's root as ``python benchmarks/results/round16/ab_probe.py
rms_norm,layer_norm``, once per tree, alternating trees): the whole forward+backward call of npu_liger's public
function at every main harness shape of the given ops, timed as the harness times it (do_bench median, the L2
flushed between calls, a pool of 3 input sets), 5 times in a row; prints the median and the spread."""
import itertools
import statistics
import sys

import torch
import triton.testing

from benchmarks.measure import make_pool
from benchmarks.specs import SPECS


def main():
    for op in sys.argv[1].split(","):
        spec = SPECS[op]
        for case in spec.cases("main"):
            pool, fn = make_pool(case, "cuda", 3), spec.npu_variant("functional")
            cycle = itertools.cycle(pool)

            def fb():
                inp = next(cycle)
                torch.autograd.grad(fn(*inp.args), inp.leaves, inp.grads_out, allow_unused=True)

            times = [triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median") for _ in range(5)]
            print(f"{op:11s} {case.label:32s} f+b ms: median {statistics.median(times):.4f}, "
                  f"min {min(times):.4f}, max {max(times):.4f}")


if __name__ == "__main__":
    main()
