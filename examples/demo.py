"""npu-liger demo: a small Llama-style Hugging Face model, patched with npu_liger (MLPs -> swiglu, rotary ->
rope), compiled with torch.compile(fullgraph=True), trained on synthetic data next to the same model in plain
eager PyTorch (unpatched transformers).

Prints a line per phase and a progress bar per training run, then the backend, the npu_liger ops the compiled
model really ran (seen at the dispatcher), how each kernel was tiled (watched with
``npu_liger.tiling.record_plans()``), and both loss curves; saves a plot of them and of their relative
difference to examples/output/loss_curves.png. Exits non-zero if the two runs diverge.

Runs on the best device present: an Ascend NPU (torch_npu), a CUDA GPU, else the CPU through the Triton
interpreter with the launch geometry of an emulated Ascend chip. Force one with ``demo.py cpu|cuda|npu``.
"""

import contextlib
import copy
import math
import os
import sys
import threading
import time


def _pick_device() -> str:
    if len(sys.argv) > 1 and sys.argv[1] in ("cpu", "cuda", "npu"):
        return sys.argv[1]
    try:
        import torch_npu  # noqa: F401

        import torch

        if torch.npu.is_available():
            return "npu"
    except ImportError:
        pass
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE = _pick_device()
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported
if DEVICE == "npu":
    import torch_npu  # noqa: F401

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import npu_liger.transformers as nlt  # noqa: E402
from npu_liger.tiling import record_plans  # noqa: E402

try:
    from tqdm import tqdm  # comes with transformers
except ImportError:  # pragma: no cover - a plain line per step instead
    tqdm = None

# Small enough for the CPU interpreter (it runs the rope kernel one (batch, seq) row per program), large
# enough to learn something (a 32-token successor map, loss ~3.5 -> ~0.4 in 30 steps): 2 layers, GQA (4 query / 2
# key-value heads), head_dim 16.
CONFIG = dict(vocab_size=32, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, hidden_act="silu",
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
BATCH, SEQ, STEPS, LR = 4, 8, 30, 3e-3
# fp32 on both sides. The fused kernels agree with eager PyTorch to ~1e-7 relative per step; training
# amplifies differences (Adam normalises each update, so tiny gradient differences are not damped): measured
# <= 4e-7 over these 30 steps on CPU, ~4e-5 in a noisier run (lr 1e-2, 64 rows). 1e-3 of the loss is well
# above that and far below the ~3 the loss falls by, so a wrong gradient anywhere (which moves the curve by
# O(0.1) within a few steps) fails the check.
LOSS_RTOL = 1e-3
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "output", "loss_curves.png")


def synthetic_batches(steps: int, generator: torch.Generator) -> torch.Tensor:
    """Sequences counting up from a random start (tokens 3..vocab-1, wrapping; 0-2 are pad/bos/eos)."""
    vocab = CONFIG["vocab_size"]
    starts = torch.randint(3, vocab, (steps, BATCH, 1), generator=generator)
    return ((starts + torch.arange(SEQ)) % (vocab - 3) + 3).to(DEVICE)


STARTED = time.perf_counter()


def phase(message: str) -> None:
    """One line per phase, with the time since the start, printed at once (not buffered)."""
    print(f"[{time.perf_counter() - STARTED:6.1f}s] {message}", flush=True)


def train(step_fn, opt, data, desc, around=None):
    """Steps of ``opt`` on ``data`` with a progress bar; ``around`` maps a step index to a context manager to
    run that step in. Returns the losses and each step's wall time."""
    losses, times = [], []
    bar = tqdm(total=len(data), desc=desc, unit="step", dynamic_ncols=True) if tqdm else None
    stop = threading.Event()
    if bar:  # keep the elapsed time moving through a long step (the compiling one)
        threading.Thread(target=lambda: [bar.refresh() for _ in iter(lambda: stop.wait(1.0), True)],
                         daemon=True).start()
    for step, ids in enumerate(data):
        t0 = time.perf_counter()
        with (around or {}).get(step, contextlib.nullcontext()):
            loss = step_fn(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        if bar:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update()
        else:
            print(f"  {desc}: step {step + 1}/{len(data)} loss {losses[-1]:.3f}", flush=True)
    stop.set()
    if bar:
        bar.close()
    return losses, times


def describe_tiles(records):
    """How each kernel was tiled, in words: one line per (launcher, request) the compiled model made."""
    seen = {}
    for r in records:
        seen.setdefault((r.caller, r.request), r.plan)
    lines = []
    for (caller, request), plan in sorted(seen.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        launcher = caller.replace("npu_liger.npu_ops.", "")
        parts = []
        for shape, tile, dims in zip(request.shapes, plan.tiles, request.tiling_dims):
            tiled = (dims,) if isinstance(dims, int) else tuple(dims or ())
            loops = math.prod(math.ceil(shape[d] / tile[d]) for d in tiled if shape[d]) if tiled else 1
            parts.append(f"{'x'.join(map(str, shape))} in tiles of {'x'.join(map(str, tile))}"
                         f" ({loops} loop step{'s' if loops != 1 else ''})")
        grid = "" if plan.max_programs is None else f"; up to {plan.max_programs} programs"
        lines.append(f"  {launcher:40s} {', '.join(parts)}; {request.memory_multiplier:g} fp32 values live "
                     f"per element{grid}")
    return lines


def save_plot(ours, ref, diffs):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    fig, (ax, ax_diff) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 2))
    steps = range(1, len(ref) + 1)
    ax.plot(steps, ref, label="eager PyTorch (transformers, unpatched)", linewidth=3, alpha=0.5)
    ax.plot(steps, ours, "--", label="npu_liger patched, torch.compile(fullgraph=True)")
    ax.set_ylabel("training loss")
    ax.set_title(f"Llama-style model, {DEVICE}: npu_liger vs eager")
    ax.legend()
    # The curves overlap to the eye; the difference panel shows the scale of the disagreement.
    # A log scale has no 0: identical losses are drawn as triangles on a floor a decade below the rest.
    floor = min([d for d in diffs if d > 0] + [LOSS_RTOL]) / 10
    ax_diff.semilogy(steps, [d if d > 0 else float("nan") for d in diffs], "o-", markersize=3,
                     label="|npu_liger - eager| / |eager|")
    zeros = [step for step, d in zip(steps, diffs) if d == 0]
    if zeros:
        ax_diff.semilogy(zeros, [floor] * len(zeros), "v", color="gray", label="identical (difference 0)")
    ax_diff.axhline(LOSS_RTOL, color="red", linestyle=":", label=f"tolerance {LOSS_RTOL:.0e}")
    ax_diff.set_xlabel("step")
    ax_diff.set_ylabel("relative loss difference")
    ax_diff.legend(fontsize="small", loc="center right")
    fig.tight_layout()
    fig.savefig(OUTPUT, dpi=120)
    print(f"plot: {os.path.relpath(OUTPUT)}")


