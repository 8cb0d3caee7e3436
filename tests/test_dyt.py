"""dyt: Dynamic Tanh against float64 (half precision against the eager formula in that precision), every
parameter gradient, both tile shapes (several narrow rows per tile; a row split over column blocks), fp32
parameters with half x, opcheck, compile, determinism, empty and bad input, the nn module."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from checklist import DEVICE, FLOAT_DTYPES, UNIT_ROUNDOFF, assert_close, randn, rel_error, run_opcheck
from norm_checks import assert_compiled_matches_eager, assert_grad_close, check_op
from npu_liger.npu_ops import dyt as dyt_kernels
from op_cases import dyt_reference

COLS = st.sampled_from([1, 2, 7, 33, 128, 257, 600])
LEADING = st.sampled_from([(1,), (5,), (3, 4), (2, 3, 7), (45,)])


def _params(n_cols, dtype, beta=True, alpha_shape=(1,)):
    alpha = (randn(alpha_shape) * 0.3 + 0.6).to(dtype)  # tanh's argument spans its curved part and its tails
    return alpha, randn((n_cols,), dtype), randn((n_cols,), dtype) if beta else None


def _sum_terms(x, alpha, gamma, beta, dy):
    """sum(|term|) of each parameter gradient (``norm_checks``): alpha's over every element, gamma's and beta's
    per column. x's gradient sums nothing: it is judged against itself."""
    t = torch.tanh(alpha * x)

    def per_column(v):
        return v.abs().reshape(-1, v.shape[-1]).sum(0)

    return {"alpha": (dy * gamma * x * (1.0 - t * t)).abs().sum().reshape(alpha.shape), "gamma": per_column(dy * t),
            "beta": per_column(dy)}


def _check(x, alpha, gamma, beta):
    """Forward and every gradient (beta's when present) against the reference."""
    names = ("x", "alpha", "gamma") + (("beta",) if beta is not None else ())
    return check_op(npu_liger.dyt, dyt_reference, (x, alpha, gamma, beta), names, _sum_terms)


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), beta=st.booleans(),
       noncontiguous=st.booleans(), scalar_alpha=st.booleans())
def test_dyt_matches_reference(leading, n_cols, dtype, beta, noncontiguous, scalar_alpha):
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous, scale=2.0)
    _check(x, *_params(n_cols, dtype, beta, () if scalar_alpha else (1,)))


def test_small_arguments_keep_full_precision():
    """tanh's series branch: |alpha * x| < 0.25 must not lose digits to 1 - e^-2|y| cancelling (and 0 gives 0)."""
    x = randn((6, 50), scale=1e-3)
    x[0, 0] = 0.0
    alpha, gamma, beta = _params(50, torch.float32)
    out = npu_liger.dyt(x, alpha, gamma)
    ref = dyt_reference(x.double(), alpha.double(), gamma.double())
    assert rel_error(out, ref) <= 1e-6 and out[0, 0] == 0.0
    saturated = npu_liger.dyt(torch.tensor([[-1e4, 1e4, float("inf")]], device=DEVICE), torch.ones(1, device=DEVICE),
                              torch.ones(3, device=DEVICE))
    assert saturated.tolist() == [[-1.0, 1.0, 1.0]]


def test_saturated_arguments_keep_full_precision_in_the_gradients():
    """Where tanh nears +-1, 1 - tanh^2 is small and 1 - t * t from a rounded t keeps few of its digits (CI drew one
    element at |alpha * x| ~ 5.6: alpha's gradient off by 1.5e-4). For 4 <= |alpha * x| <= 9 each element of x's
    gradient stays within (2 |alpha * x| + 8) fp32 unit roundoffs of float64 (e^-2|y| turns y's one rounding into
    2|y| of them; a few more for the products), and alpha's, a sum of positive terms, within fp32's tolerance."""
    shape = (4, 64)
    sign = torch.where(torch.rand(shape, device=DEVICE) < 0.5, -1.0, 1.0)
    x = (torch.rand(shape, device=DEVICE) * 5.0 + 4.0) * sign
    alpha, gamma = torch.ones(1, device=DEVICE), torch.rand(64, device=DEVICE) + 0.5
    dy = (torch.rand(shape, device=DEVICE) + 0.5) * sign
    dx, dalpha, _, _ = torch.ops.npu_liger.dyt_backward(dy, x, alpha, gamma, None)
    leaves64 = [t.double().requires_grad_(True) for t in (x, alpha, gamma)]
    dyt_reference(*leaves64).backward(dy.double())
    ref_dx = leaves64[0].grad
    bound = (2.0 * x.abs().double() + 8.0) * 2.0**-24 * ref_dx.abs()
    assert bool(((dx.double() - ref_dx).abs() <= bound).all()), float(((dx.double() - ref_dx) / ref_dx).abs().max())
    assert_close(dalpha, leaves64[1].grad, what="grad of alpha")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_parameters_with_half_x(dtype):
    """The result is in x's dtype (rounded once from fp32: within one unit roundoff of float64), each gradient in
    its input's dtype; the fp32 parameter gradients are fp32-accurate sums."""
    x = randn((9, 40), dtype, requires_grad=True)
    alpha, gamma, beta = (t.requires_grad_(True) for t in _params(40, torch.float32))
    out = npu_liger.dyt(x, alpha, gamma, beta)
    dy = randn(out.shape, dtype)
    out.backward(dy)
    leaves64 = [t.detach().double().requires_grad_(True) for t in (x, alpha, gamma, beta)]
    ref = dyt_reference(*leaves64)
    ref.backward(dy.double())
    assert out.dtype == dtype and rel_error(out, ref) <= UNIT_ROUNDOFF[dtype]
    assert x.grad.dtype == dtype and rel_error(x.grad, leaves64[0].grad) <= UNIT_ROUNDOFF[dtype]
    terms = _sum_terms(*[t.detach() for t in leaves64], dy.double())
    for name, t, t64 in zip(("alpha", "gamma", "beta"), (alpha, gamma, beta), leaves64[1:]):
        assert t.grad.dtype == torch.float32
        assert_grad_close(t.grad, t64.grad, None, terms[name], name)


