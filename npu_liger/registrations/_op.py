"""The one helper every op registration uses: define a schema, bind its device kernels and fake, add autograd, and
build the public function's eager entry.

Ops are defined with ``torch.library.Library.define`` / ``impl`` (cheaper per call than ``custom_op``'s
Python wrapper) and registered for every backend key: ``CPU`` (Triton interpreter), ``CUDA`` and
``PrivateUse1`` (the key torch_npu renames to "npu"; registering the key rather than the name works whether
torch_npu is imported before or after npu_liger, and touches no driver).

Every launch the helpers make is CPU-serialised (``npu_ops._triton.serialized``: the interpreter is not
thread-safe): the kernels given to ``define_op``, the entry's kernel and an ``EagerPath``'s functions. Code here
never wraps a launcher by hand.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Callable, NamedTuple, Optional

import torch

from ..npu_ops._triton import capture_launches_in_graph, interpreter_enabled, serialized

NAMESPACE = "npu_liger"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
DEVICE_DISPATCH_KEYS = ("CPU", "CUDA", "PrivateUse1")
_KERNELS = {}  # op overload -> the kernel ``call_op`` runs in plain eager code (serialised)
_FORMULAS = {}  # op overload -> its autograd formula's apply, for ``call_op`` under torch.func transforms


def define_op(schema: str, *, kernel: Callable, fake: Callable, trusted_kernel: Optional[Callable] = None,
              opaque_in_graphs: Optional[str] = None) -> "torch._ops.OpOverload":
    """Define ``npu_liger::<schema>`` with ``kernel`` on every device key and ``fake`` for tracing.

    ``trusted_kernel``: the launcher without ``kernel``'s input checks, which ``call_op`` runs for arguments that
    autograd made (a backward op's incoming gradients have the outputs' shapes and dtypes, its saved tensors were
    checked by the forward): tens of microseconds of host time per call on a slow CPU.
    ``opaque_in_graphs``: why compiled graphs must keep this op opaque (see ``_launch_kernels_in_graphs``); None
    lets Inductor launch its kernels itself where it can.
    Returns the bound overload (``torch.ops.npu_liger.<name>.default``) so callers skip attribute lookups.
    """
    name = schema.split("(", 1)[0].strip()
    kernel = serialized(kernel)
    LIBRARY.define(schema)
    for key in DEVICE_DISPATCH_KEYS:
        LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    if opaque_in_graphs is None and not interpreter_enabled() and INDUCTOR_LAUNCHES != "0":
        _launch_kernels_in_graphs(name, kernel)
    else:
        OPAQUE_IN_GRAPHS[overload] = opaque_in_graphs or (
            "the Triton interpreter (CPU) runs the kernels" if interpreter_enabled()
            else f"{INDUCTOR_LAUNCHES_ENV}=0")
    _KERNELS[overload] = serialized(trusted_kernel) if trusted_kernel is not None else kernel
    return overload


# Compiled graphs and our kernels. An opaque op in an Inductor graph runs its Python launcher on every call (the
# dispatcher, the autograd kernel, the checks, the plan lookup). When a graph is traced with static sizes on CUDA,
# the op is instead decomposed into its launcher, run on the tracer's tensors with every launch recorded through
# torch.library.wrap_triton (torch.library.triton_op's mechanism, applied to our Library-defined ops): the
# generated code launches the same kernels with the same tile plan that the launcher picks at dispatch time, the
# graph's sizes being fixed and guarded and the CUDA plan depending on nothing else. Symbolic sizes (dynamic=True,
# or Dynamo's automatic dynamic after a size changes) keep the op opaque, so its tiles are still chosen at run
# time, per call, and nothing recompiles. Other devices keep it opaque too: torch_npu's Inductor is not checked
# here (no NPU, and torch_npu cannot be imported without CANN), and the interpreter cannot run on fake tensors.
# When: by default only in graphs that Inductor compiles with CUDA graphs (``mode="reduce-overhead"``, or the
# option ``triton.cudagraphs``), where the generated code and its kernels are all a replay holds. The training
# step measures no speed difference either way: with CUDA graphs it is 1.01x our plain compiled step opaque
# (round thirteen, an H200) and 0.98-1.01x with the launches (round twenty-one, an H100), the step being GPU-bound.
# (Rounds seventeen to nineteen measured 1.13x, but those CUDA-graph steps trained to NaN and ran below their own
# kernels' time: they were not whole steps; tests/test_transformers_integration.py's CUDA-graph training test
# now compares such a step with eager.) In other graphs the ops stay opaque: the launches measured no gain there
# in round twelve (111.0k against 112.0k tokens/s, an H200) and +2.4% in round nineteen (gemma, one run each,
# inside this host's 1-2% drift), and the graphs stay simpler.
# NPU_LIGER_INDUCTOR_LAUNCHES=1 launches them in every static-size CUDA graph, =0 in none.
INDUCTOR_LAUNCHES_ENV = "NPU_LIGER_INDUCTOR_LAUNCHES"


def inductor_launches_setting() -> str:
    """NPU_LIGER_INDUCTOR_LAUNCHES as read at import: "auto" (unset or empty), "1" or "0"."""
    value = os.environ.get(INDUCTOR_LAUNCHES_ENV, "").strip() or "auto"
    if value not in ("auto", "1", "0"):
        raise ValueError(f"{INDUCTOR_LAUNCHES_ENV} must be 1, 0 or auto (the default: launches in graphs compiled "
                         f"with CUDA graphs), got {value!r}")
    return value


INDUCTOR_LAUNCHES = inductor_launches_setting()

# Compile caches. A graph that launches our kernels holds their code and the tile plans chosen while it was traced,
# but torch's AOTAutograd cache keys a graph on its Dynamo graph, where our ops are only names, and on torch's own
# configs: a cached graph would outlive a change of NPU_LIGER_INDUCTOR_LAUNCHES or of npu_liger itself, a kernel
# fix included (round nineteen's A/B most likely ran one setting's cached graph under the other: BENCHMARKS.md,
# round twenty-three). Both go into torch.compiler.config.cache_key_tag, which torch's compile caches key on,
# after the user's own tag.
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent
COMPILED_SOURCES = ("npu_ops", "registrations", "tiling")  # what a graph that launches our kernels bakes in
_TAG_PREFIX = "npu_liger:"


def compile_cache_tag(setting: str, user_tag: str = "", root: pathlib.Path = PACKAGE_ROOT) -> str:
    """``user_tag`` (without an earlier npu_liger part) followed by a fingerprint of ``setting`` and of the
    sources under ``root`` that a compiled graph bakes in (about 5 ms)."""
    digest = hashlib.sha256(setting.encode())
    for path in sorted(p for folder in COMPILED_SOURCES for p in (root / folder).rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    kept = [part for part in user_tag.split(";") if part and not part.startswith(_TAG_PREFIX)]
    return ";".join([*kept, _TAG_PREFIX + digest.hexdigest()[:16]])


def _tag_compile_caches() -> None:
    """Where compiled graphs may launch our kernels (CUDA Triton): every setting, 0 included, since a graph cached
    under another setting would otherwise be loaded."""
    try:
        from torch.compiler import config
    except ImportError:  # a torch without it (before 2.6) has no such tag
        return
    if not hasattr(config, "cache_key_tag") or interpreter_enabled() or not torch.cuda.is_available():
        return
    config.cache_key_tag = compile_cache_tag(INDUCTOR_LAUNCHES, config.cache_key_tag)


_tag_compile_caches()
OPAQUE_IN_GRAPHS = {}  # op overload -> why compiled graphs always call it as an opaque op
CHUNKED_LOSS = ("a chunked fused-linear loss: traced, Inductor would plan every chunk's matmul and logits buffers "
                "itself, outside the op's chunk memory policy")


def _launch_kernels_in_graphs(name: str, launcher: Callable) -> None:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    known_types = (torch.Tensor, torch.nn.Parameter, FakeTensor, FunctionalTensor)

    def decompose(mode, func, types, args, kwargs):
        if any(t not in known_types for t in types):
            return NotImplemented  # tensor subclasses (DTensor, ...) dispatch on their own
        if (not inductor_launches_in_this_graph() or not torch._functorch.config.decompose_custom_triton_ops
                or not _static_cuda_call(args, kwargs)):
            return mode.__torch_dispatch__(func, types, args, kwargs)  # the opaque op
        with mode, capture_launches_in_graph():
            return launcher(*args, **kwargs)

    torch.library.register_torch_dispatch(f"{NAMESPACE}::{name}", FunctionalTensorMode, decompose, lib=LIBRARY)


def inductor_launches_in_this_graph() -> bool:
    """Whether the graph being traced launches our kernels itself (the comment above): always with
    NPU_LIGER_INDUCTOR_LAUNCHES=1, never with =0, else when Inductor compiles this graph with CUDA graphs (its
    ``triton.cudagraphs`` option, which ``mode="reduce-overhead"`` sets for the whole compilation)."""
    if INDUCTOR_LAUNCHES != "auto":
        return INDUCTOR_LAUNCHES == "1"
    from torch._inductor import config as inductor_config

    return bool(inductor_config.triton.cudagraphs)


def _static_cuda_call(args, kwargs) -> bool:
    """Every tensor on CUDA with plain-int sizes, strides and offset, and no symbolic scalar argument."""
    for arg in (*args, *kwargs.values()):
        for value in (arg if isinstance(arg, (list, tuple)) else (arg,)):
            if isinstance(value, torch.Tensor):
                if value.device.type != "cuda" or not all(
                        type(s) is int for s in (*value.shape, *value.stride(), value.storage_offset())):
                    return False
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
    return True


def call_op(op: "torch._ops.OpOverload", *args):
    """``op(*args)`` from an autograd formula (typically a backward op): in plain eager code that records no
    graph (``eager_kernels_allowed``) the op's kernel runs directly, without the dispatcher's round trip; under
    torch.func transforms its formula (see ``_register_autograd``); in every other case (tracing, modes,
    create_graph=True, which reaches the double-backward error) the op."""
    if eager_kernels_allowed(*[a for a in args if isinstance(a, Tensor)]):
        return _KERNELS[op](*args)
    if _functorch_active() and op in _FORMULAS:
        return _FORMULAS[op](*args)
    return op(*args)


def define_composite(schema: str, fn: Callable) -> "torch._ops.OpOverload":
    """Define ``npu_liger::<schema>`` as a composite of other ops (CompositeImplicitAutograd): ``fn`` runs at
    the autograd level, so it can look at ``requires_grad`` and grad mode, and the ops it calls carry the
    autograd formulas. Under torch.compile it decomposes into those ops (no fake function needed)."""
    name = schema.split("(", 1)[0].strip()
    LIBRARY.define(schema)
    LIBRARY.impl(name, fn, "CompositeImplicitAutograd")
    return getattr(getattr(torch.ops, NAMESPACE), name).default


class EagerPath(NamedTuple):
    """An op's own eager training path, for ops that keep their own state between forward and backward (the one
    hook; the usual path is the op's formula around its kernel). ``forward(ctx, *args)`` runs the kernels and
    keeps what the backward needs on ``ctx``; ``backward(ctx, *grads)`` returns one gradient (or None) per
    argument. ``applies(*args)``: whether a call may take it (else it runs the op); None: every call. E.g. the
    losses keep the gradients their forward computed and scale them in place, tvd keeps 2-bit sign codes."""
    forward: Callable
    backward: Callable
    applies: Optional[Callable] = None


def define_autograd(op: "torch._ops.OpOverload", *, backward: Callable, setup_context: Callable,
                    kernel: Optional[Callable] = None, eager: Optional[EagerPath] = None) -> Callable:
    """Register ``backward``/``setup_context`` as the op's autograd formula.

    Returns the op's eager entry point: with ``kernel`` (the op's device launcher), ``define_entry``'s function
    (the formula around the kernel in eager training calls, or ``eager``); without, the op itself.
    """
    formula_apply = _register_autograd(op, backward, setup_context, public=kernel is not None)
    if kernel is None:
        return op
    if eager is None:
        eager = _formula_path(kernel, backward, setup_context)
    return define_entry(op, kernel=kernel, eager=eager, formula_apply=formula_apply)


def _formula_path(kernel: Callable, backward: Callable, setup_context: Callable) -> EagerPath:
    """The op's formula as an eager path: the kernel, then ``setup_context``, then the formula's backward."""

    def forward(ctx, *args):
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    return EagerPath(forward, backward)


def _register_autograd(op, backward: Callable, setup_context: Callable, public: bool) -> Callable:
    """The op's Autograd kernel: an ``autograd.Function`` with a separate ``setup_context`` (the formula). Returns
    the formula's ``apply``, which the eager entry calls under torch.func transforms: they need a Function with
    ``setup_context`` applied from Python, not from inside the dispatcher (there, functorch finds no kernel for
    its ``custom_function_call``), so the op itself refuses them with a message saying what to call instead.
    ``public``: the op has a public function (an eager entry) that supports them."""
    below_autograd = torch._C._AutoDispatchBelowAutograd
    any_requires_grad = torch._C._any_requires_grad
    name = op._schema.name
    # The dispatcher drops trailing arguments equal to their defaults; the formula sees every argument.
    defaults = tuple(a.default_value if a.has_default_value() else None for a in op._schema.arguments)

    def forward(*args):
        with below_autograd():
            return op(*args)

    formula = type(_class_name(op, "Formula"), (torch.autograd.Function,),
                   {"forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
                    "backward": staticmethod(backward)})
    apply = formula.apply

    def autograd_kernel(*args):
        if len(args) < len(defaults):
            args = (*args, *defaults[len(args):])
        if torch.is_grad_enabled() and any_requires_grad(*args):
            if _functorch_active():
                raise NotImplementedError(
                    f"torch.func transforms (grad, vjp, jacrev, ...) of {name} are supported through its public "
                    f"function npu_liger.{name.split('::')[-1]}, not through torch.ops" if public else
                    f"{name} does not support torch.func transforms (grad, vjp, jacrev, ...): its gradients are "
                    "computed in the forward pass; use torch.autograd.grad or loss.backward()")
            return apply(*args)
        with below_autograd():
            return op(*args)

    LIBRARY.impl(name.split("::")[-1], autograd_kernel, "Autograd")
    _FORMULAS[op] = apply
    return apply


def _class_name(op, suffix: str) -> str:
    """``npu_liger::geglu_backward`` -> ``GegluBackward<suffix>`` (autograd names its nodes after the class)."""
    return "".join(part.title() for part in op._schema.name.split("::")[-1].split("_")) + suffix


def define_entry(op: "torch._ops.OpOverload", *, kernel: Callable, eager: EagerPath,
                 formula_apply: Optional[Callable] = None) -> Callable:
    """The public function's entry: the quack-style eager bypass. A plain eager call (``_plain_call``) runs
    ``kernel`` directly, or ``eager``'s autograd Function when an argument needs a gradient: the same kernels
    without the dispatcher's Python round trips (a few µs per call instead of ~15). Every other call is the real
    op, except under torch.func transforms, which apply the op's formula (``formula_apply``, see
    ``_register_autograd``). Call it with every schema argument positionally."""
    kernel = serialized(kernel)
    # Built with type() so autograd's node is named after the op (e.g. GegluEagerBackward). Old-style
    # forward(ctx, ...): measurably cheaper per call than forward + setup_context.
    eager_function = type(_class_name(op, "Eager"), (torch.autograd.Function,),
                          {"forward": staticmethod(serialized(eager.forward)),
                           "backward": staticmethod(serialized(eager.backward))})
    apply, applies = _c_apply(eager_function), eager.applies

    def entry(*args):
        plain = _plain_call(args)
        if plain is None:
            if formula_apply is not None and _functorch_active():
                return formula_apply(*args)
            return op(*args)
        if plain:  # an argument needs a gradient
            return apply(*args) if applies is None or applies(*args) else op(*args)
        return kernel(*args)

    return entry


def _c_apply(function: type) -> Callable:
    """``function.apply`` without ``torch.autograd.Function.apply``'s Python wrapper, for the eager entry's plain
    calls: the wrapper binds default arguments for ``setup_context`` Functions (the eager Functions use the
    old-style ``forward(ctx, ...)``) and unwraps dead functorch wrappers, which a plain call never holds
    (``_is_plain`` refuses every functorch-wrapped tensor, and active transforms take the op). 2.3 of 6.9 µs
    per call on a CI-class CPU (timeit), several times that on a GPU machine's host."""
    try:
        return super(torch.autograd.Function, function).apply  # the C++ THPFunction_apply, bound to the class
    except AttributeError:  # a torch whose Function has no C-level apply: the public one
        return function.apply


