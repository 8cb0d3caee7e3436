"""poly_norm: PolyNorm against float64 (half precision against the eager PolyCom formula in that precision),
Liger's module reference, both kernel paths (several whole rows per tile, a row looped in chunks), fp32
parameters with half x, a 0-d or (1,) bias, opcheck, compile, determinism, empty and bad input, the nn module."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from checklist import DEVICE, FLOAT_DTYPES, randn, rel_error, run_opcheck
from norm_checks import assert_compiled_matches_eager, assert_grad_close, check_op
from npu_liger.npu_ops import poly_norm as poly_kernels
from npu_liger.npu_ops._norm import plan_rows
from op_cases import poly_norm_reference

# A last dim of 1 is left out: every norm(x^p) is then +-1 or 1 whatever x is, so x's gradient is all cancellation.
COLS = st.sampled_from([2, 7, 33, 128, 257, 600])
LEADING = st.sampled_from([(1,), (5,), (3, 4), (2, 3, 7), (45,)])


def _params(dtype, bias_shape=()):
    return randn((3,), dtype) * 0.5 + 0.3, randn(bias_shape, dtype)


def _sum_terms(x, weight, bias, eps, dy):
    """sum(|term|) of the weight and bias gradients (``norm_checks``): both sum over every element of x."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    terms = torch.stack([(dy * norm(x ** p)).abs().sum() for p in (3, 2, 1)])
    return {"weight": terms, "bias": dy.abs().sum().reshape(bias.shape)}


def _check(x, weight, bias, eps=1e-6):
    return check_op(npu_liger.poly_norm, poly_norm_reference, (x, weight, bias, eps), ("x", "weight", "bias"),
                    _sum_terms)


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), noncontiguous=st.booleans(),
       bias_shape=st.sampled_from([(), (1,)]), param_dtype=st.sampled_from([None, torch.float32]))
