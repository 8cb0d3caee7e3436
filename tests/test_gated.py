"""GEGLU and SwiGLU (the gated elementwise ops): numerics against float64, gradients, opcheck, compile, tiling
loops, no mutation, bad input, and their nn.Modules against Hugging Face's MLPs. Every test runs for both ops."""

import copy
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.geglu as geglu_kernels
import npu_liger.npu_ops.swiglu as swiglu_kernels
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward,
                       assert_compiles_without_recompiles, assert_no_alias, assert_unchanged, randn, run_opcheck,
                       snapshot)
from npu_liger.npu_ops._triton import flat_plan


@dataclass(frozen=True)
class GatedOp:
    name: str
    reference: Callable  # the eager formula, any dtype
    kernels: object  # the npu_ops module (memory multipliers)
    module: type  # npu_liger.nn class
    hidden_act: str  # the HF config activation whose gated MLP the module reproduces

    @property
    def functional(self):
        return getattr(npu_liger, self.name)

    @property
    def op(self):
        return getattr(torch.ops.npu_liger, self.name).default

    @property
    def backward_op(self):
        return getattr(torch.ops.npu_liger, f"{self.name}_backward").default

    def __str__(self):
        return self.name


def _hf_mlp(hidden_act, bias):
    """HF's LlamaMLP with the op's activation: with "gelu_pytorch_tanh" it computes exactly Gemma's MLP."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=88, hidden_act=hidden_act, mlp_bias=bias)
    return LlamaMLP(config)


GATED_OPS = [
    GatedOp("geglu", lambda a, b: F.gelu(a, approximate="tanh") * b, geglu_kernels, npu_liger.nn.GEGLUMLP,
            "gelu_pytorch_tanh"),
    GatedOp("swiglu", lambda a, b: F.silu(a) * b, swiglu_kernels, npu_liger.nn.SwiGLUMLP, "silu"),
]
gated = pytest.mark.parametrize("gop", GATED_OPS, ids=str)

# 1, primes, and sizes around the emulated NPU blocks (8192 forward / 4096 backward).
DIM_SIZES = st.sampled_from([1, 2, 3, 7, 13, 31, 64, 127, 257, 1000, 4095, 4097, 8191, 8193])


def check_forward_backward(gop, a, b):
    """Forward and both gradients of the op against float64 autograd, half precision against eager."""
    a = a.detach().requires_grad_(True)
    b = b.detach().requires_grad_(True)
    before = snapshot((a, b))
    c = gop.functional(a, b)
    grad_c = randn(c.shape, c.dtype)
    c.backward(grad_c)
    assert_unchanged(before, (a, b), ("a", "b"))
    assert_no_alias((c, a.grad, b.grad), (a, b))

    a64 = a.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True)
    c64 = gop.reference(a64, b64)
    c64.backward(grad_c.double())

    a_lp = a.detach().clone().requires_grad_(True)
    b_lp = b.detach().clone().requires_grad_(True)
    c_lp = gop.reference(a_lp, b_lp)
    c_lp.backward(grad_c)

    assert c.dtype == a.dtype and c.shape == a.shape and c.is_contiguous()
    assert_close(c, c64, c_lp, what="c")
    assert_close(a.grad, a64.grad, a_lp.grad, what="grad_a")
    assert_close(b.grad, b64.grad, b_lp.grad, what="grad_b")


@gated
@given(shape=st.lists(DIM_SIZES, min_size=1, max_size=3).filter(lambda s: torch.Size(s).numel() <= 300_000),
       dtype=st.sampled_from(FLOAT_DTYPES), noncontiguous=st.booleans())
def test_matches_float64_reference(gop, shape, dtype, noncontiguous):
    a = randn(shape, dtype, noncontiguous=noncontiguous, scale=2.0)
    b = randn(shape, dtype, noncontiguous=noncontiguous)
    check_forward_backward(gop, a, b)


@gated
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's sigmoid
def test_large_values_saturate_without_nan(gop, dtype):
    a = torch.tensor([-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4], device=DEVICE).to(dtype)
    b = torch.ones_like(a)
    a.requires_grad_(True)
    c = gop.functional(a, b)
    assert torch.isfinite(c).all()
    assert_close(c, gop.reference(a.detach().double(), b.double()), gop.reference(a.detach(), b))
    c.backward(torch.ones_like(c))
    assert torch.isfinite(a.grad).all()


@gated
def test_persistent_grid_strides_over_many_blocks(gop, small_ub):
    """A 4 KiB UB gives 128-element forward / 64-element backward blocks, so with 40 programs each program
    loops over several blocks."""
    small_ub(4096)
    plan = flat_plan("cpu", 100_000, gop.kernels.FORWARD_MEMORY_MULTIPLIER)
    assert plan.block == 128 and plan.max_programs == 40
    plan = flat_plan("cpu", 100_000, gop.kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert plan.block == 64
    check_forward_backward(gop, randn((3, 33_333), torch.float32, scale=2.0), randn((3, 33_333), torch.float32))
    check_forward_backward(gop, randn((5, 2049), torch.bfloat16, scale=2.0), randn((5, 2049), torch.bfloat16))


@gated
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 7)])
def test_empty_inputs_give_empty_outputs(gop, shape):
    a = randn(shape, requires_grad=True)
    b = randn(shape, requires_grad=True)
    c = gop.functional(a, b)
    assert c.shape == a.shape
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


@gated
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(gop, dtype):
    a = randn((4, 37), dtype, requires_grad=True)
    b = randn((4, 37), dtype, requires_grad=True)
    run_opcheck(gop.op, (a, b))
    run_opcheck(gop.backward_op, (randn((4, 37), dtype), a.detach(), b.detach()))
    run_opcheck(gop.op, (randn((2, 6), dtype, noncontiguous=True), randn((2, 6), dtype, noncontiguous=True)))


@gated
def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles(gop):
    assert_compiled_forward_backward(
        lambda a, b: gop.functional(a * 2.0, b),
        lambda a, b: gop.reference(a * 2.0, b),
        lambda n: (randn((n, 19), requires_grad=True), randn((n, 19), requires_grad=True)),
        [5, 8, 33, 130],
    )

@gated
def test_compile_helper_forward_only(gop):
    assert_compiles_without_recompiles(
        lambda a, b: gop.functional(a, b) + 1.0,
        lambda n: (randn((n, 3, 7)), randn((n, 3, 7))),
        [4, 9, 17],
        lambda inputs, got, eager: assert_close(got, gop.reference(inputs[0].double(), inputs[1].double()) + 1.0),
    )


@gated
def test_eager_entry_matches_the_dispatched_op(gop):
    a, b = randn((6, 41), requires_grad=True), randn((6, 41), requires_grad=True)
    fast = gop.functional(a, b)
    fast.sum().backward()
    fast_grads = (a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    slow = gop.op(a, b)
    slow.sum().backward()
    assert torch.equal(fast, slow) and torch.equal(fast_grads[0], a.grad) and torch.equal(fast_grads[1], b.grad)


@gated
def test_double_backward_raises_clear_error(gop):
    a = randn((8,), requires_grad=True)
    b = randn((8,), requires_grad=True)
    (grad_a,) = torch.autograd.grad(gop.functional(a, b).sum(), a, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_a.sum().backward()


@gated
@pytest.mark.parametrize("bias", [False, True])
def test_module_matches_hf_mlp(gop, bias):
    """GEGLUMLP / SwiGLUMLP == HF's gated MLP with that activation: outputs and gradients vs float64 weights."""
    pytest.importorskip("transformers")
    hf = _hf_mlp(gop.hidden_act, bias).to(DEVICE)
    ours = gop.module(32, 88, bias=bias).to(DEVICE)
    ours.load_state_dict(hf.state_dict())
    x = randn((2, 5, 32), requires_grad=True)
    hf64 = copy.deepcopy(hf).double()
    x64 = x.detach().double().requires_grad_(True)
    out, out64 = ours(x), hf64(x64)
    assert_close(out, out64)
    out.sum().backward()
    out64.sum().backward()
    assert_close(x.grad, x64.grad, what="grad_x")
    for name, param in ours.named_parameters():  # down_proj's: through the recomputed gate product
        assert_close(param.grad, hf64.get_parameter(name).grad, what=f"grad of {name}")


