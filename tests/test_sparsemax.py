"""sparsemax: the float64 sort-based reference (the paper's algorithm, ``op_cases.sparsemax_reference``) checked
against the definition (a slow float64 bisection for the simplex projection, and its properties), then the op
against that reference along any dim, in both kernel paths (whole rows; rows looped in chunks), with ties, near-
threshold values, offset rows and non-finite values, plus opcheck, compile, empty and bad input, the nn module."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from checklist import (DEVICE, FLOAT_DTYPES, UNIT_ROUNDOFF, assert_close, assert_compiled_forward_backward,
                       assert_no_alias, assert_unchanged, randn, rel_error, run_opcheck, snapshot)
from npu_liger.npu_ops import sparsemax as kernels
from npu_liger.npu_ops._sparsemax_layout import kernel_view, plan_sparsemax, uses_rows
from op_cases import sparsemax_reference


def projection_by_bisection(x: torch.Tensor, dim: int, steps: int = 200) -> torch.Tensor:
    """The Euclidean projection onto the simplex from its definition, independently of the sort: tau solves
    sum(max(x - tau, 0)) = 1, found by bisection in float64 on [max - 1, max]."""
    z = x.double().movedim(dim, -1)
    hi = z.max(-1, keepdim=True).values
    lo = hi - 1
    for _ in range(steps):
        mid = (lo + hi) / 2
        above = (z - mid).clamp(min=0).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return (z - lo).clamp(min=0).movedim(-1, dim)


@pytest.mark.parametrize("shape,dim,scale", [((6, 40), -1, 1.0), ((6, 40), -1, 0.01), ((5, 17, 3), 1, 4.0),
                                             ((9, 4), 0, 30.0), ((3, 1), -1, 1.0), ((4, 8), -1, 0.0)])
def test_reference_is_the_simplex_projection(shape, dim, scale):
    """The sort-based reference: non-negative, sums to 1 along dim, equals the projection found by bisection; its
    gradient is the projection's Jacobian (identity minus the mean on the support, 0 off it)."""
    x = (torch.randn(shape, dtype=torch.float64) * scale).requires_grad_(True)
    y = sparsemax_reference(x, dim)
    assert (y >= 0).all()
    torch.testing.assert_close(y.sum(dim), torch.ones_like(y.sum(dim)), rtol=0, atol=1e-12)
    torch.testing.assert_close(y, projection_by_bisection(x.detach(), dim), rtol=0, atol=1e-12)
    dy = torch.randn(shape, dtype=torch.float64)
    y.backward(dy)
    support = y.detach() > 0
    mean = torch.where(support, dy, 0).sum(dim, keepdim=True) / support.sum(dim, keepdim=True)
    torch.testing.assert_close(x.grad, torch.where(support, dy - mean, 0))


def _half_reference(x, dim):
    """What fp32 math rounded once to x's dtype gives (the op's own contract for half precision): the reference in
    float32 from the same half-precision inputs. (Sorting and summing in half precision, as an eager bf16 call of
    the formula would, has errors of several percent: too loose a yardstick.)"""
    leaf = x.detach().float().requires_grad_(True)
    return leaf, sparsemax_reference(leaf, dim)