def test_poly_norm_matches_reference(leading, n_cols, dtype, noncontiguous, bias_shape, param_dtype):
    """``param_dtype``: fp32 parameters with any x. (Their 0-d entries keep the eager formula in x's dtype; a (1,)
    fp32 bias would promote it, so that pairing is in test_fp32_bias_of_shape_one_with_half_x.)"""
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous)
    if param_dtype is not None:
        bias_shape = ()
    _check(x, *_params(param_dtype or dtype, bias_shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_bias_of_shape_one_with_half_x(dtype):
    """The result stays in x's dtype (rounded once: within one unit roundoff of float64)."""
    x = randn((6, 40), dtype)
    weight, bias = _params(torch.float32, (1,))
    out = npu_liger.poly_norm(x, weight, bias)
    assert out.dtype == dtype
    assert rel_error(out, poly_norm_reference(x.double(), weight.double(), bias.double())) <= 2.0**-8


def test_matches_ligers_module_reference():
    """LigerPolyNorm's test module (PolyCom's): weight (1/3, 1/3, 1/3), bias 1.0, over (bs, sl, hd)."""
    module = npu_liger.nn.PolyNorm(eps=1e-6).to(DEVICE)
    x = randn((2, 5, 64), requires_grad=True)
    out = module(x)
    x64 = x.detach().double().requires_grad_(True)
    w64, b64 = (p.detach().double().requires_grad_(True) for p in (module.weight, module.bias))
    ref = poly_norm_reference(x64, w64, b64, 1e-6)
    dy = randn(out.shape)
    out.backward(dy)
    ref.backward(dy.double())
    terms = _sum_terms(x64.detach(), w64.detach(), b64.detach(), 1e-6, dy.double())
    for got, want, name in ((out, ref, "out"), (x.grad, x64.grad, "x"), (module.weight.grad, w64.grad, "weight"),
                            (module.bias.grad, b64.grad, "bias")):
        assert_grad_close(got, want, None, terms.get(name), name)
    assert module.bias.grad.shape == ()


def test_both_kernel_paths(small_ub):
    """A 4 KiB UB: a 300-wide row loops in chunks (forward and backward); 24-wide rows go several per tile and 85
    rows over 40 programs take several iterations. Large and shifted x: x^6 spans many orders of magnitude."""
    small_ub(4096)
    wide = plan_rows("cpu", 9, 300, poly_kernels.BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    narrow = plan_rows("cpu", 85 * 4, 24, poly_kernels.FORWARD_MEMORY_MULTIPLIER, persistent=False)
    assert not wide.whole_row and wide.block_cols < 300
    assert narrow.whole_row and narrow.block_rows > 1 and narrow.grid == 40 < 85 * 4 / narrow.block_rows
    for shape in [(9, 300), (85, 4, 24)]:
        _check(randn(shape), *_params(torch.float32))
        _check(randn(shape, scale=3.0) + 1.0, *_params(torch.float32, (1,)), eps=1e-5)
    _check(randn((7, 300), torch.bfloat16, noncontiguous=True), *_params(torch.bfloat16))


def test_cuda_kernel_variants_give_the_same_results(monkeypatch, small_ub):
    """The CUDA-only switches, which CI's interpreter never takes: the forward's y by Horner's rule (``HORNER``,
    on only for CUDA tensors with ``CUDA_HORNER``) and the persistent backward's prefetch of the next tile of x and
    dy (``plan_rows``' ``prefetch``, CUDA plans only). Forced here: the launcher's HORNER through a stand-in for the
    forward kernel, the prefetch through the plan (as test_norms does), on whole rows with a small UB so every
    program takes several tiles and the last prefetch reads past the last row (555 rows: a partial last tile)."""
    forward_kernel = poly_kernels._poly_norm_fwd_kernel
    horner = []

    class HornerForward:  # launches the real kernel as the launcher does, but with HORNER on
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                horner.append(kwargs["HORNER"])
                return forward_kernel[grid](*args, **{**kwargs, "HORNER": True})
            return launch

    def cuda_like(device_type, n_rows, n_cols, multiplier, persistent, **kwargs):
        tiles = plan_rows(device_type, n_rows, n_cols, multiplier, persistent, **kwargs)
        return tiles._replace(prefetch=tiles.whole_row and persistent)

    monkeypatch.setattr(poly_kernels, "_poly_norm_fwd_kernel", HornerForward())
    monkeypatch.setattr(poly_kernels, "plan_rows", cuda_like)
    small_ub(8192)
    shape = (37, 15, 40)  # 555 rows of 40
    fwd = plan_rows("cpu", 555, 40, poly_kernels.FORWARD_MEMORY_MULTIPLIER, False)
    bwd = cuda_like("cpu", 555, 40, poly_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
    assert fwd.whole_row and fwd.block_rows > 1 and fwd.grid * 2 * fwd.block_rows < 555
    assert bwd.prefetch and bwd.block_rows > 1 and bwd.grid * 4 * bwd.block_rows < 555 and 555 % bwd.block_rows
    _check(randn(shape), *_params(torch.float32))
    _check(randn(shape, scale=3.0) + 1.0, *_params(torch.float32, (1,)), eps=1e-5)  # x^6 over many magnitudes
    _check(randn(shape, torch.bfloat16, noncontiguous=True), *_params(torch.bfloat16))
    assert horner and not any(horner)  # the CPU launcher asked for the plain y every time: HORNER was forced


def test_zero_eps_with_a_partly_filled_tile():
    """eps = 0: the zero rows padding the last tile have r_p = inf; their r_p * S_p = inf * 0 must not reach dw."""
    plan = plan_rows("cpu", 45, 16, poly_kernels.BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    if DEVICE == "cpu":
        assert plan.whole_row and 45 % plan.block_rows != 0
    _check(randn((45, 16)), *_params(torch.float32), eps=0.0)


def test_parameter_gradients_are_deterministic(small_ub):
    small_ub(8192)
    x, dy = randn((50, 200)), randn((50, 200))
    weight, bias = _params(torch.float32)
    first = torch.ops.npu_liger.poly_norm_backward(dy, x, weight, bias, 1e-6)
    second = torch.ops.npu_liger.poly_norm_backward(dy, x, weight, bias, 1e-6)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[1].untyped_storage().data_ptr() != first[2].untyped_storage().data_ptr()


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (2, 0, 8)])
def test_empty_inputs(shape):
    x = randn(shape, requires_grad=True)
    weight, bias = (t.requires_grad_(True) for t in _params(torch.float32, (1,)))
    out = npu_liger.poly_norm(x, weight, bias)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(weight.grad, torch.zeros(3, device=DEVICE))
    assert torch.equal(bias.grad, torch.zeros(1, device=DEVICE))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x, dy = randn((5, 37), dtype, requires_grad=True), randn((5, 37), dtype)
    for bias_shape in ((), (1,)):
        weight, bias = (t.requires_grad_(True) for t in _params(dtype, bias_shape))
        run_opcheck(torch.ops.npu_liger.poly_norm.default, (x, weight, bias, 1e-6))
        run_opcheck(torch.ops.npu_liger.poly_norm_backward.default, (dy, x.detach(), weight.detach(), bias.detach(),
                                                                     1e-6))
    run_opcheck(torch.ops.npu_liger.poly_norm.default, (randn((3, 2, 37), dtype, noncontiguous=True),
                                                        weight.detach(), bias.detach()))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x, weight, bias):
        return npu_liger.poly_norm(x * 2.0, weight, bias).sin()

    def make(n):
        weight, bias = _params(torch.float32)
        return randn((n, 3, 40), requires_grad=True), weight.requires_grad_(True), bias.requires_grad_(True)

    assert_compiled_matches_eager(fn, make, [5, 9, 17])


def test_double_backward_raises_clear_error():
    x = randn((3, 8), requires_grad=True)
    (gx,) = torch.autograd.grad(npu_liger.poly_norm(x, *_params(torch.float32)).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.poly_norm(randn((3, 8)), randn((4,)), randn(())), ValueError, r"weight must have shape \(3,\)"),
    (lambda: npu_liger.poly_norm(randn((3, 8)), randn((3,)), randn((2,))), ValueError, "bias must be a one-element"),
    (lambda: npu_liger.poly_norm(randn((3, 8)), randn((3,)), randn((1, 1))), ValueError, "bias must be a one-element"),
    (lambda: npu_liger.poly_norm(randn((3, 8)).long(), randn((3,)), randn(())), TypeError, "x must be float32"),
    (lambda: npu_liger.poly_norm(randn((3, 8)), randn((3,)).int(), randn(())), TypeError, "weight must be float32"),
    (lambda: npu_liger.poly_norm(randn(()), randn((3,)), randn(())), ValueError, "x must have at least one dimension"),
    (lambda: npu_liger.poly_norm(randn((3, 8)), randn((3,)), randn(()), eps=-1.0), ValueError, "eps must be >= 0"),
    (lambda: torch.ops.npu_liger.poly_norm_backward(randn((3, 9)), randn((3, 8)), randn((3,)), randn(()), 1e-6),
     ValueError, r"grad_out must have shape \(3, 8\)"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_module_has_liger_arguments_and_loads_its_state_dict():
    module = npu_liger.nn.PolyNorm(eps=1e-5, in_place=False).to(DEVICE)
    assert module.variance_epsilon == 1e-5 and module.bias.shape == () and module.bias.item() == 1.0
    assert torch.allclose(module.weight, torch.full((3,), 1 / 3, device=DEVICE))
    state = {"weight": randn((3,)), "bias": randn(())}  # LigerPolyNorm's keys and shapes
    module.load_state_dict(state)
    x = randn((4, 24))
    assert torch.equal(module(x), npu_liger.poly_norm(x, state["weight"], state["bias"], 1e-5))
    assert "eps=1e-05" in repr(module)
