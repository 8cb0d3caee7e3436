"""The numerics check of the dyt, poly_norm and group_norm tests: forward and every input gradient against float64
(half precision also against the eager reference in that precision, ``checklist.assert_close``'s rule), inputs
untouched and never aliased.

Some gradients are sums over many elements whose signs cancel: DyT's alpha and PolyNorm's weight and bias are
scalars summed over every element of x. Any fp32 summation of n terms is off by a few roundings of sum(|terms|),
however small the sum itself comes out, so a relative tolerance alone fails at random (a sum of 8000 N(0, 1)
terms is below 1 in magnitude one time in a hundred). Those gradients are judged against the size of their terms
too: ``sum_terms`` gives, in float64, sum(|term|) for each of them (shaped as the gradient), and the tolerance
grows by ``SUM_RTOL`` of its norm. A wrong kernel is off by a sizeable fraction of the sum, far outside that.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from checklist import (FP32_RTOL, assert_no_alias, assert_unchanged, half_precision_tolerance, randn, snapshot)

SUM_RTOL = 1e-6  # ~16 fp32 unit roundoffs of sum(|terms|): a blocked fp32 sum of up to millions of terms


def _norm(t: torch.Tensor) -> float:
    return t.detach().double().cpu().norm().item()


def assert_grad_close(got: torch.Tensor, ref64: torch.Tensor, eager: Optional[torch.Tensor], terms, what: str):
    assert got.shape == ref64.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    if got.numel() == 0:
        return
    if got.dtype == torch.float32:
        rtol = FP32_RTOL
    else:
        # eager's own error, floored at one rounding; an eager run that overflowed (fp16 inf/NaN: CI drew it for
        # poly_norm's x gradient) is no yardstick, and checklist then floors at two roundings
        rtol = half_precision_tolerance(eager, ref64, got.dtype)
    tol = rtol * _norm(ref64) + (SUM_RTOL * _norm(terms) if terms is not None else 0.0)
    err = _norm(got.double().cpu() - ref64.double().cpu())
    assert err <= tol, f"{what} ({got.dtype}): error {err:.3e} > tolerance {tol:.3e} (|ref| {_norm(ref64):.3e})"


def check_op(fn: Callable, reference: Callable, inputs: tuple, names: tuple,
             sum_terms: Optional[Callable[..., Dict[str, torch.Tensor]]] = None):
    """``fn(*inputs)`` and the gradients of every tensor input against ``reference`` (float64 and, for half
    precision, the inputs' own dtypes). ``inputs``: tensors (made leaves here) or other arguments; ``names``: one
    per tensor input. ``sum_terms(*inputs64, grad_out64)`` -> {name: sum(|terms|)} for summed gradients. Returns
    the outputs."""
    leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in inputs]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    before = snapshot(tensors)
    out = fn(*leaves)
    grad_out = randn(out.shape, out.dtype)
    out.backward(grad_out)
    assert_unchanged(before, tensors, names)
    assert_no_alias([out, *(t.grad for t in tensors)], tensors)

    def run(convert):
        ref_leaves = [convert(t).detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in leaves]
        ref = reference(*ref_leaves)
        ref.backward(grad_out.to(ref.dtype))
        return ref, [t.grad for t in ref_leaves if isinstance(t, torch.Tensor)], ref_leaves

    out64, grads64, leaves64 = run(lambda t: t.double())
    out_lp, grads_lp, _ = run(lambda t: t.clone())
    assert out.dtype == out_lp.dtype and out.shape == out_lp.shape and out.is_contiguous()
    assert_grad_close(out, out64, out_lp, None, "output")
    terms = {}
    if sum_terms is not None:
        with torch.no_grad():
            terms = sum_terms(*[t.detach() if isinstance(t, torch.Tensor) else t for t in leaves64],
                              grad_out.double())
    for name, t, g64, g_lp in zip(names, tensors, grads64, grads_lp, strict=True):
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, f"grad of {name}: {t.grad.dtype} {t.grad.shape}"
        assert_grad_close(t.grad, g64, g_lp, terms.get(name), f"grad of {name}")
    return out


def assert_compiled_matches_eager(fn: Callable, make_inputs: Callable[[int], tuple], sizes):
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` gives eager ``fn``'s output and gradients (the same
    kernels on the same values: the float64 judgement is the eager tests') for every size, and nothing recompiles
    after the first."""
    from checklist import assert_compiles_without_recompiles

    def grads_of(out, inputs, weights):
        leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        return torch.autograd.grad((out * weights).sum(), leaves)

    def check(inputs, got, _):
        weights = randn(got.shape)
        detached = [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
        want = fn(*detached)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for g, w in zip(grads_of(got, inputs, weights), grads_of(want, detached, weights), strict=True):
            # A parameter's gradient sums out.numel() / g.numel() terms, and the compiled graph rounds the upstream
            # gradient (the fused sin backward) differently from eager: one rounding per term, a random walk, so
            # the difference grows like sqrt(terms). A lost or doubled term is still off by a whole term (~1).
            terms_per_entry = max(1, got.numel() // g.numel())
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * terms_per_entry ** 0.5)

    assert_compiles_without_recompiles(fn, make_inputs, sizes, check)
