"""The shared test factory every op's tests use: fresh inputs, tolerances, and the op checklist
(reference numerics, gradients, opcheck, fullgraph+dynamic compile without recompiles, no mutation)."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Callable, Dict, Iterable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# fp32 kernels compute in fp32 and round once: relative error ~1e-7 against float64; 1e-5 leaves room for
# reductions over long rows. Half precision: a single final rounding is worth one unit roundoff, the floor of
# the tolerance. Every backend rounds to nearest even (the CPU backend makes the Triton interpreter do so: it
# truncates fp32 -> bf16 by itself, see npu_ops/_triton.py), so the floor is the same everywhere.
FP32_RTOL = 1e-5
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def randn(shape: Sequence[int], dtype=torch.float32, *, noncontiguous: bool = False, scale: float = 1.0,
          requires_grad: bool = False) -> torch.Tensor:
    """Fresh random data on the device under test. ``noncontiguous`` returns a strided view (every other
    element of a buffer twice as wide in the last dim)."""
    shape = tuple(shape)
    if noncontiguous and shape:
        wide = torch.randn(*shape[:-1], 2 * shape[-1], device=DEVICE) * scale
        t = wide.to(dtype)[..., ::2]
    else:
        t = (torch.randn(shape, device=DEVICE) * scale).to(dtype)
    return t.detach().requires_grad_(requires_grad)


# Layouts every tensor argument (and incoming gradient) is drawn in by the contract tests: the same values (an
# expanded view repeats its first slice) stored another way, kept as the view all the way to the call.
LAYOUTS = ("contiguous", "strided", "offset", "transposed", "expanded")


def layouts_for(t: torch.Tensor) -> tuple:
    """The layouts of ``LAYOUTS`` that give ``t``'s shape a layout of its own (no transposed view of a vector, no
    expanded view without a dim of size > 1)."""
    if t.numel() == 0 or t.dim() == 0:
        return ("contiguous",)
    shape = t.shape
    return tuple(layout for layout in LAYOUTS
                 if not (layout == "transposed" and (t.dim() < 2 or shape[-1] == 1 or shape[-2] == 1))
                 and not (layout == "expanded" and max(shape) == 1))


def in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A new tensor holding ``t``'s values (``expanded``: its first slice along the first dim of size > 1,
    repeated) in ``layout``; a leaf, so that ``requires_grad_`` can be set on the view itself."""
    t = t.detach()
    if layout == "contiguous":
        return t.clone()
    if layout == "strided":  # every other element of a buffer twice as wide in the last dim
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "offset":  # a storage offset of one element
        buffer = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        buffer[1:] = t.reshape(-1)
        return buffer[1:].view(t.shape)
    if layout == "transposed":  # the last two dims stored swapped
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "expanded":  # stride 0 along the first dim of size > 1
        dim = next(d for d, n in enumerate(t.shape) if n > 1)
        return t.narrow(dim, 0, 1).clone().expand(t.shape)
    raise ValueError(f"unknown layout {layout!r}")


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return diff
    return diff / denom


def half_precision_tolerance(eager_lowp: torch.Tensor | None, ref64: torch.Tensor, dtype: torch.dtype,
                             roundings: int = 1) -> float:
    """Twice the eager half-precision reference's error, floored at ``roundings`` roundings to ``dtype``. One
    rounding's relative size is u where the values are normal numbers; where they are subnormal its absolute
    size is u * (the smallest normal) (measured: fp16 jsd gradients of 4097 columns, 99% subnormal, err 2.2 u =
    0.57 of this bound). Where eager itself is not finite (a log of a mixture that underflowed in half precision),
    its error is no yardstick: the floor is then at least two roundings (the inputs' and the result's)."""
    assert eager_lowp is not None, "half-precision checks need the eager half-precision reference"
    ref = ref64.detach().double().cpu()
    u, tiny = UNIT_ROUNDOFF[dtype], torch.finfo(dtype).tiny
    ref_norm = ref.norm().item()
    one_rounding = (u * ref.abs().clamp_min(tiny)).norm().item() / ref_norm if ref_norm > 0 else u
    eager_err = rel_error(eager_lowp, ref64)
    if not math.isfinite(eager_err):
        return max(roundings, 2) * one_rounding
    return max(2.0 * eager_err, roundings * one_rounding)