def check_sparsemax(x, dim):
    """``npu_liger.sparsemax(x, dim)`` forward and x's gradient against the float64 reference (and, for half
    precision, against the float32 reference rounded to x's dtype); the output non-negative and summing to 1; x
    unchanged and not aliased."""
    leaf = x.detach().requires_grad_(True)
    before = snapshot([leaf])
    y = npu_liger.sparsemax(leaf, dim)
    dy = randn(y.shape, y.dtype)
    y.backward(dy)
    assert_unchanged(before, [leaf], ["x"])
    assert_no_alias([y, leaf.grad], [leaf, dy])
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous() and leaf.grad.dtype == x.dtype
    x64 = x.detach().double().requires_grad_(True)
    y64 = sparsemax_reference(x64, dim)
    y64.backward(dy.double())
    eager = None
    if x.dtype != torch.float32:
        x32, y32 = _half_reference(x, dim)
        y32.backward(dy.float())
        eager = (y32.detach().to(x.dtype), x32.grad.to(x.dtype))
    assert (y >= 0).all()
    if x.numel():
        sums = y.float().sum(dim)
        slack = 1e-5 if x.dtype == torch.float32 else x.shape[dim] * UNIT_ROUNDOFF[x.dtype]
        assert (sums - 1).abs().max() <= slack, (sums - 1).abs().max()
    assert_close(y, y64, None if eager is None else eager[0], what="sparsemax")
    assert_close(leaf.grad, x64.grad, None if eager is None else eager[1], what="grad of x",
                 floor=_grad_cancellation_floor(y64.detach(), dy, x64.grad, dim))
    return y, leaf.grad


def _grad_cancellation_floor(y64, dy, grad64, dim):
    """The gradient dy - mean(dy over the support) cancels where the support's dy are nearly equal (a support of two
    with close dy: 8e-5 relative in float32, measured): each element's rounding error is about
    u * (|dy| + mean|dy| over the support) however small the result. Four such units (the kernels sum in another
    order than the reference) floor the tolerance; a zero gradient is judged absolutely."""
    u = 2.0**-24 if dy.dtype == torch.float32 else UNIT_ROUNDOFF[dy.dtype]
    support, dy_abs = y64 > 0, dy.double().abs()
    mean_abs = (dy_abs * support).sum(dim, keepdim=True) / support.sum(dim, keepdim=True).clamp(min=1)
    bound = ((dy_abs + mean_abs) * support).norm().item()
    g_norm = grad64.norm().item()
    return 4.0 * u * bound / g_norm if g_norm > 0 else 0.0


SHAPES = st.sampled_from([(1,), (2,), (7,), (5, 33), (3, 4, 19), (2, 3, 128), (45, 2), (6, 257), (1, 600, 2)])


@given(shape=SHAPES, dim_index=st.integers(0, 5), negative=st.booleans(), dtype=st.sampled_from(FLOAT_DTYPES),
       scale=st.sampled_from([0.1, 1.0, 8.0]), noncontiguous=st.booleans())
def test_matches_reference_along_any_dim(shape, dim_index, negative, dtype, scale, noncontiguous):
    dim = dim_index % len(shape)
    check_sparsemax(randn(shape, dtype, noncontiguous=noncontiguous, scale=scale), dim - len(shape) if negative
                    else dim)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_transposed_and_expanded_inputs(dim):
    check_sparsemax(randn((4, 5, 7), scale=3.0).transpose(0, 2), dim)  # (7, 5, 4), stride 1 on dim 0
    check_sparsemax(randn((1, 5, 7), scale=3.0).expand(3, 5, 7), dim)
    check_sparsemax(randn((3, 5, 9), scale=3.0).permute(1, 2, 0)[:, 2:7], dim)


