"""Registration shared by the rotary family (rope, qwen2vl_mrope, llama4_rope):

    <op>(Tensor q, Tensor k, <tables>) -> (Tensor, Tensor)
    <op>_backward(Tensor grad_q, Tensor grad_k, <tables>) -> (Tensor, Tensor)

The rotation is linear, so the backward needs only the tables (saved), never q or k; the tables get no gradient.
The backward op's trusted kernel (``define_op``) skips the input checks in plain eager backward passes.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch

from ._op import call_op, define_autograd, define_op, forbid_double_backward
from ._sharding import sharding_rule


def define_rotary_op(name: str, tables_schema: str, *, forward: Callable, backward: Callable,
                     launch_backward: Callable, check: Callable, new_output: Callable,
                     qk_dims: Tuple[int, int, int], table_batch_dim: int) -> Tuple[object, object, Callable]:
    """Define ``npu_liger::<name>`` and ``npu_liger::<name>_backward``.

    ``tables_schema``: the schema of the arguments after q and k (e.g. ``"Tensor cos, Tensor sin"``).
    ``forward``/``backward``: the op's checking launchers; ``launch_backward(grad_q, grad_k, *tables)``: the
    backward launch without re-checking (autograd's gradients have the outputs' shape, dtype and device; the
    tables were checked by the forward). ``check(q, k, *tables, names=...)`` validates (fakes use it);
    ``new_output(x)`` allocates an output like the kernel's (metadata only). ``qk_dims``: q/k's (batch, heads,
    seq) dims and ``table_batch_dim`` the tables' batch dim, for the sharding rule (``rotary_sharding``).
    Returns (op, backward op, eager entry point)."""

    def fake(q, k, *tables):
        check(q, k, *tables)
        return new_output(q), new_output(k)

    def backward_fake(grad_q, grad_k, *tables):
        check(grad_q, grad_k, *tables, names=("grad_q", "grad_k"))
        return new_output(grad_q), new_output(grad_k)

    op = define_op(f"{name}(Tensor q, Tensor k, {tables_schema}) -> (Tensor, Tensor)", kernel=forward, fake=fake)
    backward_op = define_op(f"{name}_backward(Tensor grad_q, Tensor grad_k, {tables_schema}) -> (Tensor, Tensor)",
                            kernel=backward, fake=backward_fake, trusted_kernel=launch_backward)

    def setup_context(ctx, inputs, output):
        tables = inputs[2:]
        ctx.save_for_backward(*(t for t in tables if isinstance(t, torch.Tensor)))
        ctx.constants = [None if isinstance(t, torch.Tensor) else t for t in tables]  # e.g. mrope_section

    def backward_formula(ctx, grad_q, grad_k):
        saved = iter(ctx.saved_tensors)  # unpacked once: non-reentrant checkpointing allows no second unpack
        tables = [next(saved) if constant is None else constant for constant in ctx.constants]
        return (*call_op(backward_op, grad_q, grad_k, *tables), *([None] * len(tables)))

    entry = define_autograd(op, backward=backward_formula, setup_context=setup_context, kernel=forward)
    forbid_double_backward(backward_op, name)
    table_names = [part.split()[-1] for part in tables_schema.split(",") if part.split()[0] == "Tensor"]
    rule, backward_rule = rotary_sharding(qk_dims, table_names, table_batch_dim)
    sharding_rule(op)(rule)
    sharding_rule(backward_op)(backward_rule)
    return op, backward_op, entry


def rotary_sharding(qk_dims: Tuple[int, int, int], table_names, table_batch_dim: int):
    """q/k sharded on batch, heads or seq (never head_dim: it holds the rotary pairs). The tables (all of one
    shape) follow the batch when they carry one (size > 1 at ``table_batch_dim``), follow the sequence on their
    seq dim (always ndim - 2), else are replicated. Backward: the same, plus the gradients P with the tables R
    (linear in the gradients)."""
    batch_dim, heads_dim, seq_dim = qk_dims

    def cases(p, first, second, table):
        S = p.S
        t_batch = S(table_batch_dim) if table.ndim >= 3 and table.shape[table_batch_dim] > 1 else p.R
        layouts = [(p.R, p.R), (S(batch_dim), t_batch), (S(heads_dim), p.R), (S(seq_dim), S(table.ndim - 2))]
        return [p.case([qk, qk], **{first: qk, second: qk}, **{n: tab for n in table_names})
                for qk, tab in layouts]

    def rule(p, q, k, table, *args):
        return cases(p, "q", "k", table)

    def backward_rule(p, grad_q, grad_k, table, *args):
        return cases(p, "grad_q", "grad_k", table) + [p.case([p.P, p.P], grad_q=p.P, grad_k=p.P)]

    return rule, backward_rule