@gated
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_down_projection_recomputes_the_gate_product(gop, dtype, monkeypatch):
    """The gated MLP keeps a, b and the weights for backward, not gate(a, b) (4x16x88 values here), and its
    gradients equal those of the plain ``down_proj(gate(a, b))`` path (NPU_LIGER_MLP_RECOMPUTE=0): bit for bit
    on CPU, where both run the same matmuls. A down_proj with a hook takes the plain path (the hook sees it)."""
    mlp = gop.module(32, 88, bias=True).to(device=DEVICE, dtype=dtype)
    x = randn((4, 16, 32), dtype)

    def run():
        saved = []

        def pack(t):
            saved.append(t.numel())
            return t

        xx = x.clone().requires_grad_(True)
        mlp.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = mlp(xx)
        out.backward(torch.ones_like(out))
        return out, [xx.grad, *(p.grad for p in mlp.parameters())], sum(saved)

    out, grads, saved = run()
    handle = mlp.down_proj.register_forward_hook(lambda module, args, output: None)
    assert run()[2] == saved + 4 * 16 * 88  # a hooked down_proj runs as a module: the plain path
    handle.remove()
    monkeypatch.setenv("NPU_LIGER_MLP_RECOMPUTE", "0")
    plain_out, plain_grads, plain_saved = run()
    assert plain_saved - saved == 4 * 16 * 88
    assert torch.equal(out, plain_out)
    for g, plain in zip(grads, plain_grads):  # GPU BLAS may pick another algorithm for a transposed operand
        if DEVICE == "cpu":
            assert torch.equal(g, plain)
        else:
            torch.testing.assert_close(g, plain)


