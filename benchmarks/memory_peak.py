"""What is allocated at a training step's memory peak, and where it was allocated (CUDA).

    python benchmarks/memory_peak.py --families qwen3_moe --variants npu_liger,liger_full

For each (family, variant), in its own process as in ``train_step.py`` (same models, batches and optimizer): two
warm-up steps, then one step under ``torch.cuda.memory._record_memory_history``. The recorded allocation events
are replayed to find the moment of the step's peak; the tensors alive then that the step itself allocated are
listed by the frame that allocated them (the innermost frame in npu_liger, Liger-Kernel, transformers or the
benchmark; torch's own frames otherwise), largest first. Memory held from before the step (parameters,
optimizer state, gradients kept across steps) is one line, "held before the step".

Output: one markdown table per variant on stdout and in ``--out`` (default benchmarks/output/memory_peak.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from typing import Dict, Iterable, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Frames worth naming, innermost first: our package, the peer, the model code, the benchmark.
INTERESTING = ("npu_liger/", "liger_kernel/", "transformers/", "benchmarks/")


def peak_allocations(events: Iterable[dict]) -> Tuple[int, List[dict]]:
    """Replay allocation events (``{"action": "alloc"|"free_completed", "addr", "size", "frames"}``, in order;
    other actions ignored) and return (the peak of the bytes allocated during the events, the allocations
    alive at that peak). A free of an address allocated before the events lowers the running total below zero:
    that memory was held before, and the peak is measured from the start."""
    live: Dict[int, dict] = {}
    total = peak = 0
    at_peak: List[dict] = []
    for event in events:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif event["action"] == "free_completed":
            freed = live.pop(event["addr"], None)
            total -= event["size"] if freed is None else freed["size"]
    return peak, at_peak


def allocation_site(frames: List[dict]) -> str:
    """``file:line function`` of the innermost interesting frame (else the innermost Python frame)."""
    python = [f for f in frames if f.get("filename", "").endswith(".py")]
    chosen = next((f for f in python if any(part in f["filename"] for part in INTERESTING)),
                  python[0] if python else None)
    if chosen is None:
        return "(no Python frame)"
    name = chosen["filename"]
    for part in INTERESTING:
        if part in name:
            name = part + name.split(part, 1)[1]
            break
    return f"{name}:{chosen['line']} {chosen['name']}"


def by_site(allocations: Iterable[dict]) -> List[Tuple[str, int, int]]:
    """(site, bytes, count), largest first."""
    sizes, counts = defaultdict(int), defaultdict(int)
    for a in allocations:
        site = allocation_site(a.get("frames", []))
        sizes[site] += a["size"]
        counts[site] += 1
    return sorted(((s, sizes[s], counts[s]) for s in sizes), key=lambda r: -r[1])


def measure(job: dict) -> dict:
    """In the worker process: build, warm up, record one step; the peak's breakdown."""
    import torch

    from benchmarks.train_step import SIZES, VARIANTS, build_model, make_batches, training_step

    device = torch.device("cuda")
    size, variant = SIZES["default"], VARIANTS[job["variant"]]
    model, note = build_model(job["family"], size, variant, device, torch.bfloat16)
    run = torch.compile(model) if variant.compiled else model
    step = training_step(run, model, make_batches(size, 4, device), device)
    for i in range(2):
        step(i)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    step(2)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    peak, alive = peak_allocations(events)
    return dict(family=job["family"], variant=job["variant"], note=note, held_gib=held / 2**30,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30, step_peak_gib=(held + peak) / 2**30,
                sites=[(s, b / 2**30, n) for s, b, n in by_site(alive)])


def markdown(result: dict, top: int) -> str:
    if "error" in result:
        return f"## {result['family']} {result['variant']}: {result['error']}\n"
    lines = [f"## {result['family']} {result['variant']}: peak {result['peak_gib']:.2f} GiB "
             f"(replayed {result['step_peak_gib']:.2f})", "", result["note"], "",
             "| allocated at | GiB | tensors |", "|---|---|---|",
             f"| held before the step | {result['held_gib']:.3f} | |"]
    lines += [f"| `{site}` | {gib:.3f} | {n} |" for site, gib, n in result["sites"][:top]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="qwen3_moe")
    p.add_argument("--variants", default="npu_liger,liger_full")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--timeout-s", type=float, default=300)
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "output", "memory_peak.md"))
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return 0
    parts = []
    for family in args.families.split(","):
        for variant in args.variants.split(","):
            job = json.dumps(dict(family=family, variant=variant))
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", job], cwd=REPO,
                                      capture_output=True, text=True, timeout=args.timeout_s)
                lines = proc.stdout.strip().splitlines()
                result = (json.loads(lines[-1]) if proc.returncode == 0 and lines else
                          dict(error=f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"))
            except subprocess.TimeoutExpired:
                result = dict(error=f"timed out after {args.timeout_s:.0f} s")
            result.update(family=family, variant=variant)
            parts.append(markdown(result, args.top))
            print(parts[-1], flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
