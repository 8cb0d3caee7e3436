#!/usr/bin/env python
"""FSDP2 training-step throughput: the Llama-style HF model of ``train_step.py`` sharded over N ranks, plain
transformers vs npu_liger's full patch vs Liger-Kernel's full patch.

    python benchmarks/fsdp_throughput.py                         # 2 GPUs (NCCL), bf16 compute
    python benchmarks/fsdp_throughput.py --nproc 4 --quick
    python benchmarks/fsdp_throughput.py --device cpu --smoke    # 2 processes on the CPU (gloo), tiny model

One command: for each variant the script starts ``torchrun`` (``python -m torch.distributed.run``) itself, so
every variant gets fresh processes (Liger patches transformers for the whole process; fresh processes also give
clean peak-memory counts). Models, variants and batches come from ``train_step.py`` (``build_model``,
``VARIANTS``, ``make_batches``): the same seed everywhere, each rank training on its own batch of
``batch x seq`` tokens. Each decoder layer and the root are wrapped with ``fully_shard``: fp32 sharded
parameters, bf16 compute (``MixedPrecisionPolicy``), fp32 gradient reduction; fused AdamW on GPUs.
tokens/s counts the tokens of every rank; peak memory is ``max_memory_allocated`` of each rank (the largest is
reported). Outputs fsdp.md / fsdp.json in ``benchmarks/output/fsdp`` (untracked) or, with ``--publish``,
``benchmarks/results/fsdp``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # run from a checkout: npu_liger and benchmarks.train_step without installing

from benchmarks import train_step  # noqa: E402

OUTPUT = os.path.join(REPO, "benchmarks", "output", "fsdp")
PUBLISHED = os.path.join(REPO, "benchmarks", "results", "fsdp")
DEFAULT_VARIANTS = ("hf_eager", "npu_liger", "liger_full")


# ---------------------------------------------------------------------------------------------------------------
# One variant on every rank (under torchrun)


def _setup(device_type: str):
    if device_type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (through npu_liger)
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if device_type == "npu":
        import torch_npu  # noqa: F401

        torch.npu.set_device(local_rank)
    dist.init_process_group({"cuda": "nccl", "cpu": "gloo", "npu": "hccl"}[device_type])
    return torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")


def shard(model, compute_dtype):
    """FSDP2: every decoder layer, then the root (embedding, final norm, lm_head)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def run_variant(job: dict) -> dict:
    device = _setup(job["device"])
    import torch
    import torch.distributed as dist

    if device.type == "cpu":
        torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    variant, size = train_step.VARIANTS[job["variant"]], job["size"]
    model, note = train_step.build_model(job["family"], size, variant, device, torch.float32)
    model = shard(model, getattr(torch, job["dtype"]))
    batches = train_step.make_batches(size, 4, device, seed=1 + rank)  # each rank its own data
    step = train_step.training_step(model, model, batches, device)

    first_loss = step(0)
    for i in range(1, job["warmup"]):
        step(i)
    train_step.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for i in range(job["steps"]):
        loss = step(job["warmup"] + i)
    train_step.synchronize(device)
    dist.barrier()
    elapsed = time.perf_counter() - start
    # the mean loss over ranks, and the largest peak of any rank
    stats = torch.stack([first_loss.float(), loss.float()]).to(device)
    dist.all_reduce(stats)
    peak = train_step.peak_gib(device)
    peak_t = torch.tensor([peak if peak is not None else -1.0], device=device)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    tokens = job["steps"] * size["batch"] * size["seq"] * world
    result = dict(device=device.type, ranks=world, tokens_per_s=tokens / elapsed,
                  step_ms=elapsed / job["steps"] * 1e3, peak_gib_per_rank=peak_t.item() if peak is not None else None,
                  first_loss=stats[0].item() / world, last_loss=stats[1].item() / world, note=note)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    # Free the model and optimizer (FSDP2 state holding the process group) before destroying the group: left to
    # interpreter exit, their teardown aborted gloo ranks now and then (examples/fsdp_train.py says more).
    del model, step, batches
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return result