def assert_close(out: torch.Tensor, ref64: torch.Tensor, eager_lowp: torch.Tensor | None = None, *, what="output",
                 roundings: int = 1, floor: float = 0.0):
    """``out`` against the float64 reference. Half precision is judged against the eager half-precision
    reference's own error: no worse than twice it, floored at ``roundings`` unit roundoffs (one per rounding to
    the half dtype on the way to ``out``: a gradient computed from a stored half-precision output has two). The
    floor matters where eager's error is small by luck (a few elements). ``floor``: a relative error the
    computation's own conditioning allows (cancellation), computed by the caller from the inputs in float64."""
    assert out.shape == ref64.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref64.shape)}"
    if out.numel() == 0:
        return
    err = rel_error(out, ref64)
    if out.dtype == torch.float32:
        tol = max(FP32_RTOL, floor)
    else:
        tol = max(half_precision_tolerance(eager_lowp, ref64, out.dtype, roundings), floor)
    assert err <= tol, f"{what} ({out.dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


def snapshot(tensors: Iterable) -> list:
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in tensors]


def assert_unchanged(before: list, after: Iterable, names: Sequence[str]):
    for name, old, new in zip(names, before, after, strict=True):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old, new.detach()), f"{name} was modified by the op"


def assert_no_alias(outputs: Iterable[torch.Tensor], inputs: Iterable[torch.Tensor]):
    for out in outputs:
        for inp in inputs:
            if isinstance(out, torch.Tensor) and isinstance(inp, torch.Tensor) and out.numel() and inp.numel():
                assert out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr(), "output aliases an input"


def run_opcheck(op, args: tuple, kwargs: Dict | None = None):
    """torch.library.opcheck: schema, fake tensor, autograd registration and AOT dispatch consistency."""
    torch.library.opcheck(op, args, kwargs or {})


