#!/usr/bin/env python
"""Training-step benchmark: tokens/s and peak memory of whole HF transformers models, trained with and without
npu_liger (and Liger-Kernel, and torch.compile).

    python benchmarks/train_step.py                    # Llama-, Gemma- and Qwen3-style models, every variant
    python benchmarks/train_step.py --quick            # the same, fewer timed steps
    python benchmarks/train_step.py --families llama --variants hf_eager,npu_liger
    python benchmarks/train_step.py --device cpu --smoke   # tiny models on the CPU (Triton interpreter), seconds

Models are built from configs (no downloads), default size: 8 layers, hidden 2048, intermediate 8192, 16 query /
8 key-value heads of 128, vocab 128256; batches of 4 x 2048 tokens; bf16 parameters, fused AdamW. Variants:

    hf_eager            transformers as written
    npu_liger_same_ops  npu_liger.transformers.apply_to_model with only rotary + gated MLP (Liger's partial patch)
    liger_same_ops      Liger-Kernel's apply_liger_kernel_to_<family>, rotary + gated MLP only
    npu_liger           apply_to_model(model) with its defaults (npu_liger's full patch)
    liger_full          apply_liger_kernel_to_<family>() with its defaults (Liger's full patch)
    hf_compiled         torch.compile(model) of the unpatched model
    npu_liger_compiled  torch.compile(apply_to_model(model))
    hf_compiled_causal_mask        torch.compile of HF with npu_liger's causal_mask patch alone (no kernel of ours)
    npu_liger_compiled_launches    the same with NPU_LIGER_INDUCTOR_LAUNCHES=1 (Inductor launches our kernels)
    hf_compiled_cudagraphs         torch.compile(model, mode="reduce-overhead"): CUDA graphs
    npu_liger_compiled_cudagraphs  the same of apply_to_model(model) (Inductor launches our kernels: the default there)
    npu_liger_compiled_cudagraphs_opaque  the same with NPU_LIGER_INDUCTOR_LAUNCHES=0 (our ops opaque in the graphs)

Every variant runs in its own Python process (Liger patches transformers' modules for the whole process; a fresh
process also gives a clean peak-memory count), builds the model from the same seed and trains on the same
batches: the loss of the first step (before any update) must agree across variants, and is reported. Warm-up
steps (compilation included) are not timed; the timed steps end with a device synchronisation. Peak memory is
``torch.cuda.max_memory_allocated`` over the whole process (parameters, optimizer state and activations).
Liger rows are skipped, with a note, when ``liger_kernel`` is not importable.

Outputs: train_step.md (a table), train_step.json, train_step.png (tokens/s and peak GiB bars), in
``benchmarks/output/train_step`` (untracked) or, with ``--publish``, ``benchmarks/results/train_step``.
``benchmarks/fsdp_throughput.py`` builds the same models through ``build_model``.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(REPO, "benchmarks", "output", "train_step")
PUBLISHED = os.path.join(REPO, "benchmarks", "results", "train_step")

# Model and batch sizes. "default" is the Llama-style model; "smoke" is small enough for the Triton
# interpreter on two shared CPU cores.
SIZES = {
    # MoE families (a config with moe_intermediate_size): the MoE issue's Qwen3-MoE shape, 64 experts of 768, top-8
    "default": dict(layers=8, hidden=2048, intermediate=8192, heads=16, kv_heads=8, head_dim=128, vocab=128256,
                    batch=4, seq=2048, experts=64, top_k=8, moe_intermediate=768),
    "smoke": dict(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=256,
                  batch=2, seq=16, experts=8, top_k=2, moe_intermediate=32),
}


@dataclass(frozen=True)
class Family:
    config: str  # transformers config class
    model: str  # transformers causal-LM class
    liger_patch: str  # liger_kernel.transformers function
    extra: tuple = ()  # config overrides of the family (key, value) pairs


FAMILIES = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "apply_liger_kernel_to_llama"),
    # Gemma: GeGLU (gelu_pytorch_tanh), tied embeddings, its (1 + weight) RMSNorm; our sizes, not Gemma's
    "gemma": Family("GemmaConfig", "GemmaForCausalLM", "apply_liger_kernel_to_gemma",
                    (("hidden_act", "gelu_pytorch_tanh"),)),
    # Qwen3: SwiGLU with RMSNorm on q and k per head
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "apply_liger_kernel_to_qwen3"),
    # Qwen3-MoE: every layer sparse, 8 experts top-2 of a quarter of ``intermediate`` each (npu_liger.fused_moe)
    # Olmo-2: a new dense family (RMSNorm after attention and MLP, q/k norms over all heads)
    "olmo2": Family("Olmo2Config", "Olmo2ForCausalLM", "apply_liger_kernel_to_olmo2"),
    "qwen3_moe": Family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "apply_liger_kernel_to_qwen3_moe",
                        (("decoder_sparse_step", 1), ("norm_topk_prob", True))),
}


@dataclass(frozen=True)
class Variant:
    npu_liger: Optional[str] = None  # None, "same" (Liger's partial patch's ops), "full" (defaults), "causal_mask"
    liger: Optional[str] = None  # likewise for Liger-Kernel
    compiled: bool = False
    experts: Optional[str] = None  # transformers' experts_implementation (None: its default, grouped_mm where it can)
    compile_mode: Optional[str] = None  # torch.compile's mode (inductor only): "reduce-overhead" is CUDA graphs
    inductor_launches: Optional[str] = None  # NPU_LIGER_INDUCTOR_LAUNCHES in the worker (read at npu_liger's import)


VARIANTS = {
    "hf_eager": Variant(),
    "hf_experts_loop": Variant(experts="eager"),  # MoE families: transformers' per-expert Python loop
    "npu_liger_same_ops": Variant(npu_liger="same"),
    "liger_same_ops": Variant(liger="same"),
    "npu_liger": Variant(npu_liger="full"),
    "liger_full": Variant(liger="full"),
    "hf_compiled": Variant(compiled=True),
    "npu_liger_compiled": Variant(npu_liger="full", compiled=True),
    "hf_compiled_causal_mask": Variant(npu_liger="causal_mask", compiled=True),
    "npu_liger_compiled_launches": Variant(npu_liger="full", compiled=True, inductor_launches="1"),
    "hf_compiled_cudagraphs": Variant(compiled=True, compile_mode="reduce-overhead"),
    "npu_liger_compiled_cudagraphs": Variant(npu_liger="full", compiled=True, compile_mode="reduce-overhead"),
    "npu_liger_compiled_cudagraphs_opaque": Variant(npu_liger="full", compiled=True, compile_mode="reduce-overhead",
                                                    inductor_launches="0"),
}

SAME_OPS = {"rope", "mlp", "swiglu", "geglu"}  # what Liger's partial patch (and ours to match it) switch on


def patch_kwargs(patch_fn, which: str) -> dict:
    """Keyword arguments of a patch function (npu_liger's ``apply_to_model`` or Liger's ``apply_liger_kernel_to_*``)
    for ``which``: "full" is the function's own defaults; "same" turns on rotary and the gated MLP and every other
    boolean flag the installed version has (norms, losses, embedding, ...) off; "causal_mask" only npu_liger's
    causal-mask patch. Read from the signature, so flags added later (npu_liger's ``norm``/``loss``) are switched
    off here without editing this file."""
    if which == "full":
        return {}
    wanted = {"causal_mask"} if which == "causal_mask" else SAME_OPS
    params = inspect.signature(patch_fn).parameters.values()
    # npu_liger's ``embedding`` defaults to "compiled" (a mode, not a bool): it is a flag all the same
    return {p.name: p.name in wanted for p in params if isinstance(p.default, bool) or p.name == "embedding"}


def model_config(family: str, size: dict, experts_implementation: Optional[str] = None):
    import transformers

    fam = FAMILIES[family]
    config = getattr(transformers, fam.config)(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        head_dim=size["head_dim"], max_position_embeddings=max(size["seq"], 2048), attn_implementation="sdpa",
        **dict(fam.extra))
    config.use_cache = False  # training: no KV cache
    if hasattr(config, "moe_intermediate_size"):
        config.moe_intermediate_size = size["moe_intermediate"]
        config.num_experts, config.num_experts_per_tok = size["experts"], size["top_k"]
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    return config


def training_step(run, model, batches, device, cuda_graphs: bool = False):
    """``step(i)``: one optimisation step on batch ``i`` (cycled) -- forward with the inputs as labels (HF shifts
    them), backward, AdamW update -- returning the detached loss. ``run`` is the model or its compiled form.
    AdamW is fused where the device has it (the issue's setting); the foreach implementation elsewhere.
    ``cuda_graphs``: each step begins a new CUDA-graph step (the graphs' outputs of the last one may be reused)
    and the loss is copied out of the graph's memory."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type in ("cuda", "npu"))

    def step(i):
        ids = batches[i % len(batches)]
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().clone() if cuda_graphs else loss.detach()

    return step


def build_model(family: str, size: dict, variant: Variant, device, dtype, seed: int = 0):
    """The model of ``family`` at ``size`` with ``variant``'s patches, parameters in ``dtype`` on ``device``;
    returns (model, a note saying what was patched). Liger patches transformers' classes, so it runs first;
    npu_liger patches the built model. Compilation is left to the caller."""
    import torch
    import transformers

    fam = FAMILIES[family]
    note = ""
    if variant.liger is not None:
        import liger_kernel.transformers as lk  # ImportError: the caller skips the variant

        patch = getattr(lk, fam.liger_patch)
        kwargs = patch_kwargs(patch, variant.liger)
        patch(**kwargs)
        note = f"{fam.liger_patch}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, fam.model)(model_config(family, size, variant.experts))
    model = model.to(dtype)
    model.train()
    if variant.npu_liger is not None:
        import npu_liger.transformers as nlt

        kwargs = patch_kwargs(nlt.apply_to_model, variant.npu_liger)
        nlt.apply_to_model(model, **kwargs)
        note = f"apply_to_model({', '.join(f'{k}={v}' for k, v in kwargs.items())}): {nlt.patch_summary(model)}"
    return model, note


def make_batches(size: dict, count: int, device, seed: int = 1):
    """``count`` random token batches (the labels are the inputs; HF shifts them), identical in every process."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=g).to(device)
            for _ in range(count)]


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize()


class StepMarks:
    """Marks between timed steps: device events on an accelerator (recorded on the stream, so the host does not
    wait and the steps overlap as they do unmarked), the host clock on the CPU. ``intervals_ms`` after the final
    synchronisation: one time per step, which shows whether a slow mean is every step or one stall."""

    def __init__(self, device):
        import torch

        self._events = {"cuda": getattr(torch, "cuda", None), "npu": getattr(torch, "npu", None)}.get(device.type)
        self._marks = []

    def mark(self) -> None:
        if self._events is None:
            self._marks.append(time.perf_counter())
        else:
            event = self._events.Event(enable_timing=True)
            event.record()
            self._marks.append(event)

    def intervals_ms(self) -> list:
        pairs = zip(self._marks, self._marks[1:])
        if self._events is None:
            return [round((b - a) * 1e3, 2) for a, b in pairs]
        return [round(a.elapsed_time(b), 2) for a, b in pairs]


def peak_gib(device) -> Optional[float]:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    if device.type == "npu":
        return torch.npu.max_memory_allocated() / 2**30
    return None


# ---------------------------------------------------------------------------------------------------------------
# One variant (in its own process)


def run_variant(job: dict) -> dict:
    """Build, warm up and time one (family, variant); returns the measurements."""
    if job["device"] == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (through npu_liger)
    import torch
    import torch._dynamo

    if job["device"] == "npu":
        import torch_npu  # noqa: F401
    device = torch.device(job["device"])
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    variant, size = VARIANTS[job["variant"]], job["size"]
    dtype = getattr(torch, job["dtype"])
    model, note = build_model(job["family"], size, variant, device, dtype)
    run = model
    compile_options = dict(backend=job["compile_backend"])
    if variant.compile_mode is not None and job["compile_backend"] == "inductor":
        compile_options["mode"] = variant.compile_mode
    if variant.compiled and job["compile_scope"] == "layers":
        # each decoder layer on its own (identical layers share one compiled graph: a fraction of the compile
        # time); embedding, final norm, lm_head and the loss stay eager
        for layer in model.model.layers:
            layer.compile(**compile_options)
    elif variant.compiled:
        run = torch.compile(model, **compile_options)
    cuda_graphs = compile_options.get("mode") == "reduce-overhead" and device.type == "cuda"
    step = training_step(run, model, make_batches(size, 4, device), device, cuda_graphs)

    # CUDA graphs: torch's graph trees record again on the third step (seen on the H200: one 140-170 ms step
    # among 67-74 ms ones when only two were untimed), so those variants warm up with at least four
    warmup = max(job["warmup"], 4) if cuda_graphs else job["warmup"]
    started = time.perf_counter()
    first_loss = step(0).item()  # before any update: the same model and batch in every variant
    for i in range(1, warmup):
        step(i)
    synchronize(device)
    warmup_s = time.perf_counter() - started
    marks = StepMarks(device)  # per-step times, without a synchronisation between steps
    start = time.perf_counter()
    marks.mark()
    for i in range(job["steps"]):
        loss = step(warmup + i)
        marks.mark()
    synchronize(device)
    elapsed = time.perf_counter() - start
    tokens = job["steps"] * size["batch"] * size["seq"]
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values()) if variant.compiled else None
    result = dict(device=device.type, tokens_per_s=tokens / elapsed, step_ms=elapsed / job["steps"] * 1e3,
                  step_ms_each=marks.intervals_ms(), peak_gib=peak_gib(device),
                  first_loss=first_loss, last_loss=loss.item(), warmup_s=warmup_s, warmup_steps=warmup,
                  graph_breaks=breaks, note=note)
    if cuda_graphs:  # graphs Inductor ran without CUDA graphs (TORCH_LOGS=cudagraphs says why)
        result["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    if job.get("profile_steps") and device.type == "cuda":
        try:  # after the timed steps: a profiler failure (e.g. under CUDA graphs) costs only the profile
            result["profile"] = kernel_profile(step, warmup + job["steps"], job["profile_steps"], device)
        except Exception as error:  # noqa: BLE001
            result["profile"] = dict(error=f"{type(error).__name__}: {error}"[:300])
    return result


# Kernel families of a profile, matched in order on the lower-cased kernel name, after the Triton kernels of
# npu_liger and of Liger-Kernel (by their Python names). Inductor's generated kernels are "triton_poi/red/per_...".
KERNEL_GROUPS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),  # before matmul: cuDNN's names say "wgmma"
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "wgmma", "splitk")),
    ("optimizer", ("multi_tensor", "adam")),
    ("inductor", ("triton_poi", "triton_red", "triton_per", "triton_tem")),
    ("copy/fill", ("memcpy", "memset", "copy", "fill")),
    ("aten elementwise/reduce", ("elementwise", "reduce_kernel", "index", "scatter", "gather", "cat")),
)


def triton_kernel_names(package: str) -> set:
    """Names of the ``@triton.jit`` functions in the imported modules of ``package`` (npu_liger's host-launched
    kernels are ``LaunchedKernel`` wrappers that hold one as ``jit_function``; under the interpreter they are
    ``InterpretedFunction``s)."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return set()
    try:
        from triton.runtime.interpreter import InterpretedFunction
        kinds = (JITFunction, InterpretedFunction)
    except ImportError:
        kinds = (JITFunction,)
    names = set()
    for name, module in list(sys.modules.items()):
        if module is not None and (name == package or name.startswith(package + ".")):
            names.update(attr for attr, value in vars(module).items()
                         if isinstance(getattr(value, "jit_function", value), kinds))
    return names


def kernel_group(name: str, ours: set = frozenset(), liger: set = frozenset()) -> str:
    if name in ours:
        return "npu_liger kernels"
    if name in liger:
        return "Liger kernels"
    low = name.lower()
    return next((group for group, keys in KERNEL_GROUPS if any(k in low for k in keys)), "other")


def kernel_profile(step, first: int, count: int, device) -> dict:
    """Device time per step of the kernels ``count`` more steps launch (torch.profiler's CUDA activity), by
    group and by kernel (the 25 largest). Against the wall time per step it tells how much of a step the device
    is idle waiting for the host; between variants, which kernels a difference is made of."""
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(count):
            step(first + i)
        synchronize(device)
    wall_ms = (time.perf_counter() - started) * 1e3 / count
    kernels = [(e.key, e.self_device_time_total / 1e3 / count, e.count / count) for e in prof.key_averages()
               if e.self_device_time_total > 0]
    ours, liger = triton_kernel_names("npu_liger"), triton_kernel_names("liger_kernel")
    groups: dict = {}
    for name, ms, _ in kernels:
        group = kernel_group(name, ours, liger)
        groups[group] = groups.get(group, 0.0) + ms
    top = sorted(kernels, key=lambda k: -k[1])[:25]
    return dict(steps=count, wall_ms_per_step=round(wall_ms, 2),
                kernel_ms_per_step=round(sum(ms for _, ms, _ in kernels), 2),
                groups={g: round(ms, 2) for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
                top=[[name[:120], round(ms, 3), round(calls, 1)] for name, ms, calls in top])


def _worker(job_json: str) -> None:
    job = json.loads(job_json)
    print("RESULT " + json.dumps(run_variant(job)), flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The driver


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu", "npu"))
    p.add_argument("--quick", action="store_true", help="fewer timed steps (2 warm-up, 5 timed)")
    p.add_argument("--smoke", action="store_true", help="tiny models, 2 warm-up + 2 timed steps, fp32, compiled "
                   "variants through the aot_eager backend (for the CPU test)")
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated: {','.join(FAMILIES)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {','.join(VARIANTS)}")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps, compilation included (default 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10)")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="parameter dtype (default bfloat16; fp32 with --smoke)")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; aot_eager "
                   "with --smoke)")
    p.add_argument("--compile-scope", default="model", choices=("model", "layers"),
                   help="torch.compile the whole model (default) or each decoder layer (much faster to compile)")
    p.add_argument("--timeout-s", type=float, default=600, help="per variant")
    p.add_argument("--budget-s", type=float, default=None, help="start no new variant after this many seconds "
                   "(the rest are listed as skipped); families run in the order given")
    p.add_argument("--profile-steps", type=int, default=0, help="after the timed steps, profile this many more "
                   "(CUDA): kernel time per step by group and by kernel, in train_step_profile.md")
    p.add_argument("--out", default=None, help=f"output folder (default {os.path.relpath(OUTPUT, REPO)})")
    p.add_argument("--publish", action="store_true", help=f"write to {os.path.relpath(PUBLISHED, REPO)}")
    args = p.parse_args(argv)
    args.families = [f for f in args.families.split(",") if f]
    args.variants = [v for v in args.variants.split(",") if v]
    for name, given, known in (("family", args.families, FAMILIES), ("variant", args.variants, VARIANTS)):
        unknown = [x for x in given if x not in known]
        if unknown:
            p.error(f"unknown {name} {unknown}; expected some of {list(known)}")
    quick_steps = (2, 2) if args.smoke else (2, 5) if args.quick else (3, 10)
    args.warmup = max(1, args.warmup if args.warmup is not None else quick_steps[0])
    args.steps = max(1, args.steps if args.steps is not None else quick_steps[1])
    args.dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
    args.compile_backend = args.compile_backend or ("aot_eager" if args.smoke else "inductor")
    args.out = args.out or (PUBLISHED if args.publish else OUTPUT)
    return args


def liger_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:  # noqa: BLE001 - not installed
        return None


def run_worker(job: dict, timeout_s: float, extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """One variant in a fresh interpreter (``extra_env`` added to its environment, e.g. TORCH_LOGS) with an
    Inductor cache of its own; raises subprocess.TimeoutExpired.

    The cache is per worker because Inductor's and AOTAutograd's caches key a compiled graph on the Dynamo graph
    and torch's configs, not on NPU_LIGER_INDUCTOR_LAUNCHES nor on our ops' code: round nineteen's opaque CUDA-graph
    variant warmed up in 6 s against its launches variant's 34 s just before it, most likely loading that graph,
    so that A/B probably compared one graph with itself."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    if job["device"] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    if VARIANTS[job["variant"]].inductor_launches is not None:
        env["NPU_LIGER_INDUCTOR_LAUNCHES"] = VARIANTS[job["variant"]].inductor_launches
    with tempfile.TemporaryDirectory(prefix="npu_liger_inductor_") as cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        env.update(extra_env or {})
        return subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=timeout_s)


def worker_result(proc: subprocess.CompletedProcess) -> dict:
    """A worker's measurements, or ``{"error": ...}`` with the end of its output."""
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def launch(job: dict, timeout_s: float) -> dict:
    """Run one variant in a fresh interpreter; returns its measurements or ``{"error": ...}``."""
    try:
        return worker_result(run_worker(job, timeout_s))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}


def environment(args) -> dict:
    import torch
    import transformers

    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command="python benchmarks/train_step.py " + " ".join(sys.argv[1:]), device=args.device,
                torch=torch.__version__, transformers=transformers.__version__, liger_kernel=liger_version(),
                dtype=args.dtype, warmup=args.warmup, steps=args.steps, compile_backend=args.compile_backend,
                compile_scope=getattr(args, "compile_scope", None),
                size=SIZES["smoke" if args.smoke else "default"])
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    if args.device == "cuda" and torch.cuda.is_available():
        meta["device_name"] = torch.cuda.get_device_name(0)
    return meta


def main(argv=None) -> int:
    args = parse_args(argv)
    meta = environment(args)
    rows, run_started = [], time.perf_counter()
    for family in args.families:
        for name in args.variants:
            row = dict(family=family, variant=name)
            if VARIANTS[name].liger is not None and meta["liger_kernel"] is None:
                row["skipped"] = "liger_kernel is not installed"
            elif args.budget_s is not None and time.perf_counter() - run_started > args.budget_s:
                row["skipped"] = f"time budget ({args.budget_s:.0f} s) spent"
            else:
                started = time.perf_counter()
                job = dict(family=family, variant=name, size=meta["size"], device=args.device, dtype=args.dtype,
                           warmup=args.warmup, steps=args.steps, compile_backend=args.compile_backend,
                           compile_scope=args.compile_scope, profile_steps=args.profile_steps)
                row.update(launch(job, args.timeout_s))
                row["wall_s"] = time.perf_counter() - started
            rows.append(row)
            print(format_row(row, rows), flush=True)
            write_outputs(meta, rows, args.out)  # after every variant: an interrupted run keeps what it measured
    print(f"wrote {args.out}/train_step.{{md,json,png}}")
    return 1 if any("error" in r for r in rows) else 0


# ---------------------------------------------------------------------------------------------------------------
# Reporting


def _baseline(row, rows):
    return next((r for r in rows if r["family"] == row["family"] and r["variant"] == "hf_eager"
                 and "tokens_per_s" in r), None)


def step_ms_text(row) -> str:
    """Mean ms per step, with the fastest and slowest step when they were recorded: "77.1 (75-80)"."""
    each = row.get("step_ms_each") or []
    spread = f" ({min(each):.0f}-{max(each):.0f})" if len(each) > 1 else ""
    return f"{row['step_ms']:.1f}{spread}"


def format_row(row, rows) -> str:
    head = f"{row['family']:>6} {row['variant']:<29}"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    if "error" in row:
        return f"{head} FAILED: {row['error']}"
    peak = "" if row["peak_gib"] is None else f"  peak {row['peak_gib']:6.2f} GiB"
    skips = f"  CUDA graphs skipped for {row['cudagraph_skips']} graph(s)" if row.get("cudagraph_skips") else ""
    return (f"{head} {row['tokens_per_s']:11,.0f} tokens/s  {step_ms_text(row)} ms/step{peak}  "
            f"first loss {row['first_loss']:.5f}  ({row['wall_s']:.0f} s){skips}")


def loss_check(row, rows) -> str:
    """The first-step loss against HF eager's: same weights, same batch, so only rounding may differ."""
    base = _baseline(row, rows)
    if base is None or "first_loss" not in row:
        return ""
    rel = abs(row["first_loss"] - base["first_loss"]) / abs(base["first_loss"])
    return f"{rel:.1e}" + (" !!" if rel > 1e-2 else "")


def markdown(meta, rows) -> str:
    size = meta["size"]
    lines = [
        f"Training step, {meta['date']}, {meta.get('device_name', meta['device'])}: torch {meta['torch']}, "
        f"triton {meta['triton']}, transformers {meta['transformers']}, liger-kernel {meta['liger_kernel']}.",
        f"Command: `{meta['command']}`. Model: {size['layers']} layers, hidden {size['hidden']}, intermediate "
        f"{size['intermediate']}, {size['heads']}/{size['kv_heads']} heads of {size['head_dim']}, vocab "
        f"{size['vocab']}; {size['batch']}x{size['seq']} tokens per step, {meta['dtype']} parameters, AdamW; "
        f"{meta['warmup']} warm-up + {meta['steps']} timed steps; torch.compile backend {meta['compile_backend']} "
        f"over the {'whole model' if meta['compile_scope'] == 'model' else 'decoder layers'}.",
        "",
        "| family | variant | tokens/s | vs HF eager | ms/step (fastest-slowest step) | peak GiB | first loss "
        "| vs eager | warm-up s | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "tokens_per_s" not in row:
            lines.append(f"| {row['family']} | {row['variant']} | | | | | | | | "
                         f"{row.get('skipped') or 'FAILED: ' + row['error'][:200]} |")
            continue
        base = _baseline(row, rows)
        ratio = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""
        peak = "" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
        note = row["note"].replace("|", "/")
        if row.get("graph_breaks") is not None:
            note = f"graph breaks: {row['graph_breaks']}" + (f"; {note}" if note else "")
        lines.append(f"| {row['family']} | {row['variant']} | {row['tokens_per_s']:,.0f} | {ratio} | "
                     f"{step_ms_text(row)} | {peak} | {row['first_loss']:.4f} | {loss_check(row, rows)} | "
                     f"{row['warmup_s']:.0f} | {note} |")
    return "\n".join(lines) + "\n"


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "tokens_per_s" in r]
    if not done:
        return
    families = list(dict.fromkeys(r["family"] for r in done))
    variants = list(dict.fromkeys(r["variant"] for r in done))
    width = 0.8 / len(variants)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, key, label in ((axes[0], "tokens_per_s", "tokens/s (thousands)"), (axes[1], "peak_gib", "peak GiB")):
        for j, variant in enumerate(variants):
            xs, ys = [], []
            for i, family in enumerate(families):
                row = next((r for r in done if r["family"] == family and r["variant"] == variant), None)
                if row is not None and row[key] is not None:
                    xs.append(i + (j - (len(variants) - 1) / 2) * width)
                    ys.append(row[key] / 1e3 if key == "tokens_per_s" else row[key])
            ax.bar(xs, ys, width, label=variant)
        ax.set_xticks(range(len(families)), families)
        ax.set_ylabel(label)
        if all(r[key] is None for r in done):
            ax.set_title(f"not measured on {done[0].get('device', 'this device')}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    # one legend below both panels: inside, it covers the bars of the last family
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(variants), fontsize=8, frameon=False)
    fig.suptitle("training step: tokens/s and peak memory")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(meta, rows, out) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train_step.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "train_step.md"), "w") as f:
        f.write(markdown(meta, rows))
    plot(rows, os.path.join(out, "train_step.png"))
    profiled = [r for r in rows if "profile" in r]
    if profiled:
        with open(os.path.join(out, "train_step_profile.md"), "w") as f:
            f.write(profile_markdown(profiled))


def profile_markdown(rows) -> str:
    """Per variant: wall and kernel ms per step, kernel ms by group, then the largest kernels."""
    lines = []
    for row in rows:
        prof = row["profile"]
        if "error" in prof:
            lines += [f"## {row['family']} {row['variant']}: profile failed: {prof['error']}", ""]
            continue
        lines += [f"## {row['family']} {row['variant']}: wall {prof['wall_ms_per_step']} ms/step, kernels "
                  f"{prof['kernel_ms_per_step']} ms/step ({prof['steps']} profiled steps)", "",
                  "| group | ms/step |", "|---|---|"]
        lines += [f"| {group} | {ms} |" for group, ms in prof["groups"].items()]
        lines += ["", "| kernel | ms/step | calls/step |", "|---|---|---|"]
        lines += [f"| `{name}` | {ms} | {calls} |" for name, ms, calls in prof["top"]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2])
    else:
        sys.exit(main())
