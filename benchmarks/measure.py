"""Timing and checks: the copy-bandwidth roofline, one variant's check + timings, dispatch overhead, and the
Triton compile count.

Timing on CUDA is ``triton.testing.do_bench`` (median; it also clears L2 between calls). Each variant cycles
through several independent input sets (together several times the L2) and gets its own freshly generated
sets, identical across variants: Liger rotates q/k in place and writes geglu/swiglu gradients into the saved
inputs, so sharing inputs would hand later variants modified data. The forward is timed under
``torch.no_grad()`` (inference: nothing saved for backward); forward+backward is
``torch.autograd.grad(outputs, leaves, grads_out)`` (no ``.grad`` accumulation). On CPU (``--device cpu``,
the Triton interpreter) a plain wall-clock median stands in for do_bench.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
import pkgutil
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .specs import Case, Inputs, OpSpec

# Relative error (||out - eager|| / ||eager||) above which a variant is reported as a mismatch. Half precision
# allows for eager's own rounding of every intermediate (HF formulas round after each elementwise op).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Timer:
    def __init__(self, device: str, warmup_ms: float = 25, rep_ms: float = 100, cpu_reps: int = 3):
        self.device, self.warmup_ms, self.rep_ms, self.cpu_reps = device, warmup_ms, rep_ms, cpu_reps
        self.name = "triton.testing.do_bench (median)" if device == "cuda" else f"wall clock (median of {cpu_reps})"

    def __call__(self, fn: Callable[[], object]) -> float:
        """Milliseconds per call of ``fn``."""
        if self.device == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        fn()
        times = []
        for _ in range(self.cpu_reps):
            start = time.perf_counter()
            fn()
            sync(self.device)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3


def copy_bandwidth_gbps(device: str, timer: Timer, nbytes: int) -> float:
    """Device-to-device copy of an ``nbytes`` buffer: (bytes read + bytes written) / time, in GB/s."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = timer(functools.partial(dst.copy_, src))
    return 2 * n * 4 / ms / 1e6


def gbps(nbytes: int, ms: Optional[float]) -> Optional[float]:
    return None if not ms else nbytes / ms / 1e6


def rel_err(out: Optional[torch.Tensor], ref: Optional[torch.Tensor]) -> float:
    if out is None or ref is None:
        return math.nan
    out, ref = out.detach(), ref.detach()
    if out.shape != ref.shape:
        return math.inf
    if out.is_complex() or ref.is_complex():
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    o, r = out.float(), ref.float()
    den = r.norm().item()
    num = (o - r).norm().item()
    if math.isnan(num):
        return math.inf
    return num / den if den > 0 else num


def pool_size(inputs: Inputs, device: str, smoke: bool) -> int:
    """How many independent input sets to cycle through: at least 2, together >= 4x the L2 cache."""
    if smoke or device != "cuda":
        return 2
    tensors = [t for t in (*inputs.args, *inputs.grads_out) if isinstance(t, torch.Tensor)]
    set_bytes = sum(t.numel() * t.element_size() for t in tensors)
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20)
    return int(min(32, max(2, math.ceil(4 * l2 / max(set_bytes, 1)))))


def make_pool(case: Case, device: str, n: int) -> List[Inputs]:
    """``n`` input sets; set i is the same data for every variant (seeded generator)."""
    pool = []
    for i in range(n):
        gen = torch.Generator(device=device)
        gen.manual_seed(1234 + i)
        pool.append(case.spec.make(case.params, case.dtype, device, gen))
    return pool


def forward_backward(fn: Callable, inp: Inputs):
    outs = fn(*inp.args)
    grads = torch.autograd.grad(outs, inp.leaves, inp.grads_out, allow_unused=True)
    return outs, grads


class Reference:
    """Eager outputs on input set 0 (forward) and outputs + gradients on set 1 (forward+backward)."""

    def __init__(self, eager: Callable, case: Case, device: str):
        pool = make_pool(case, device, 2)
        with torch.no_grad():
            self.fwd = tuple(o.detach().clone() for o in eager(*pool[0].args))
        outs, grads = forward_backward(eager, pool[1])
        self.fb_outs = tuple(o.detach().clone() for o in outs)
        self.fb_grads = tuple(None if g is None else g.detach().clone() for g in grads)