def test_tiny_ub_loops_wide_rows_and_packs_narrow_rows(small_ub):
    """A 2 KiB UB: 300-wide rows loop in 16-wide chunks (every pass of the forward and the backward); narrow rows go
    several per tile, with more tiles than programs; both layouts."""
    small_ub(2048)
    wide = plan_sparsemax("cpu", 6, 300, 1, kernels.FORWARD_MEMORY_MULTIPLIER)
    narrow = plan_sparsemax("cpu", 60 * 7, 8, 1, kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert not wide.whole_row and not wide.rows_last and wide.block_cols * 4 <= 300
    assert narrow.whole_row and narrow.block_rows > 1 and narrow.grid == 40 < narrow.n_tasks
    check_sparsemax(randn((6, 300), scale=4.0), -1)
    check_sparsemax(randn((2, 300, 3), scale=0.05), 1)  # a wide support along a middle dim (moved last)
    check_sparsemax(randn((60, 8, 7), scale=2.0), 1)
    check_sparsemax(randn((5, 300), torch.bfloat16, noncontiguous=True, scale=2.0), -1)
    small_ub(8192)  # the split layout: 16 trailing positions by 16-column chunks
    split = plan_sparsemax("cpu", 2, 100, 17, kernels.FORWARD_MEMORY_MULTIPLIER)
    assert split.rows_last and not split.whole_row and split.block_rows == 16 and split.n_tasks == 4
    check_sparsemax(randn((2, 100, 17), scale=0.5), 1)
    packed = plan_sparsemax("cpu", 3, 9, 70, kernels.FORWARD_MEMORY_MULTIPLIER)
    assert packed.rows_last and packed.whole_row and packed.block_rows == 16 and packed.n_tasks == 15
    check_sparsemax(randn((3, 9, 70), torch.float16, scale=3.0), 1)


def test_layouts_keep_a_unit_stride_last_axis():
    """The kernel views (``_sparsemax_layout``): the split layout for trailing dims of 16+ (a view of a contiguous
    x), the rows layout with the reduced dim moved last for fewer trailing elements (a copy), and for an x stored
    with the reduced dim innermost (a view)."""
    x = randn((4, 37, 20))
    assert not uses_rows(x, 1, by_layout=True) and kernel_view(x, 1, False).data_ptr() == x.data_ptr()
    assert kernel_view(x, 1, False).stride(2) == 1
    small = randn((6, 40, 3))
    assert uses_rows(small, 1, by_layout=True) and kernel_view(small, 1, True).shape == (18, 40, 1)
    inner = randn((4, 20, 37)).transpose(1, 2)  # (4, 37, 20) with dim 1 innermost
    view = kernel_view(inner, 1, True)
    assert uses_rows(inner, 1, by_layout=True) and view.data_ptr() == inner.data_ptr() and view.stride(1) == 1
    assert not uses_rows(inner, 1, by_layout=False)  # the backward decides by shape (its y is contiguous)
    assert kernel_view(x.transpose(0, 2), 2, False).stride(2) == 1  # a strided trailing axis is copied
    for t, dim in ((x, 1), (small, 1), (inner, 1), (x.transpose(0, 2), 2), (randn((40, 16)), 0)):
        check_sparsemax(t * 3.0, dim)


def test_default_ub_plan():
    if DEVICE != "cpu":
        pytest.skip("the emulated Ascend910B3 plan")
    fwd, bwd = kernels.FORWARD_MEMORY_MULTIPLIER, kernels.BACKWARD_MEMORY_MULTIPLIER
    assert plan_sparsemax("cpu", 64, 4096, 1, fwd).whole_row and plan_sparsemax("cpu", 64, 4096, 1, bwd).whole_row
    assert not plan_sparsemax("cpu", 16384, 8192, 1, fwd).whole_row
    split = plan_sparsemax("cpu", 8, 256, 64, fwd)  # 256 columns x 16 positions fit; 4 tasks per outer index
    assert split.whole_row and split.rows_last and split.block_rows == 16 and split.n_tasks == 32 and split.grid == 32


def test_cuda_plan_keeps_rows_up_to_16k_whole():
    wide = plan_sparsemax("cuda", 16384, 8192, 1, kernels.FORWARD_MEMORY_MULTIPLIER)
    assert wide.whole_row and wide.block_rows == 1 and wide.options == {"num_warps": 8}
    assert plan_sparsemax("cuda", 64, 16384, 1, kernels.BACKWARD_MEMORY_MULTIPLIER).whole_row
    assert not plan_sparsemax("cuda", 64, 32768, 1, kernels.FORWARD_MEMORY_MULTIPLIER).whole_row
    split = plan_sparsemax("cuda", 8, 1024, 64, kernels.FORWARD_MEMORY_MULTIPLIER)
    assert split.whole_row and split.rows_last and split.block_cols * split.block_rows <= 16384


@pytest.mark.parametrize("ub", [None, 2048])
def test_hard_rows(ub, small_ub):
    """Ties (a constant row: uniform; equal maxima sharing the mass), one dominant value (one-hot), a row offset by a
    large constant (the support sum must not lose its digits), values packed within 1e-6 of the threshold, a
    support of the whole row, rows of 1 and 2."""
    if ub is not None:
        small_ub(ub)
    n = 300
    x = randn((8, n))
    x[0] = 0.5
    x[1, :] = -3.0
    x[1, [4, 50, 299]] = 2.0  # three equal maxima, alone in the support: 1/3 each
    x[2, 17] = 40.0
    x[3] = randn((n,)) + 1000.0
    x[4] = 1.0 + torch.arange(n, device=DEVICE) * 1e-8  # all within 3e-6 of each other: a uniform-ish support
    x[5, :5] = torch.tensor([1.0, 0.5, 0.25, 0.2500001, 0.2499999], device=DEVICE)  # values near tau
    x[5, 5:] = -5.0
    x[6] = randn((n,), scale=1e-4)
    x[7] = randn((n,), scale=30.0)
    y, _ = check_sparsemax(x, -1)
    torch.testing.assert_close(y[0], torch.full((n,), 1.0 / n, device=DEVICE))
    torch.testing.assert_close(y[1, [4, 50, 299]], torch.full((3,), 1.0 / 3, device=DEVICE))
    assert y[1].count_nonzero() == 3 and y[2, 17] == 1.0 and y[2].count_nonzero() == 1
    assert (y[6] > 0).all()
    for shape in ((5, 1), (5, 2)):
        check_sparsemax(randn(shape, scale=3.0), -1)
    close_pair = torch.tensor([[0.3, 0.1]], device=DEVICE).repeat(64, 1)  # supports of two...
    leaf = close_pair.clone().requires_grad_(True)
    dy = randn((64, 1)).repeat(1, 2) + randn((64, 2), scale=1e-3)  # ...whose dy nearly cancel
    npu_liger.sparsemax(leaf, -1).backward(dy)
    ref = close_pair.double().requires_grad_(True)
    y_ref = sparsemax_reference(ref, -1)
    y_ref.backward(dy.double())
    assert_close(leaf.grad, ref.grad, what="grad of x (cancelling)",
                 floor=_grad_cancellation_floor(y_ref.detach(), dy, ref.grad, -1))
    assert (npu_liger.sparsemax(randn((5, 1)), -1) == 1).all()


@pytest.mark.parametrize("ub", [None, 2048])
def test_non_finite_values(ub, small_ub):
    """A NaN or +inf anywhere makes the row NaN; a row of -inf only is NaN; -inf entries of a row with finite ones
    get 0 and the rest is the sparsemax of the finite entries. Gradients: 0 on a NaN row (its outputs are outside
    every support), as autograd of the reference gives; both kernel paths."""
    if ub is not None:
        small_ub(ub)
    x = randn((6, 300), scale=2.0)
    x[1, 7] = float("nan")
    x[2, 299] = float("inf")
    x[3, :] = float("-inf")
    x[4, ::2] = float("-inf")
    x[5, 0] = float("nan")
    x[5, 1] = float("-inf")
    leaf = x.clone().requires_grad_(True)
    y = npu_liger.sparsemax(leaf, -1)
    ref_leaf = x.clone().requires_grad_(True)
    ref = sparsemax_reference(ref_leaf, -1)
    torch.testing.assert_close(y, ref, equal_nan=True)
    assert y[1:4].isnan().all() and y[5].isnan().all() and not y[[0, 4]].isnan().any()
    assert (y[4, ::2] == 0).all()
    torch.testing.assert_close(y[4, 1::2], sparsemax_reference(x[4, 1::2], -1))
    dy = randn(y.shape)
    y.backward(dy)
    ref.backward(dy)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, equal_nan=True)
    assert (leaf.grad[1:4] == 0).all()