# The rule for skipping the dispatcher, written once. Launchers read tensors as raw memory, so the shortcut
# is taken only for plain dense tensors on a real device with no lazy negation/conjugation bit, and only when
# nothing needs to see the op itself. In every other case the public function calls the op, whose dispatcher
# materialises neg/conj views, routes meta tensors to the fake, and shows the op to tracers and modes.
Tensor, _PLAIN_TYPES, _STRIDED = torch.Tensor, (torch.Tensor, torch.nn.Parameter), torch.strided
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state  # torch.jit.trace
_dispatch_modes = torch._C._len_torch_dispatch_stack  # profilers, op counters, FakeTensorMode
_function_modes = torch._C._len_torch_function_stack  # e.g. `with torch.device("meta")`
_functorch_active = torch._C._are_functorch_transforms_active
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_grad_enabled = torch.is_grad_enabled


def _context_needs_op() -> bool:
    """torch.compile or jit.trace tracing, an active dispatch or function mode, or a functorch transform."""
    return (_is_compiling() or _tracing_state() is not None or _dispatch_modes() > 0 or _function_modes() > 0
            or _functorch_active())


def _is_plain(t: torch.Tensor) -> bool:
    """Exactly Tensor/Parameter (not DTensor, FakeTensor, ...), strided, not meta, no neg/conj bit, and not a
    functorch wrapper (a tensor that escaped a torch.func transform wraps one that holds the data)."""
    return (type(t) in _PLAIN_TYPES and t.layout is _STRIDED and not t.is_meta
            and not t.is_neg() and not t.is_conj() and not _functorch_wrapped(t))