def compile_dynamic(fn: Callable) -> Callable:
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` from a clean Dynamo state."""
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=True)


def no_recompile_after_first(step: int):
    """Context for the ``step``-th call of a compiled function: from the second call on, a recompile is an error."""
    import torch._dynamo

    return torch._dynamo.config.patch(error_on_recompile=step > 0)


def assert_compiles_without_recompiles(fn: Callable, make_inputs: Callable[[int], tuple], sizes: Sequence[int],
                                       check: Callable[[tuple, object, object], None]):
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` matches eager for every size, and after the first
    size no recompilation happens (shapes are symbolic end to end, tiles are chosen at run time)."""
    compiled = compile_dynamic(fn)
    for step, size in enumerate(sizes):
        inputs = make_inputs(size)
        with no_recompile_after_first(step):
            got = compiled(*inputs)
        check(inputs, got, fn(*inputs))


def compiled_variants(kernel) -> int:
    """How many variants Triton has compiled of ``kernel`` (a JITFunction or our LaunchedKernel), over devices:
    a test that a new batch or sequence length compiles nothing new compares it before and after."""
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(c) for c in kernel.cache.values())


def to_float64(value):
    """A float64 (complex128) copy of a floating (complex) tensor, a new leaf requiring grad where ``value`` does;
    anything else (integer tensors, numbers, lists) as it is."""
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return value
    wide = value.detach().to(torch.complex128 if value.is_complex() else torch.float64)
    return wide.requires_grad_(value.requires_grad)


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def assert_compiled_forward_backward(fn: Callable, reference: Callable, make_inputs: Callable[[int], tuple],
                                     sizes: Sequence[int]) -> Callable:
    """The compiled training step: ``torch.compile(fn, fullgraph=True, dynamic=True)`` run forward and backward
    (fresh random output gradients) for every size in ``sizes`` matches ``reference`` in float64 (outputs and the
    gradient of every input that requires grad), and after the first size nothing recompiles. Inputs are float32
    (the float64 reference is the whole judge); ``fn`` should do some torch work around the op so that the op sits
    inside a larger graph. Returns the compiled function."""
    compiled = compile_dynamic(fn)
    for step, size in enumerate(sizes):
        inputs = make_inputs(size)
        leaves = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        assert leaves, "make_inputs must return at least one tensor that requires grad"
        with no_recompile_after_first(step):
            outs = _as_tuple(compiled(*inputs))
            grads_out = [randn(out.shape, out.dtype) for out in outs]
            torch.autograd.backward(outs, grads_out)
        inputs64 = [to_float64(t) for t in inputs]
        outs64 = _as_tuple(reference(*inputs64))
        torch.autograd.backward(outs64, [g.to(torch.float64) for g in grads_out])
        for i, (out, out64) in enumerate(zip(outs, outs64, strict=True)):
            assert_close(out, out64, what=f"size {size}: output {i}")
        for i in leaves:
            assert_close(inputs[i].grad, inputs64[i].grad, what=f"size {size}: gradient of input {i}")
    return compiled


def check_rotary_pair(op: Callable, reference: Callable, q: torch.Tensor, k: torch.Tensor, tables: Dict,
                      reference64_tables: tuple, eager_tables: tuple, out_names=("q_embed", "k_embed")):
    """The rope family's shared check: ``op(q, k)`` forward and both gradients against ``reference`` in float64
    (with ``reference64_tables``) and, for half precision, against ``reference`` in q's dtype (with
    ``eager_tables``); the inputs (q, k and the named ``tables``) unchanged and not aliased. Returns the outputs
    and leaves so callers can check layouts: (q_out, k_out, q, k)."""
    q = q.detach().requires_grad_(True)
    k = k.detach().requires_grad_(True)
    names = ("q", "k", *tables)
    inputs = (q, k, *tables.values())
    before = snapshot(inputs)
    q_out, k_out = op(q, k)
    grad_q_out, grad_k_out = randn(q_out.shape, q.dtype), randn(k_out.shape, k.dtype)
    torch.autograd.backward((q_out, k_out), (grad_q_out, grad_k_out))
    assert_unchanged(before, inputs, names)
    assert_no_alias((q_out, k_out, q.grad, k.grad), inputs)

    q64 = q.detach().double().requires_grad_(True)
    k64 = k.detach().double().requires_grad_(True)
    q_ref, k_ref = reference(q64, k64, *reference64_tables)
    torch.autograd.backward((q_ref, k_ref), (grad_q_out.double(), grad_k_out.double()))

    q_lp = q.detach().clone().requires_grad_(True)
    k_lp = k.detach().clone().requires_grad_(True)
    q_eager, k_eager = reference(q_lp, k_lp, *eager_tables)
    torch.autograd.backward((q_eager, k_eager), (grad_q_out, grad_k_out))

    assert_close(q_out, q_ref, q_eager, what=out_names[0])
    assert_close(k_out, k_ref, k_eager, what=out_names[1])
    assert_close(q.grad, q64.grad, q_lp.grad, what="grad_q")
    assert_close(k.grad, k64.grad, k_lp.grad, what="grad_k")
    return q_out, k_out, q, k


class CountOps(TorchDispatchMode):
    """Counts ``torch.ops.npu_liger.*`` calls at the dispatcher (independent of npu_liger.transformers' own
    counter): ``with CountOps() as counter: ...; counter.counts["swiglu"]``."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "npu_liger":
            self.counts[func._opname] = self.counts.get(func._opname, 0) + 1
        return func(*args, **(kwargs or {}))


class RecordedEmptyShapes:
    """``with RecordedEmptyShapes(module) as shapes: ...``: the shapes of every ``torch.empty`` that ``module``
    (an npu_ops file, through its ``torch`` name) allocates inside the block, to check that a chunked op never
    makes the whole (rows x vocabulary) buffer."""

    def __init__(self, module):
        self.module, self.shapes = module, []

    def __enter__(self) -> list:
        real_empty = torch.empty

        def recording_empty(*args, **kwargs):
            out = real_empty(*args, **kwargs)
            self.shapes.append(tuple(out.shape))
            return out

        self._real, self.module.torch.empty = real_empty, recording_empty
        return self.shapes

    def __exit__(self, *exc):
        self.module.torch.empty = self._real
        return False


def assert_fp32_close(got, ref64, floor, what):
    err = (got.detach().double() - ref64.detach()).norm().item()
    tol = FP32_RTOL * ref64.detach().norm().item() + floor
    assert err <= tol, f"{what} (torch.float32): error {err:.3e} > {FP32_RTOL} x reference + floor {floor:.3e}"