def test_nan_incoming_gradient_reaches_the_support_only():
    x = randn((2, 50), scale=3.0)
    y = npu_liger.sparsemax(x, -1)
    support = y > 0
    dy = randn(y.shape)
    dy[0, support[0].nonzero()[0, 0]] = float("nan")  # on row 0's support
    dy[1, (~support[1]).nonzero()[0, 0]] = float("nan")  # off row 1's support
    dx = torch.ops.npu_liger.sparsemax_backward(dy, y, -1)
    assert torch.equal(dx[0].isnan(), support[0]) and (dx[0][~support[0]] == 0).all()
    assert dx[1].isfinite().all()


@pytest.mark.parametrize("shape,dim", [((0, 16), -1), ((3, 0), -1), ((3, 0), 0), ((2, 0, 8), 2), ((0,), 0)])
def test_empty_inputs(shape, dim):
    x = randn(shape, requires_grad=True)
    y = npu_liger.sparsemax(x, dim)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape


def test_zero_dim_input_is_one_element():
    x = torch.tensor(-7.0, device=DEVICE, requires_grad=True)
    for dim in (0, -1):
        y = npu_liger.sparsemax(x, dim)
        assert y.shape == () and y.item() == 1.0
    y.backward()
    assert x.grad.item() == 0.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x = randn((3, 4, 9), dtype, requires_grad=True)
    for dim in (-1, 1):
        run_opcheck(torch.ops.npu_liger.sparsemax.default, (x, dim))
    y = sparsemax_reference(x.detach().float(), 1).to(dtype)
    run_opcheck(torch.ops.npu_liger.sparsemax_backward.default, (randn(x.shape, dtype), y, 1))
    run_opcheck(torch.ops.npu_liger.sparsemax.default, (randn((2, 3, 9), dtype, noncontiguous=True),))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x):
        return npu_liger.sparsemax(x * 2.0, 1) * 3.0 + npu_liger.sparsemax(x, -1).sum(0)

    assert_compiled_forward_backward(fn, lambda x: sparsemax_reference(x * 2.0, 1) * 3.0
                                     + sparsemax_reference(x, -1).sum(0),
                                     lambda n: (randn((n, 3, 12), requires_grad=True, scale=2.0),), [5, 7, 17])


