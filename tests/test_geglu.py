"""GEGLU: numerics against float64, gradients, opcheck, compile, tiling loops, no mutation, bad input."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from npu_liger.npu_ops._gated import elementwise_request
import npu_liger.npu_ops.geglu as geglu_kernels
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiles_without_recompiles, assert_no_alias,
                       assert_unchanged, randn, run_opcheck, snapshot)

geglu_op = torch.ops.npu_liger.geglu.default
geglu_backward_op = torch.ops.npu_liger.geglu_backward.default

# 1, primes, and sizes around the emulated NPU blocks (8192 forward / 4096 backward).
DIM_SIZES = st.sampled_from([1, 2, 3, 7, 13, 31, 64, 127, 257, 1000, 4095, 4097, 8191, 8193])


def reference(a, b):
    return F.gelu(a, approximate="tanh") * b


def check_forward_backward(a, b):
    """Forward and both gradients of the op against float64 autograd, half precision against eager."""
    a = a.detach().requires_grad_(True)
    b = b.detach().requires_grad_(True)
    before = snapshot((a, b))
    c = npu_liger.geglu(a, b)
    grad_c = randn(c.shape, c.dtype)
    c.backward(grad_c)
    assert_unchanged(before, (a, b), ("a", "b"))
    assert_no_alias((c, a.grad, b.grad), (a, b))

    a64 = a.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True)
    c64 = reference(a64, b64)
    c64.backward(grad_c.double())

    a_lp = a.detach().clone().requires_grad_(True)
    b_lp = b.detach().clone().requires_grad_(True)
    c_lp = reference(a_lp, b_lp)
    c_lp.backward(grad_c)

    assert c.dtype == a.dtype and c.shape == a.shape and c.is_contiguous()
    assert_close(c, c64, c_lp, what="c")
    assert_close(a.grad, a64.grad, a_lp.grad, what="grad_a")
    assert_close(b.grad, b64.grad, b_lp.grad, what="grad_b")


@given(shape=st.lists(DIM_SIZES, min_size=1, max_size=3).filter(lambda s: torch.Size(s).numel() <= 300_000),
       dtype=st.sampled_from(FLOAT_DTYPES), noncontiguous=st.booleans())
def test_matches_float64_reference(shape, dtype, noncontiguous):
    a = randn(shape, dtype, noncontiguous=noncontiguous, scale=2.0)
    b = randn(shape, dtype, noncontiguous=noncontiguous)
    check_forward_backward(a, b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_large_values_saturate_without_nan(dtype):
    a = torch.tensor([-1e4, -30.0, -5.0, 0.0, 5.0, 30.0, 1e4], device=DEVICE).to(dtype)
    b = torch.ones_like(a)
    c = npu_liger.geglu(a, b)
    assert torch.isfinite(c).all()
    assert_close(c, reference(a.double(), b.double()), reference(a, b))


def test_persistent_grid_strides_over_many_blocks(small_ub):
    """A 4 KiB UB gives 128-element forward / 64-element backward blocks, so with 40 programs each program
    loops over several blocks."""
    small_ub(4096)
    plan = npu_liger.tiling.plan_launch("cpu", elementwise_request(100_000, geglu_kernels.FORWARD_MEMORY_MULTIPLIER))
    assert plan.block == 128 and plan.max_programs == 40
    plan = npu_liger.tiling.plan_launch("cpu", elementwise_request(100_000, geglu_kernels.BACKWARD_MEMORY_MULTIPLIER))
    assert plan.block == 64
    check_forward_backward(randn((3, 33_333), torch.float32, scale=2.0), randn((3, 33_333), torch.float32))
    check_forward_backward(randn((5, 2049), torch.bfloat16, scale=2.0), randn((5, 2049), torch.bfloat16))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 7)])
def test_empty_inputs_give_empty_outputs(shape):
    a = randn(shape, requires_grad=True)
    b = randn(shape, requires_grad=True)
    c = npu_liger.geglu(a, b)
    assert c.shape == a.shape
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    a = randn((4, 37), dtype, requires_grad=True)
    b = randn((4, 37), dtype, requires_grad=True)
    run_opcheck(geglu_op, (a, b))
    run_opcheck(geglu_backward_op, (randn((4, 37), dtype), a.detach(), b.detach()))
    run_opcheck(geglu_op, (randn((2, 6), dtype, noncontiguous=True), randn((2, 6), dtype, noncontiguous=True)))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: npu_liger.geglu(a * 2.0, b), fullgraph=True, dynamic=True)
    for i, n in enumerate([5, 8, 33, 130]):
        a, b = randn((n, 19), requires_grad=True), randn((n, 19), requires_grad=True)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            c = compiled(a, b)
            c.sum().backward()
        a64 = a.detach().double().requires_grad_(True)
        b64 = b.detach().double().requires_grad_(True)
        c64 = reference(a64 * 2.0, b64)
        c64.sum().backward()
        assert_close(c, c64)
        assert_close(a.grad, a64.grad)
        assert_close(b.grad, b64.grad)


def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda a, b: npu_liger.geglu(a, b) + 1.0,
        lambda n: (randn((n, 3, 7)), randn((n, 3, 7))),
        [4, 9, 17],
        lambda inputs, got, eager: assert_close(got, reference(inputs[0].double(), inputs[1].double()) + 1.0),
    )


def test_double_backward_raises_clear_error():
    a = randn((8,), requires_grad=True)
    b = randn((8,), requires_grad=True)
    (grad_a,) = torch.autograd.grad(npu_liger.geglu(a, b).sum(), a, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_a.sum().backward()


def test_module_matches_hf_gemma_mlp():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    config = transformers.GemmaConfig(hidden_size=32, intermediate_size=88, hidden_act="gelu_pytorch_tanh")
    hf = GemmaMLP(config).to(DEVICE)
    ours = npu_liger.nn.GEGLUMLP(32, 88).to(DEVICE)
    ours.load_state_dict(hf.state_dict())
    x = randn((2, 5, 32))
    assert_close(ours(x), copy.deepcopy(hf).double()(x.double()))


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        (lambda: randn((4,)), lambda: randn((5,)), ValueError, "b must have the shape of a"),
        (lambda: randn((4,)), lambda: randn((4,), torch.float16), TypeError, "b must have the dtype of a"),
        (lambda: torch.arange(4, device=DEVICE), lambda: torch.arange(4, device=DEVICE), TypeError,
         "a must be float32, float16 or bfloat16"),
        (lambda: randn((4,)).double(), lambda: randn((4,)).double(), TypeError, "a must be float32"),
        (lambda: randn((4,)), lambda: torch.randn(4, device="meta"), RuntimeError, "b must be on the device of a"),
    ],
)
def test_bad_input_raises_clear_error(a, b, error, match):
    with pytest.raises(error, match=match):
        npu_liger.geglu(a(), b())
