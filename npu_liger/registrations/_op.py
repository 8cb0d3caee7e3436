"""The one helper every op registration uses: define a schema, bind its device kernels and fake, add autograd.

Ops are defined with ``torch.library.Library.define`` / ``impl`` (cheaper per call than ``custom_op``'s
Python wrapper) and registered for every backend key: ``CPU`` (Triton interpreter), ``CUDA`` and
``PrivateUse1`` (the key torch_npu renames to "npu"; registering the key rather than the name works whether
torch_npu is imported before or after npu_liger, and touches no driver).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..npu_ops._triton import serialized

NAMESPACE = "npu_liger"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
DEVICE_DISPATCH_KEYS = ("CPU", "CUDA", "PrivateUse1")
_KERNELS = {}  # op overload -> its device kernel (serialised), for ``call_op``
_FORMULAS = {}  # op overload -> its autograd formula's apply, for ``call_op`` under torch.func transforms


def define_op(schema: str, *, kernel: Callable, fake: Callable) -> "torch._ops.OpOverload":
    """Define ``npu_liger::<schema>`` with ``kernel`` on every device key and ``fake`` for tracing.

    Returns the bound overload (``torch.ops.npu_liger.<name>.default``) so callers skip attribute lookups.
    """
    name = schema.split("(", 1)[0].strip()
    kernel = serialized(kernel)
    LIBRARY.define(schema)
    for key in DEVICE_DISPATCH_KEYS:
        LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    _KERNELS[overload] = kernel
    return overload


def call_op(op: "torch._ops.OpOverload", *args):
    """``op(*args)`` from an autograd formula (typically a backward op): in plain eager code that records no
    graph (``eager_kernels_allowed``) the op's kernel runs directly, without the dispatcher's round trip; in
    every other case (tracing, modes, create_graph=True, which reaches the double-backward error) the op."""
    if eager_kernels_allowed(*[a for a in args if isinstance(a, Tensor)]):
        return _KERNELS[op](*args)
    if _functorch_active() and op in _FORMULAS:  # see _register_autograd
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


def define_autograd(
    op: "torch._ops.OpOverload", *, backward: Callable, setup_context: Callable, kernel: Optional[Callable] = None
) -> Callable:
    """Register ``backward``/``setup_context`` as the op's autograd formula.

    Returns the op's eager entry point: with ``kernel`` (the op's device launcher), a function that skips the
    dispatcher in plain eager calls (see ``_eager_entry``); without, the op itself.
    """
    formula_apply = _register_autograd(op, backward, setup_context, public=kernel is not None)
    if kernel is None:
        return op
    return _eager_entry(op, serialized(kernel), backward, setup_context, formula_apply)


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


def _eager_entry(op, kernel: Callable, backward: Callable, setup_context: Callable,
                 formula_apply: Callable) -> Callable:
    """The quack-style eager bypass: the same kernels and autograd formula without the dispatcher's Python
    round trips (a few µs per call instead of ~15). Taken only when ``eager_kernels_allowed`` says so; every other
    call is the real op, except under torch.func transforms, which apply the op's formula (``_register_autograd``).
    Call it with every schema argument positionally."""

    def forward(ctx, *args):
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    def backward_(ctx, *grads):
        return backward(ctx, *grads)

    # Built with type() so autograd's node is named after the op (e.g. GegluEagerBackward).
    # Old-style forward(ctx, ...): measurably cheaper per call than forward + setup_context.
    EagerAutograd = type(_class_name(op, "Eager"), (torch.autograd.Function,),
                         {"forward": staticmethod(forward), "backward": staticmethod(backward_)})
    apply = EagerAutograd.apply
    grad_enabled = torch.is_grad_enabled

    def entry(*args):
        if _context_needs_op():
            return formula_apply(*args) if _functorch_active() else op(*args)
        needs_grad = False
        for arg in args:
            if isinstance(arg, Tensor):
                if not _is_plain(arg):
                    return op(*args)
                needs_grad = needs_grad or arg.requires_grad
        if needs_grad and grad_enabled():
            return apply(*args)
        return kernel(*args)

    return entry


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


def _context_needs_op() -> bool:
    """torch.compile or jit.trace tracing, an active dispatch or function mode, or a functorch transform."""
    return (_is_compiling() or _tracing_state() is not None or _dispatch_modes() > 0 or _function_modes() > 0
            or _functorch_active())


def _is_plain(t: torch.Tensor) -> bool:
    """Exactly Tensor/Parameter (not DTensor, FakeTensor, ...), strided, not meta, no neg/conj bit."""
    return (type(t) in _PLAIN_TYPES and t.layout is _STRIDED and not t.is_meta
            and not t.is_neg() and not t.is_conj())


def eager_call_allowed(*tensors) -> bool:
    """The rule above for code outside ``define_autograd`` that launches kernels directly (``None`` ignored)."""
    if _context_needs_op():
        return False
    return all(t is None or _is_plain(t) for t in tensors)


def eager_kernels_allowed(*tensors) -> bool:
    """Whether a backward formula may launch its kernels instead of calling its backward op: the rule above,
    and no tensor needing a graph (so that create_graph=True reaches the backward op's double-backward error)."""
    if not eager_call_allowed(*tensors):
        return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


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


__all__ = ["LIBRARY", "NAMESPACE", "call_op", "define_autograd", "define_composite", "define_op", "eager_call_allowed",
           "eager_kernels_allowed", "forbid_double_backward"]