def check_and_time(variant: str, fn: Callable, case: Case, device: str, ref: Reference, timer: Timer,
                   smoke: bool) -> Dict:
    """Check ``fn`` against eager on fresh inputs, then time forward and forward+backward."""
    row: Dict = {"variant": variant, "fwd_ms": None, "fb_ms": None, "fwd_err": None, "fb_err": None,
                 "fb_peak_gib": None, "note": "", "error": ""}
    tol = TOLERANCE[case.dtype]
    stage = "inputs"
    try:
        first = case.spec.make(case.params, case.dtype, device, _gen(device, 1234))
        n_sets = pool_size(first, device, smoke)
        del first
        pool = make_pool(case, device, n_sets)
        row["pool"] = len(pool)

        stage = "forward check"
        with torch.no_grad():
            outs = fn(*pool[0].args)
        row["fwd_err"] = (max(rel_err(o, r) for o, r in zip(outs, ref.fwd, strict=True))
                          if len(outs) == len(ref.fwd) else math.inf)
        del outs

        stage = "forward+backward check"
        outs, grads = forward_backward(fn, pool[1])
        errs = [rel_err(o, r) for o, r in zip(outs, ref.fb_outs, strict=True)]
        missing = [i for i, g in enumerate(grads) if g is None and ref.fb_grads[i] is not None]
        errs += [rel_err(g, r) for g, r in zip(grads, ref.fb_grads, strict=True) if g is not None and r is not None]
        row["fb_err"] = max(errs) if errs else math.nan
        if missing:
            row["note"] = "no grad for input(s) " + ",".join(str(i) for i in missing)
        del outs, grads

        row["check"] = "ok"
        errors = (("fwd", row["fwd_err"]), ("f+b", row["fb_err"]))
        bad = [f"{what} rel err {err:.2e} > {tol:.0e}" for what, err in errors if err is not None and not (err <= tol)]
        if bad:
            row["check"] = "MISMATCH " + "; ".join(bad)

        stage = "timing"
        fwd, fb = timed_calls(fn, pool)
        row["fwd_ms"] = timer(fwd)
        row["fb_ms"] = timer(fb)
        row["fwd_ms_rounds"], row["fb_ms_rounds"] = [row["fwd_ms"]], [row["fb_ms"]]

        if device == "cuda":  # the same calls with the host out of the picture: a host-bound row shows here
            stage = "kernel time"
            row["fwd_kernel_ms"] = kernel_ms(fwd)
            row["fb_kernel_ms"] = kernel_ms(fb)

        if device == "cuda":  # one forward+backward's peak beyond what was allocated before (the inputs)
            stage = "peak memory"
            inp = pool[0]
            sync(device)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            outs = fn(*inp.args)
            grads = torch.autograd.grad(outs, inp.leaves, inp.grads_out, allow_unused=True)
            sync(device)
            row["fb_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30  # includes the returned grads
            del outs, grads
    except Exception as exc:  # report and carry on with the next variant
        message = str(exc).splitlines()[0] if str(exc) else ""
        row["error"] = f"{stage}: {type(exc).__name__}: {message}"[:300]
        check = row.get("check", "ok")
        row["check"] = "ERROR" if check == "ok" else check + "; ERROR"
    finally:
        pool = None
        sync(device)
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def timed_calls(fn: Callable, pool: List[Inputs]) -> Tuple[Callable[[], None], Callable[[], None]]:
    """The two calls the timer times, cycling through ``pool``: the forward under ``torch.no_grad()``, and the
    forward+backward (``torch.autograd.grad``, no ``.grad`` accumulation)."""
    cycle = itertools.cycle(pool)

    def fwd():
        inp = next(cycle)
        with torch.no_grad():
            fn(*inp.args)

    def fb():
        inp = next(cycle)
        outs = fn(*inp.args)
        torch.autograd.grad(outs, inp.leaves, inp.grads_out, allow_unused=True)

    return fwd, fb


def retime(row: Dict, fn: Callable, case: Case, device: str, timer: Timer, smoke: bool) -> None:
    """One more timing round of a row ``check_and_time`` made (fresh inputs, the same sets): its forward and
    forward+backward times are appended to the row's rounds, and ``fwd_ms``/``fb_ms`` become their medians. The
    harness times every variant of a case once per round, in turn, so that a host whose speed drifts during a
    run (the GPU machines' hosts do, by tens of percent: BENCHMARKS.md round sixteen) slows every variant alike
    instead of whichever ran in the slow minute."""
    first = case.spec.make(case.params, case.dtype, device, _gen(device, 1234))
    pool = make_pool(case, device, pool_size(first, device, smoke))
    del first
    try:
        fwd, fb = timed_calls(fn, pool)
        row["fwd_ms_rounds"].append(timer(fwd))
        row["fb_ms_rounds"].append(timer(fb))
    finally:
        pool = None
        sync(device)
        if device == "cuda":
            torch.cuda.empty_cache()
    row["fwd_ms"] = statistics.median(row["fwd_ms_rounds"])
    row["fb_ms"] = statistics.median(row["fb_ms_rounds"])


def kernel_ms(fn: Callable[[], object], calls: int = 10) -> float:
    """Milliseconds of device work per call of ``fn``: the durations of the kernels (and memsets/copies) it
    launches, from torch.profiler's CUDA activity, summed and divided by ``calls``. Gaps between kernels are
    not counted, so against the timer's wall time this tells a row bound by its kernels from one bound by the
    host's launching (per-call Python, autograd), which no kernel change can fix."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync("cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync("cuda")
    return sum(e.self_device_time_total for e in prof.key_averages()) / calls / 1e3


def _gen(device: str, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


# --- dispatch overhead ----------------------------------------------------------------------------------

def _per_call_us(fn: Callable, device: str, iters: int, repeats: int) -> float:
    for _ in range(max(1, iters // 10)):
        fn()
    sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1e6


def dispatch_overhead(spec: OpSpec, device: str, iters: int, repeats: int) -> Dict:
    """Per-call µs on tiny tensors: the raw launcher vs ``torch.ops.npu_liger.<op>.default`` vs the functional
    API (``npu_liger.<op>``), without and with autograd (inputs requiring grad)."""
    case = spec.cases("tiny")[0]
    inp = spec.make(case.params, case.dtype, device, _gen(device, 7))
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in inp.args)
    args = spec.npu_args(*plain)
    grad_args = spec.npu_args(*inp.args)
    launcher, op, functional = spec.launcher(), spec.op(), spec.functional()
    res = {"op": spec.name, "shape": case.label, "device": device, "iters": iters}
    res["launcher_us"] = _per_call_us(lambda: launcher(*args), device, iters, repeats)
    res["op_us"] = _per_call_us(lambda: op(*args), device, iters, repeats)
    res["functional_us"] = _per_call_us(lambda: functional(*args), device, iters, repeats)
    res["op_autograd_us"] = _per_call_us(lambda: op(*grad_args), device, iters, repeats)
    res["functional_autograd_us"] = _per_call_us(lambda: functional(*grad_args), device, iters, repeats)
    res["op_overhead_us"] = res["op_us"] - res["launcher_us"]
    res["functional_overhead_us"] = res["functional_us"] - res["launcher_us"]
    return res


# --- Triton compile count -----------------------------------------------------------------------------

def _as_jit(obj):
    """The JITFunction behind ``obj`` (unwrapping autotuners/heuristics), or None."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return None
    for _ in range(4):
        if isinstance(obj, JITFunction):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def npu_liger_kernels() -> Dict[str, object]:
    """Every @triton.jit function in ``npu_liger.npu_ops`` (shared helper modules included), by qualified name."""
    import npu_liger.npu_ops as pkg

    found: Dict[int, tuple] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for attr, obj in vars(module).items():
            jit = _as_jit(obj)
            if jit is not None and id(jit) not in found:
                fn = getattr(jit, "fn", None)
                name = f"{getattr(fn, '__module__', module.__name__)}.{getattr(fn, '__name__', attr)}"
                found[id(jit)] = (name.replace("npu_liger.npu_ops.", ""), jit)
    return {name: jit for name, jit in found.values()}


def _kernel_caches(jit) -> Optional[List[dict]]:
    """The in-memory compiled-kernel dicts of a JITFunction: ``device_caches[dev][0]`` (triton >= 3.2; the
    tuple is (kernel_cache, [kernel_key_cache,] target, backend, binder)) or ``cache[dev]`` (older)."""
    caches = getattr(jit, "device_caches", None)
    if caches is not None:
        return [entry[0] for entry in list(caches.values()) if isinstance(entry, tuple) and isinstance(entry[0], dict)]
    cache = getattr(jit, "cache", None)
    if isinstance(cache, dict):
        return [v for v in cache.values() if isinstance(v, dict)]
    return None


def compile_counts(spec: OpSpec, device: str, seq_lens: Sequence[int], entry: str) -> Dict:
    """Compiled variants per kernel after running the op forward+backward at each sequence length, starting
    from empty in-memory caches (the on-disk cache makes the recompiles cheap)."""
    kernels = npu_liger_kernels()
    caches = {name: _kernel_caches(jit) for name, jit in kernels.items()}
    if not kernels or all(c is None for c in caches.values()):
        return {"op": spec.name, "status": "n/a (no compiled-kernel cache: Triton interpreter or unknown triton)"}
    for cache_list in caches.values():
        for cache in cache_list or ():
            cache.clear()
    fn = spec.npu_variant(entry)
    for seq in seq_lens:
        params = spec.compile_case(seq)
        inp = spec.make(params, spec.dtype, device, _gen(device, seq))
        forward_backward(fn, inp)
        del inp
    sync(device)
    per_kernel = {}
    for name, jit in kernels.items():
        n = sum(len(c) for c in (_kernel_caches(jit) or ()))
        if n:
            per_kernel[name] = n
    worst = max(per_kernel.values()) if per_kernel else 0
    return {"op": spec.name, "seq_lens": list(seq_lens), "kernels": per_kernel, "max_per_kernel": worst,
            "total": sum(per_kernel.values()), "status": "ok" if worst <= 2 else "FAIL (> 2 variants per kernel)"}
