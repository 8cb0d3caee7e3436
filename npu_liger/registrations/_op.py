"""The one helper every op registration uses: define a schema, bind its device kernels and fake, add autograd.

Ops are defined with ``torch.library.Library.define`` / ``impl`` (cheaper per call than ``custom_op``'s
Python wrapper) and registered for every backend key: ``CPU`` (Triton interpreter), ``CUDA`` and
``PrivateUse1`` (the key torch_npu renames to "npu"; registering the key rather than the name works whether
torch_npu is imported before or after npu_liger, and touches no driver).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

NAMESPACE = "npu_liger"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
DEVICE_DISPATCH_KEYS = ("CPU", "CUDA", "PrivateUse1")


def define_op(schema: str, *, kernel: Callable, fake: Callable) -> "torch._ops.OpOverload":
    """Define ``npu_liger::<schema>`` with ``kernel`` on every device key and ``fake`` for tracing.

    Returns the bound overload (``torch.ops.npu_liger.<name>.default``) so callers skip attribute lookups.
    """
    name = schema.split("(", 1)[0].strip()
    LIBRARY.define(schema)
    for key in DEVICE_DISPATCH_KEYS:
        LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


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
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=LIBRARY)
    if kernel is None:
        return op
    return _eager_entry(op, kernel, backward, setup_context)


def _eager_entry(op, kernel: Callable, backward: Callable, setup_context: Callable) -> Callable:
    """The quack-style eager bypass: the same kernels and autograd formula without the dispatcher's Python
    round trips (a few µs per call instead of ~15).

    Falls back to the real op whenever something must see it: torch.compile tracing (so the op stays one
    opaque graph node), an active TorchDispatchMode (profilers, op counters, FakeTensorMode), functorch
    transforms, and tensor subclasses such as DTensor. Call it with every schema argument positionally.
    """

    def forward(ctx, *args):
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    def backward_(ctx, *grads):
        return backward(ctx, *grads)

    # Built with type() so autograd's node is named after the op (e.g. GegluEagerBackward).
    # Old-style forward(ctx, ...): measurably cheaper per call than forward + setup_context.
    name = "".join(part.title() for part in op._schema.name.split("::")[-1].split("_")) + "Eager"
    EagerAutograd = type(name, (torch.autograd.Function,),
                         {"forward": staticmethod(forward), "backward": staticmethod(backward_)})
    apply = EagerAutograd.apply
    is_compiling = torch.compiler.is_compiling
    functorch_active = torch._C._are_functorch_transforms_active
    grad_enabled = torch.is_grad_enabled
    Tensor, Parameter = torch.Tensor, torch.nn.Parameter

    def entry(*args):
        if is_compiling() or _dispatch_mode_active() or functorch_active():
            return op(*args)
        needs_grad = False
        for arg in args:
            if isinstance(arg, Tensor):
                if type(arg) is not Tensor and type(arg) is not Parameter:
                    return op(*args)  # DTensor, FakeTensor, FunctionalTensor, ...
                needs_grad = needs_grad or arg.requires_grad
        if needs_grad and grad_enabled():
            return apply(*args)
        return kernel(*args)

    return entry


def _dispatch_mode_active() -> bool:
    return torch._C._len_torch_dispatch_stack() > 0


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


__all__ = ["LIBRARY", "define_op", "define_composite", "define_autograd", "forbid_double_backward"]