def test_tiles_pack_narrow_rows_and_split_wide_ones(small_ub):
    """A 4 KiB UB: 300-wide rows split over column blocks shared out between programs (each walks its rows), 24-wide
    rows go several per tile; 85 row tiles over 40 programs take several iterations."""
    small_ub(4096)
    wide = dyt_kernels.plan_dyt("cpu", 9, 300, dyt_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
    narrow = dyt_kernels.plan_dyt("cpu", 85 * 4, 24, dyt_kernels.FORWARD_MEMORY_MULTIPLIER, False)
    assert wide.block_rows == 1 and wide.block_cols < 300 and wide.col_programs > 1 and wide.row_programs > 1
    assert narrow.block_rows > 1 and narrow.grid == 40 and narrow.row_programs * narrow.block_rows < 85 * 4
    for shape in [(9, 300), (85, 4, 24)]:
        _check(randn(shape, scale=2.0), *_params(shape[-1], torch.float32))
        _check(randn(shape, torch.bfloat16, noncontiguous=True), *_params(shape[-1], torch.bfloat16, beta=False))
    many_blocks = dyt_kernels.plan_dyt("cpu", 3, 5000, dyt_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
    assert many_blocks.col_programs == 40 < 5000 / many_blocks.block_cols  # a program takes several column blocks
    _check(randn((3, 5000)), *_params(5000, torch.float32))


@pytest.mark.parametrize("shape,sm_count,layout", [
    ((9, 40), 2, (2, 16, 2, 1)),  # 2 programs over 3 column blocks (one takes two), each walking 5 tiles of 2 rows
    ((3, 7, 40), 6, (2, 16, 3, 2)),  # 2 row programs per column block: the prefetch steps over the other's tiles
    ((5, 7, 7), 2, (4, 8, 1, 2)),  # narrow rows, 4 per tile
])
def test_cuda_plan_with_multi_row_tiles_and_prefetch(monkeypatch, small_ub, shape, sm_count, layout):
    """The CUDA plan (``plan_dyt_cuda``), which CI's interpreter never ran: several rows per tile also when rows
    are split over column blocks, programs looping over rows and column blocks, and the backward's ``PREFETCH`` of
    the next tile of x and dy (past the last row: all masked). Forced here for both kernels with small tiles
    (``layout``: rows and columns per tile, column programs, row programs). ``CUDA_MATH`` stays off: its PTX
    inline asm does not run in the interpreter."""
    tiles = dyt_kernels.CudaTiles(rows=2, cols=16, warps=4, programs_per_sm=1, prefetch=True)

    def cuda_like(device_type, n_rows, n_cols, multiplier, persistent, cuda_tiles=None):
        return dyt_kernels.plan_dyt_cuda(n_rows, n_cols, tiles, sm_count)

    monkeypatch.setattr(dyt_kernels, "plan_dyt", cuda_like)
    small_ub(4096)  # CPU runs only; the kernels' plan is forced, sum_partials' follows the (small) UB
    n_cols = shape[-1]
    plan = cuda_like("cpu", math.prod(shape[:-1]), n_cols, dyt_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
    assert plan.prefetch and (plan.block_rows, plan.block_cols, plan.col_programs, plan.row_programs) == layout
    _check(randn(shape, scale=2.0), *_params(n_cols, torch.float32))
    _check(randn(shape, torch.bfloat16, noncontiguous=True), *_params(n_cols, torch.bfloat16, beta=False))


def test_parameter_gradients_are_deterministic(small_ub):
    small_ub(8192)
    x, dy = randn((50, 200)), randn((50, 200))
    alpha, gamma, beta = _params(200, torch.float32)
    first = torch.ops.npu_liger.dyt_backward(dy, x, alpha, gamma, beta)
    second = torch.ops.npu_liger.dyt_backward(dy, x, alpha, gamma, beta)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert len({t.untyped_storage().data_ptr() for t in first}) == 4


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (2, 0, 8)])
def test_empty_inputs(shape):
    x = randn(shape, requires_grad=True)
    alpha, gamma, beta = (t.requires_grad_(True) for t in _params(shape[-1], torch.float32))
    out = npu_liger.dyt(x, alpha, gamma, beta)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in (alpha, gamma, beta))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x, dy = randn((5, 37), dtype, requires_grad=True), randn((5, 37), dtype)
    alpha, gamma, beta = (t.requires_grad_(True) for t in _params(37, dtype))
    for b in (beta, None):
        run_opcheck(torch.ops.npu_liger.dyt.default, (x, alpha, gamma, b))
        run_opcheck(torch.ops.npu_liger.dyt_backward.default,
                    (dy, x.detach(), alpha.detach(), gamma.detach(), None if b is None else b.detach()))
    run_opcheck(torch.ops.npu_liger.dyt.default, (randn((3, 2, 37), dtype, noncontiguous=True), alpha.detach()[0],
                                                  gamma.detach()))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x, alpha, gamma, beta):
        return npu_liger.dyt(x * 2.0, alpha, gamma, beta).sin()

    def make(n):
        alpha, gamma, beta = _params(40, torch.float32)
        return (randn((n, 3, 40), requires_grad=True), alpha.requires_grad_(True), gamma.requires_grad_(True),
                beta.requires_grad_(True))

    assert_compiled_matches_eager(fn, make, [5, 9, 17])