@gated
def test_compiled_down_projection_recomputes_the_gate_product(gop, monkeypatch):
    """Under torch.compile the gated MLP keeps for backward what the eager one keeps (not gate(a, b)): its
    checkpointed region makes AOTAutograd's partitioner recompute our opaque gate op. Without the recomputation
    (NPU_LIGER_MLP_RECOMPUTE=0) the compiled graph keeps the 4x16x88 product; the gradients are the same."""
    mlp = gop.module(32, 88, bias=False).to(DEVICE)
    x = randn((4, 16, 32))

    def run():
        saved = {}

        def pack(t):
            saved[t.untyped_storage().data_ptr()] = t.numel()
            return t

        xx = x.clone().requires_grad_(True)
        mlp.zero_grad()
        torch._dynamo.reset()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = torch.compile(mlp, backend="aot_eager", fullgraph=True)(xx)
        out.backward(torch.ones_like(out))
        return [xx.grad, *(p.grad.clone() for p in mlp.parameters())], sum(saved.values())

    grads, saved = run()
    monkeypatch.setenv("NPU_LIGER_MLP_RECOMPUTE", "0")
    plain_grads, plain_saved = run()
    assert plain_saved - saved == 4 * 16 * 88
    for g, plain in zip(grads, plain_grads):
        torch.testing.assert_close(g, plain)


@gated
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
def test_bad_input_raises_clear_error(gop, a, b, error, match):
    with pytest.raises(error, match=match):
        gop.functional(a(), b())


@gated
def test_backward_op_checks_grad_c(gop):
    a, b = randn((4, 5)), randn((4, 5))
    with pytest.raises(ValueError, match="grad_c must have the shape of a"):
        gop.backward_op(randn((4, 6)), a, b)