def _plain_call(args) -> Optional[bool]:
    """None when the call must go through the op (the rule above, for every tensor in ``args``; ``None`` and
    non-tensor arguments pass), else whether a gradient is needed (grad mode on, a tensor requiring grad)."""
    if _context_needs_op():
        return None
    needs_grad = False
    for arg in args:
        if isinstance(arg, Tensor):
            if not _is_plain(arg):
                return None
            needs_grad = needs_grad or arg.requires_grad
    return needs_grad and _grad_enabled()


def eager_call_allowed(*tensors) -> bool:
    """The rule above for code outside the entry points that launches kernels directly (``None`` ignored)."""
    return _plain_call(tensors) is not None


def eager_kernels_allowed(*tensors) -> bool:
    """Whether a backward formula may launch its kernels instead of calling its backward op: the rule above,
    and no tensor needing a graph (so that create_graph=True reaches the backward op's double-backward error)."""
    return _plain_call(tensors) is False


def forbid_double_backward(op: "torch._ops.OpOverload", forward_name: str) -> None:
    """Give a backward op an autograd formula that raises, so create_graph=True fails with a clear message
    instead of silently returning wrong second derivatives."""

    def _backward(ctx, *grads):
        raise NotImplementedError(
            f"double backward (a gradient of the gradient) of npu_liger::{forward_name} is not supported"
        )

    def _setup_context(ctx, inputs, output):
        return None

    define_autograd(op, backward=_backward, setup_context=_setup_context)


__all__ = ["CHUNKED_LOSS", "EagerPath", "LIBRARY", "NAMESPACE", "OPAQUE_IN_GRAPHS", "call_op", "define_autograd",
           "define_composite", "define_entry", "define_op", "eager_call_allowed", "eager_kernels_allowed",
           "forbid_double_backward"]
