"""The contract every op keeps, checked for every op of ``op_cases.CASES`` (a new op is checked by adding its case):

- every tensor argument, and every incoming gradient, in every layout of ``checklist.LAYOUTS`` (strided, offset,
  transposed, expanded views kept as views up to the call) gives what the same values stored contiguously give;
- NaN in any floating argument gives NaN exactly where torch's reference gives it (outputs and gradients);
- non-reentrant activation checkpointing (what ``gradient_checkpointing_enable()`` uses) gives the same gradients;
- a create_graph backward either gives torch's second derivatives or raises NotImplementedError: never a
  gradient silently cut off from the graph;
- ``torch.func.grad`` gives autograd's gradients, or its error names the op.
"""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import npu_liger
from checklist import assert_no_alias, assert_unchanged, in_layout, layouts_for, randn, snapshot
from op_cases import CASES, OPS, public_name, run_op


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _public(name):
    return getattr(npu_liger, public_name(name))


def _with(args: tuple, replacements: dict) -> tuple:
    return tuple(replacements.get(i, a) for i, a in enumerate(args))


def _leaves(args: tuple, positions) -> tuple:
    """``args`` with the tensors at ``positions`` made leaves that require grad (views stay views)."""
    return _with(args, {i: args[i].detach().requires_grad_(True) for i in positions})


def _run_with_grads(fn, args: tuple, positions, grad_layout: str = "contiguous", grads_out=None):
    """(outputs, gradients of the arguments at ``positions``, the incoming gradients used)."""
    leaves = _leaves(args, positions)
    outs = _flat(fn(*leaves))
    if grads_out is None:
        grads_out = [in_layout(randn(o.shape, o.dtype), grad_layout) if o.is_floating_point() else None for o in outs]
    pairs = [(o, g) for o, g in zip(outs, grads_out) if g is not None and o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return outs, [leaves[i].grad for i in positions], grads_out


def _assert_same_values(got: list, want: list, what: str):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what} {i}: {g.shape}/{g.dtype} vs {w.shape}/{w.dtype}"
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"{what} {i}: {m}")


@pytest.mark.parametrize("name", OPS)
def test_every_argument_in_every_layout(name):
    """Each tensor argument in turn in each layout, the others contiguous: outputs and gradients equal those of
    contiguous copies of the same values, no input is written, no output aliases an input."""
    case = CASES[name]
    args = case.make()
    for pos, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            continue
        for layout in layouts_for(arg):
            viewed = _with(args, {pos: in_layout(arg, layout)})
            plain = _with(viewed, {pos: viewed[pos].contiguous()})
            before = snapshot(viewed)
            outs, grads, grads_out = _run_with_grads(_public(name), viewed, case.grads)
            assert_unchanged(before, viewed, [f"argument {i}" for i in range(len(viewed))])
            assert_no_alias([*outs, *grads], [a for a in viewed if isinstance(a, torch.Tensor)])
            want_outs, want_grads, _ = _run_with_grads(_public(name), plain, case.grads, grads_out=grads_out)
            _assert_same_values(outs, want_outs, f"{name}, argument {pos} {layout}: output")
            _assert_same_values(grads, want_grads, f"{name}, argument {pos} {layout}: gradient")


@pytest.mark.parametrize("name", OPS)
def test_incoming_gradients_in_every_layout(name):
    case = CASES[name]
    args = case.make()
    _, _, grads_out = _run_with_grads(_public(name), args, case.grads)
    for grad in grads_out:
        if grad is None:
            continue
        for layout in layouts_for(grad):
            viewed = [None if g is None else in_layout(g, layout if g is grad else "contiguous") for g in grads_out]
            before = snapshot(viewed)
            _, got, _ = _run_with_grads(_public(name), args, case.grads, grads_out=viewed)
            assert_unchanged(before, viewed, ["incoming gradient"] * len(viewed))
            plain = [None if g is None else g.contiguous() for g in viewed]
            _, want, _ = _run_with_grads(_public(name), args, case.grads, grads_out=plain)
            _assert_same_values(got, want, f"{name}, incoming gradient {layout}: gradient")


def _nan_positions(args: tuple) -> list:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())
            and a.numel() > 0]


