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


def define_autograd(
    op: "torch._ops.OpOverload", *, backward: Callable, setup_context: Callable
) -> None:
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=LIBRARY)


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


__all__ = ["LIBRARY", "define_op", "define_autograd", "forbid_double_backward"]