def test_double_backward_raises_clear_error():
    x = randn((3, 8), requires_grad=True)
    (gx,) = torch.autograd.grad((npu_liger.sparsemax(x) * randn((3, 8))).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.sparsemax(randn((3, 8)).long()), TypeError, "x must be float32"),
    (lambda: npu_liger.sparsemax(randn((3, 8)), 2), ValueError, r"dim must be in \[-2, 1\]"),
    (lambda: npu_liger.sparsemax(randn((3, 8)), -3), ValueError, r"dim must be in \[-2, 1\]"),
    (lambda: npu_liger.sparsemax(randn((3, 8)), 1.0), TypeError, "dim must be an int"),
    (lambda: torch.ops.npu_liger.sparsemax_backward(randn((3, 8), torch.bfloat16), randn((3, 8)), -1), TypeError,
     "grad_out must be torch.float32"),
    (lambda: torch.ops.npu_liger.sparsemax_backward(randn((3, 9)), randn((3, 8)), -1), ValueError,
     r"grad_out must have shape \(3, 8\)"),
    (lambda: npu_liger.nn.Sparsemax(dim="last"), TypeError, "dim must be an int"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_module_is_the_function():
    module = npu_liger.nn.Sparsemax(dim=1)
    assert repr(module) == "Sparsemax(dim=1)" and npu_liger.nn.Sparsemax().dim == -1
    x = randn((4, 3, 21), scale=2.0)
    assert torch.equal(module(x), npu_liger.sparsemax(x, 1))
    assert rel_error(npu_liger.nn.Sparsemax()(x), sparsemax_reference(x.double(), -1)) <= 1e-6
