"""Why round twenty-one's CUDA-graph training step gained nothing over the plain compiled one (one H100: llama 106.9k
against 105.7k tokens/s, qwen3 104.6k against 104.7k; round eighteen, same card kind, same command, 120.8k and
117.6k; round nineteen's gemma 124.5k), with no change to the ops a training step runs in between.

From the repository root on a CUDA machine, liger-kernel importable:

    python benchmarks/results/round21/cudagraph_diag.py [FAMILY [VARIANT,...]]   (default gemma, the five below)

Runs train_step.py's worker (the same process the benchmark starts) for HF's and npu_liger's compiled steps with
and without CUDA graphs (npu_liger's CUDA-graph step both with Inductor launching our kernels, the default, and
with our ops opaque), with TORCH_LOGS=cudagraphs,perf_hints so that Inductor prints why it skips CUDA graphs for a
graph ("skipping cudagraphs due to ..."; it also counts those, ``cudagraph_skips`` in train_step's result), and
prints each variant's tokens/s, step times, skip count, the device time of its kernels per step against the wall
time of two profiled steps (near equal: the step is GPU-bound and CUDA graphs have nothing to take) and those
lines, after the environment variables that change how CUDA memory is allocated or what Inductor does (an
allocator other than the caching one makes Inductor skip every CUDA graph). A variant whose graphs are all skipped
runs at its plain compiled speed.
"""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from benchmarks.train_step import SIZES, run_worker, worker_result  # noqa: E402

FAMILY = sys.argv[1] if len(sys.argv) > 1 else "gemma"
NAMES = ("hf_compiled", "hf_compiled_cudagraphs", "npu_liger_compiled", "npu_liger_compiled_cudagraphs",
         "npu_liger_compiled_cudagraphs_opaque")
if len(sys.argv) > 2:
    NAMES = tuple(sys.argv[2].split(","))


def run(name: str, logs: str = "cudagraphs,perf_hints") -> None:
    job = dict(family=FAMILY, variant=name, size=SIZES["default"], device="cuda", dtype="bfloat16", warmup=2, steps=5,
               compile_backend="inductor", compile_scope="model", profile_steps=2)
    try:
        proc = run_worker(job, 150, dict(TORCH_LOGS=logs))
    except subprocess.TimeoutExpired:  # the next variants still run
        print(f"{name}: timed out after 150 s")
        return
    result = worker_result(proc)
    if "error" in result and logs != "perf_hints" and "TORCH_LOGS" in proc.stderr:  # a torch without that artifact
        return run(name, "perf_hints")
    if "error" in result:
        print(f"{name}: failed: {result['error']}")
        return
    steps = ", ".join(f"{ms:.1f}" for ms in result["step_ms_each"])
    print(f"{name}: {result['tokens_per_s']:,.0f} tokens/s, steps {steps} ms, peak {result['peak_gib']:.2f} GiB, "
          f"warm-up {result['warmup_s']:.1f} s, CUDA-graph skips {result.get('cudagraph_skips', '-')}, "
          f"loss {result['first_loss']:.5f} -> {result['last_loss']:.5f} after {result['warmup_steps'] + 5} steps")
    profile = result["profile"]
    if "error" in profile:
        print(f"    profile failed: {profile['error']}")
    else:
        print(f"    profiled: {profile['wall_ms_per_step']} ms per step wall, {profile['kernel_ms_per_step']} ms of "
              "kernels (a step near its kernels' time is GPU-bound)")
    hints = [line for line in proc.stderr.splitlines() if "cudagraph" in line.lower()]
    for line in hints[:12]:
        print("   ", line[:300])
    if len(hints) > 12:
        print(f"    ... {len(hints) - 12} more")


if __name__ == "__main__":
    for key in sorted(os.environ):
        if key.startswith(("PYTORCH_", "TORCH", "CUDA_", "NPU_LIGER_")):
            print(f"{key}={os.environ[key]}")
    for variant in NAMES:
        run(variant)