def main():
    phase(f"device {DEVICE}; building a {CONFIG['num_hidden_layers']}-layer Llama-style model twice (same weights)")
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(DEVICE)
    ours = copy.deepcopy(reference)  # same initial weights
    data = synthetic_batches(STEPS, torch.Generator().manual_seed(0))

    # The reference trains first: patching the rotary function is module-wide (every Llama in the process).
    phase(f"training the unpatched eager model, {STEPS} steps")
    ref_losses, ref_times = train(reference, torch.optim.AdamW(reference.parameters(), lr=LR), data, "eager PyTorch")

    phase(f"patching the copy with npu_liger: {nlt.patch_summary(nlt.apply_to_model(ours))}")
    compiled = torch.compile(ours, fullgraph=True)
    slow = " (the CPU runs Triton kernels in its interpreter: about a minute)" if DEVICE == "cpu" else ""
    phase(f"training it under torch.compile(fullgraph=True), {STEPS} steps; step 1 compiles{slow}")
    ops, opt = nlt.count_npu_liger_ops(compiled=True), torch.optim.AdamW(ours.parameters(), lr=LR)
    with record_plans() as records:  # every launch plan of step 1 (compile + first run)
        ours_losses, ours_times = train(compiled, opt, data[:1], "npu_liger (compiling)")
    # step 2 runs under the dispatcher's records (a profiler): which npu_liger ops the compiled graph called
    more_losses, more_times = train(compiled, opt, data[1:], "npu_liger", around={0: ops})
    ours_losses, ours_times = ours_losses + more_losses, ours_times + more_times
    timing = (f"eager reference {sum(ref_times):.1f}s for {STEPS} steps; npu_liger: compile + step 1 "
              f"{ours_times[0]:.1f}s, then {STEPS - 1} steps in {sum(ours_times[1:]):.1f}s")
    phase("done training; report:")
    print_report(records, ops.counts, ours_losses, ref_losses, timing, nlt.patch_summary(ours))


def print_report(records, ops, ours, ref, timing, summary):
    if not records or not ops:
        raise SystemExit("FAILED: the compiled model launched no npu_liger kernel")
    any_plan = records[0].plan
    if any_plan.backend == "cpu":
        where = (f"Triton interpreter, emulated {any_plan.chip} ({any_plan.ub_bytes:,} B UB, "
                 f"{any_plan.max_programs} vector cores)")
    elif any_plan.backend == "npu":
        where = f"triton-ascend on {any_plan.chip} ({any_plan.ub_bytes:,} B UB, {any_plan.max_programs} vector cores)"
    else:
        where = "compiled Triton (GPU launch policy)"
    print(f"device: {DEVICE}   backend: {any_plan.backend}   kernels: {where}")
    print(f"model: LlamaForCausalLM {CONFIG['num_hidden_layers']} layers, hidden {CONFIG['hidden_size']}, "
          f"batch {BATCH} x seq {SEQ}; patched: {summary}")
    print("npu_liger ops in one compiled training step (dispatcher records):")
    for name, count in sorted(ops.items()):
        print(f"  {name:32s} x{count}")
    print("How each kernel was tiled. A kernel launcher states the extent it works through (an elementwise op: all\n"
          "its elements; rope: heads x head_dim of one token) and how many fp32 values it keeps live per element;\n"
          "the launch policy (on Ascend: the UB manager, sizing tiles to fit the on-chip Unified Buffer) picks the\n"
          "tile, a power of two, and the kernel loops over the rest. Launcher, extent -> tile:")
    for line in describe_tiles(records):
        print(line)
    print(f"{'step':>4}  {'npu_liger (compiled)':>20}  {'eager PyTorch':>14}  {'rel diff':>9}")
    diffs = [abs(a - b) / abs(b) for a, b in zip(ours, ref)]
    for step, (a, b) in enumerate(zip(ours, ref)):
        if step % 3 == 0 or step == len(ours) - 1:
            print(f"{step + 1:4d}  {a:20.5f}  {b:14.5f}  {diffs[step]:9.2e}")
    print(f"time: {timing}")
    save_plot(ours, ref, diffs)
    worst = max(diffs)
    print(f"largest relative loss difference vs eager: {worst:.2e} (tolerance {LOSS_RTOL:.0e})")
    if worst > LOSS_RTOL or not ours[-1] < 0.5 * ours[0]:
        raise SystemExit("FAILED: the npu_liger model's training diverged from the eager reference (or did not learn)")
    print("OK: the compiled npu_liger model trains like the eager PyTorch model")


if __name__ == "__main__":
    main()