def chunked_rounding_size(grad_logits64, x, rows):
    """The size of the roundings the chunked grad_weight adds to the unfused run's: every chunk's addmm rounds
    the running sum S_k once (norm-wise at most u ||S_k||, independently from chunk to chunk), so
    sqrt(sum_k ||S_k||^2) unit roundoffs, from float64 (partial sums larger than the total, when rows cancel,
    count as such)."""
    g, xs = grad_logits64, x.detach().double()
    partial, size = torch.zeros_like(g.t() @ xs), 0.0
    rows = rows or max(1, g.shape[0])
    for start in range(0, g.shape[0], rows):
        partial = partial + g[start:start + rows].t() @ xs[start:start + rows]
        size += partial.norm().item() ** 2
    return size ** 0.5


def rounded_logit_grads_sizes(grad_logits64, weight) -> dict:
    """{"x", "bias"} -> the size of the error each inherits from dlogits rounded to half precision (every term
    off by up to u of itself): grad_x = dlogits @ weight, u || |dlogits| @ |weight| ||; grad_bias = dlogits summed
    over rows in fp32, u || sum_rows |dlogits| ||. When terms cancel (grad_x of one row is w_target - sum_v p_v
    w_v; a word's dlogits across rows change sign) that is many times u ||grad||: the errors can land past twice
    the eager run's error (which rounds once, at the end). CI drew grad_x at 7.1 unit roundoffs against the
    eager run's 3.3 for one 1x1 row over 700 words; over 300 fresh draws of that case the largest error was 0.39
    of the tolerance of ``assert_rounded_grad_close``, and 23 were past the old 2x-eager one. grad_bias of one row
    drew 1.25 unit roundoffs against the old floor of one."""
    g = grad_logits64.abs()
    return {"x": (g @ weight.detach().double().abs()).norm().item(), "bias": g.sum(0).norm().item()}


def assert_rounded_grad_close(got, ref64, ref_lp, rounding_size, what, floor):
    """A half-precision gradient whose computation rounds more than the unfused run's, by at most
    ``rounding_size`` unit roundoffs (norm-wise): the tolerance is the unfused run's error (doubled) plus twice
    that. grad_weight accumulates chunk by chunk in weight's dtype (an fp32 accumulator would cost twice the
    gradient's memory, see fused_linear_cross_entropy.py), so each chunk's addition rounds
    (``chunked_rounding_size``; before, sqrt(n_chunks) unit roundoffs ignored the running sums' size: fp16 with 3
    chunks of one row measured 1.9 unit roundoffs on the H200, over that 1.73). grad_x and grad_bias: see
    ``rounded_logit_grads_sizes``. Structural errors (a chunk lost or counted twice, a wrong derivative) are the
    fp32 runs' to catch: same chunking, tight tolerance. ``floor``: the fp32 checks' absolute floor for the GPU's
    approximate exp/log, which every precision computes in (a one-word vocabulary's gradient is exactly 0 in
    float64, and its rounding size with it, while the H200 leaves 2e-7: a tolerance of 0 is no tolerance)."""
    if got.dtype == torch.float32:
        return assert_fp32_close(got, ref64, floor, what)
    err = rel_error(got, ref64)
    ref_norm = ref64.detach().double().norm().item() or 1.0
    tol = (2.0 * rel_error(ref_lp, ref64) + (2.0 * UNIT_ROUNDOFF[got.dtype] * rounding_size + floor) / ref_norm)
    assert err <= tol, f"{what} ({got.dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


@contextlib.contextmanager
def inductor_launches(setting: str):
    """What NPU_LIGER_INDUCTOR_LAUNCHES=``setting`` at import gives, inside the block: the setting and the compile
    caches' tag that goes with it (registrations/_op.py), so no graph compiled under another setting is loaded.
    (torch's config is patched through its own ``patch``: pytest's monkeypatch would delete the option on undo.)"""
    from npu_liger.registrations import _op

    try:
        from torch.compiler import config
        tag = config.patch(cache_key_tag=_op.compile_cache_tag(setting, config.cache_key_tag))
    except (ImportError, AttributeError):  # a torch without the tag
        tag = contextlib.nullcontext()
    previous, _op.INDUCTOR_LAUNCHES = _op.INDUCTOR_LAUNCHES, setting
    try:
        with tag:
            yield
    finally:
        _op.INDUCTOR_LAUNCHES = previous