def test_double_backward_raises_clear_error():
    x = randn((3, 8), requires_grad=True)
    alpha, gamma, _ = _params(8, torch.float32)
    (gx,) = torch.autograd.grad(npu_liger.dyt(x, alpha, gamma).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.dyt(randn((3, 8)), randn((1,)), randn((7,))), ValueError, r"gamma must have shape \(8,\)"),
    (lambda: npu_liger.dyt(randn((3, 8)), randn((2,)), randn((8,))), ValueError, "alpha must be a one-element"),
    (lambda: npu_liger.dyt(randn((3, 8)), randn((1, 1)), randn((8,))), ValueError, "alpha must be a one-element"),
    (lambda: npu_liger.dyt(randn((3, 8)), randn((1,)), randn((8,)), randn((8, 1))), ValueError, "beta must have"),
    (lambda: npu_liger.dyt(randn((3, 8)).long(), randn((1,)), randn((8,))), TypeError, "x must be float32"),
    (lambda: npu_liger.dyt(randn((3, 8)), randn((1,)).double(), randn((8,))), TypeError, "alpha must be float32"),
    (lambda: npu_liger.dyt(randn(()), randn((1,)), randn((1,))), ValueError, "x must have at least one dimension"),
    (lambda: torch.ops.npu_liger.dyt_backward(randn((3, 8), torch.float16), randn((3, 8)), randn((1,)), randn((8,)),
                                              None), TypeError, "grad_out must be torch.float32"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_module_has_liger_arguments_and_loads_its_state_dict():
    dyt = npu_liger.nn.DyT(24, init_alpha=0.8).to(DEVICE)
    assert dyt.alpha.shape == (1,) and dyt.alpha.item() == pytest.approx(0.8) and "init_alpha=0.8" in repr(dyt)
    assert torch.equal(dyt.gamma, torch.ones(24, device=DEVICE))
    assert torch.equal(dyt.beta, torch.zeros(24, device=DEVICE))
    state = {"alpha": randn((1,)), "gamma": randn((24,)), "beta": randn((24,))}  # LigerDyT's keys and shapes
    dyt.load_state_dict(state)
    x = randn((3, 5, 24))
    assert torch.equal(dyt(x), npu_liger.dyt(x, state["alpha"], state["gamma"], state["beta"]))
    no_beta = npu_liger.nn.DyT(24, beta=False).to(DEVICE)
    assert no_beta.beta is None and set(no_beta.state_dict()) == {"alpha", "gamma"}
    assert_close(no_beta(x), dyt_reference(x.double(), no_beta.alpha.double(), no_beta.gamma.double()))