@pytest.mark.parametrize("name", OPS)
def test_nan_in_gives_nan_where_torch_does(name):
    """One NaN in each floating argument in turn: the NaN pattern of every output and gradient is torch's
    (a NaN logit must not give a finite loss, a NaN weight must not vanish in a clamp)."""
    case = CASES[name]
    for pos in _nan_positions(case.make()):
        args = case.make()
        poisoned = args[pos].detach().clone()
        poisoned.view(-1)[torch.randint(0, poisoned.numel(), ()).item()] = float("nan")
        args = _with(args, {pos: poisoned})
        outs, grads, grads_out = _run_with_grads(_public(name), args, case.grads)
        ref_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        ref_outs, ref_grads, _ = _run_with_grads(case.reference, ref_args, case.grads, grads_out=grads_out)
        for what, got, want in (("output", outs, ref_outs), ("gradient", grads, ref_grads)):
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert torch.equal(g.isnan(), w.isnan()), (
                    f"{name}, NaN in argument {pos}: {what} {i} has NaN at {g.isnan().sum().item()} places, "
                    f"torch at {w.isnan().sum().item()}")


def _weighted_sum(fn, n_args: int, positions, args: tuple, weights: list):
    """A scalar of the op's outputs (each times a fixed random tensor), as a function of the differentiable
    arguments only."""

    def scalar(*tensors):
        outs = _flat(fn(*_with(args, dict(zip(positions, tensors)))))
        return sum((o.float() * w).sum() for o, w in zip(outs, weights) if o.is_floating_point())

    return scalar


def _weights_for(name, args):
    outs = _flat(_public(name)(*args))
    return [randn(o.shape) if o.is_floating_point() else None for o in outs]


@pytest.mark.parametrize("name", OPS)
def test_non_reentrant_checkpointing(name):
    case = CASES[name]
    args = case.make()
    weights = _weights_for(name, args)
    scalar = _weighted_sum(_public(name), len(args), case.grads, args, weights)
    plain = [args[i].detach().requires_grad_(True) for i in case.grads]
    scalar(*plain).backward()
    checkpointed = [args[i].detach().requires_grad_(True) for i in case.grads]
    checkpoint(scalar, *checkpointed, use_reentrant=False).backward()
    _assert_same_values([t.grad for t in checkpointed], [t.grad for t in plain], f"{name} under checkpoint: gradient")


@pytest.mark.parametrize("entry", ["public", "op"])
@pytest.mark.parametrize("name", OPS)
def test_double_backward_is_right_or_refused(name, entry):
    """``grad(create_graph=True)`` then a gradient penalty, through the public function and through the op:
    torch's second derivatives, or NotImplementedError at either step. A first gradient that does not require
    grad where torch's does is the silent failure."""
    case = CASES[name]
    call = _public(name) if entry == "public" else lambda *args: run_op(name, args)
    args = case.make()
    weights = _weights_for(name, args)

    def first_and_second(fn, convert):
        leaves = [convert(args[i]).detach().requires_grad_(True) for i in case.grads]
        rest = tuple(convert(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        scalar = _weighted_sum(fn, len(args), case.grads, rest, [None if w is None else convert(w) for w in weights])
        grads = torch.autograd.grad(scalar(*leaves), leaves, create_graph=True, allow_unused=True)
        differentiable = [g for g in grads if g is not None and g.requires_grad]
        if differentiable:
            penalty = sum((g ** 2).sum() for g in differentiable)
            torch.autograd.backward(penalty)
        return [g is not None and g.requires_grad for g in grads], [t.grad for t in leaves]

    want_graph, want_second = first_and_second(CASES[name].reference, lambda t: t.double())
    try:
        got_graph, got_second = first_and_second(call, lambda t: t)
    except NotImplementedError as error:
        assert "double backward" in str(error) and public_name(name) in str(error), str(error)
        return
    assert got_graph == want_graph, f"{name}: first gradients require grad {got_graph}, torch's {want_graph}"
    for i, (g, w) in enumerate(zip(got_second, want_second, strict=True)):
        if w is None or g is None:
            assert (g is None or not g.any()) and (w is None or not w.any()), f"{name}: second derivative {i}"
            continue
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", OPS)
def test_torch_func_grad_matches_autograd_or_names_the_op(name):
    case = CASES[name]
    args = case.make()
    weights = _weights_for(name, args)
    scalar = _weighted_sum(_public(name), len(args), case.grads, args, weights)
    leaves = [args[i].detach().requires_grad_(True) for i in case.grads]
    scalar(*leaves).backward()
    try:
        got = torch.func.grad(scalar, argnums=tuple(range(len(case.grads))))(*[t.detach() for t in leaves])
    except Exception as error:  # noqa: BLE001 - any error is acceptable if it says which op refused
        op = public_name(name)
        assert f"npu_liger::{op}" in str(error) or f"npu_liger.{op}" in str(error), str(error)
        return
    _assert_same_values(list(got), [t.grad for t in leaves], f"{name} under torch.func.grad: gradient")