# ---------------------------------------------------------------------------------------------------------------
# The driver


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu", "npu"))
    p.add_argument("--nproc", type=int, default=2, help="ranks (GPUs, or CPU processes)")
    p.add_argument("--family", default="llama", choices=list(train_step.FAMILIES))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help="comma-separated, from train_step.py's eager variants")
    p.add_argument("--quick", action="store_true", help="2 warm-up + 5 timed steps")
    p.add_argument("--smoke", action="store_true", help="tiny model, fp32, 1 warm-up + 2 timed steps (CPU test)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10)")
    p.add_argument("--batch", type=int, default=None, help="sequences per rank (default: train_step's, 4)")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="compute dtype (default bfloat16; float32 with --smoke)")
    p.add_argument("--timeout-s", type=float, default=600, help="per variant")
    p.add_argument("--out", default=None, help=f"output folder (default {os.path.relpath(OUTPUT, REPO)})")
    p.add_argument("--publish", action="store_true", help=f"write to {os.path.relpath(PUBLISHED, REPO)}")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    eager = [name for name, v in train_step.VARIANTS.items() if not v.compiled]
    unknown = [v for v in args.variants if v not in eager]
    if unknown:
        p.error(f"unknown variant {unknown}; expected some of {eager}")
    warmup, steps = (1, 2) if args.smoke else (2, 5) if args.quick else (3, 10)
    args.warmup = max(1, args.warmup if args.warmup is not None else warmup)
    args.steps = max(1, args.steps if args.steps is not None else steps)
    args.dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
    args.size = dict(train_step.SIZES["smoke" if args.smoke else "default"])
    if args.batch is not None:
        args.size["batch"] = args.batch
    args.out = args.out or (PUBLISHED if args.publish else OUTPUT)
    return args


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(job: dict, nproc: int, timeout_s: float) -> dict:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",  # NVLink multicast off
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    if job["device"] == "cpu":
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), os.path.abspath(__file__),
           "--worker", json.dumps(job)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()][-8:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def markdown(meta, rows) -> str:
    size = meta["size"]
    lines = [
        f"FSDP2, {meta['date']}, {meta['ranks']} x {meta.get('device_name', meta['device'])}: torch "
        f"{meta['torch']}, transformers {meta['transformers']}, liger-kernel {meta['liger_kernel']}.",
        f"Command: `{meta['command']}`. {meta['family']}-style model: {size['layers']} layers, hidden "
        f"{size['hidden']}, intermediate {size['intermediate']}, {size['heads']}/{size['kv_heads']} heads of "
        f"{size['head_dim']}, vocab {size['vocab']}; {size['batch']}x{size['seq']} tokens per rank and step; fp32 "
        f"sharded parameters, {meta['dtype']} compute, fp32 reduction; {meta['warmup']} warm-up + "
        f"{meta['steps']} timed steps.",
        "",
        "| variant | tokens/s (all ranks) | vs HF eager | ms/step | peak GiB per rank | first loss | note |",
        "|---|---|---|---|---|---|---|",
    ]
    base = next((r for r in rows if r["variant"] == "hf_eager" and "tokens_per_s" in r), None)
    for row in rows:
        if "tokens_per_s" not in row:
            lines.append(f"| {row['variant']} | | | | | | {row.get('skipped') or 'FAILED: ' + row['error'][:300]} |")
            continue
        ratio = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""
        peak = "" if row["peak_gib_per_rank"] is None else f"{row['peak_gib_per_rank']:.2f}"
        lines.append(f"| {row['variant']} | {row['tokens_per_s']:,.0f} | {ratio} | {row['step_ms']:.1f} | {peak} | "
                     f"{row['first_loss']:.4f} | {row['note'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    meta = dict(train_step.environment(argparse.Namespace(device=args.device, dtype=args.dtype, warmup=args.warmup,
                                                          steps=args.steps, compile_backend=None, smoke=args.smoke)),
                command="python benchmarks/fsdp_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
                ranks=args.nproc, family=args.family, size=args.size)
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < args.nproc:
            print(f"needs {args.nproc} CUDA devices, found {torch.cuda.device_count()}", file=sys.stderr)
            return 2
    rows = []
    for name in args.variants:
        row = dict(variant=name)
        if train_step.VARIANTS[name].liger is not None and meta["liger_kernel"] is None:
            row["skipped"] = "liger_kernel is not installed"
        else:
            job = dict(family=args.family, variant=name, size=args.size, device=args.device, dtype=args.dtype,
                       warmup=args.warmup, steps=args.steps)
            row.update(launch(job, args.nproc, args.timeout_s))
        rows.append(row)
        if "tokens_per_s" in row:
            peak = "" if row["peak_gib_per_rank"] is None else f"  peak {row['peak_gib_per_rank']:.2f} GiB/rank"
            print(f"{name:>19}: {row['tokens_per_s']:12,.0f} tokens/s  {row['step_ms']:9.2f} ms/step{peak}  "
                  f"first loss {row['first_loss']:.5f}", flush=True)
        else:
            print(f"{name:>19}: {row.get('skipped') or 'FAILED: ' + row['error']}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fsdp.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "fsdp.md"), "w") as f:
            f.write(markdown(meta, rows))
    print(f"wrote {args.out}/fsdp.{{md,json}}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_variant(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
