"""Registration shared by the rotary family (rope, qwen2vl_mrope, llama4_rope):

    <op>(Tensor q, Tensor k, <tables>) -> (Tensor, Tensor)
    <op>_backward(Tensor grad_q, Tensor grad_k, <tables>) -> (Tensor, Tensor)

The rotation is linear, so the backward needs only the tables (saved), never q or k; the tables get no gradient.
In plain eager backward passes the formula launches the kernels directly (``eager_kernels_allowed``), saving the
dispatcher round trip and the backward op's Python wrapper (tens of µs per call on a slow host); everywhere else
(torch.compile, dispatch modes, DTensor, create_graph) it calls the backward op.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch

from ..npu_ops._triton import serialized
from ._op import define_autograd, define_op, eager_kernels_allowed, forbid_double_backward


def define_rotary_op(name: str, tables_schema: str, *, forward: Callable, backward: Callable,
                     launch_backward: Callable, check: Callable, new_output: Callable) -> Tuple[object, object, Callable]:
    """Define ``npu_liger::<name>`` and ``npu_liger::<name>_backward``.

    ``tables_schema``: the schema of the arguments after q and k (e.g. ``"Tensor cos, Tensor sin"``).
    ``forward``/``backward``: the op's checking launchers; ``launch_backward(grad_q, grad_k, *tables)``: the
    backward launch without re-checking (autograd's gradients have the outputs' shape, dtype and device; the
    tables were checked by the forward). ``check(q, k, *tables, names=...)`` validates (fakes use it);
    ``new_output(x)`` allocates an output like the kernel's (metadata only).
    Returns (op, backward op, eager entry point)."""

    def fake(q, k, *tables):
        check(q, k, *tables)
        return new_output(q), new_output(k)

    def backward_fake(grad_q, grad_k, *tables):
        check(grad_q, grad_k, *tables, names=("grad_q", "grad_k"))
        return new_output(grad_q), new_output(grad_k)

    op = define_op(f"{name}(Tensor q, Tensor k, {tables_schema}) -> (Tensor, Tensor)", kernel=forward, fake=fake)
    backward_op = define_op(f"{name}_backward(Tensor grad_q, Tensor grad_k, {tables_schema}) -> (Tensor, Tensor)",
                            kernel=backward, fake=backward_fake)
    direct_backward = serialized(launch_backward)

    def setup_context(ctx, inputs, output):
        tables = inputs[2:]
        ctx.save_for_backward(*(t for t in tables if isinstance(t, torch.Tensor)))
        ctx.constants = [None if isinstance(t, torch.Tensor) else t for t in tables]  # e.g. mrope_section

    def backward_formula(ctx, grad_q, grad_k):
        # ctx.saved_tensors read once: non-reentrant activation checkpointing unpacks each saved tensor once
        saved = ctx.saved_tensors
        remaining = iter(saved)
        tables = [next(remaining) if constant is None else constant for constant in ctx.constants]
        if eager_kernels_allowed(grad_q, grad_k, *saved):
            grads = direct_backward(grad_q, grad_k, *tables)
        else:
            grads = backward_op(grad_q, grad_k, *tables)
        return (*grads, *([None] * len(tables)))

    entry = define_autograd(op, backward=backward_formula, setup_context=setup_context, kernel=forward)
    forbid_double_backward(backward_op, name)
    return op, backward_op, entry
