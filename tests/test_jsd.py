"""jsd: every beta (forward KL, reverse KL, mixtures) against float64 (Liger-Kernel's torch reference), ignored rows
(0, not NaN, when none is valid), mixed dtypes, very negative log-probabilities (no underflow to NaN), the eager and
op paths, Liger's module, opcheck, compile without recompiles, tiling loops, no mutation, empty and bad input."""

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._divergence as divergence
from npu_liger.npu_ops._triton import flat_plan
from checklist import (DEVICE, FLOAT_DTYPES, UNIT_ROUNDOFF, assert_close, assert_compiled_forward_backward,
                       assert_no_alias, assert_unchanged, half_precision_tolerance, randn, rel_error, run_opcheck,
                       snapshot)
from op_cases import jsd_reference as reference

jsd_op = torch.ops.npu_liger.jsd.default
with_grad_op = torch.ops.npu_liger.jsd_with_grad.default
BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)
ROW_SIZES = st.sampled_from([1, 2, 3, 7, 13, 41, 64])
VOCAB_SIZES = st.sampled_from([1, 2, 7, 31, 127, 1000, 2047, 2049, 4097])
LAYOUTS = ("contiguous", "strided", "transposed")


def assert_grad_close(got, ref64, eager, what, extra_roundings=0.0, floor=0.0):
    """``checklist.assert_close`` for a gradient whose half-precision computation rounds ``extra_roundings`` more
    times than the eager run's (DESIGN.md section 6): the losses compute their gradient in the forward pass for an
    incoming gradient of 1 and round it there, and the backward scales that rounded gradient (by an incoming
    gradient != 1) and rounds again (one more unit roundoff); fused_linear_jsd's grad_weight rounds once per chunk
    sum. fp32 is unchanged: structural errors are its to catch. ``floor``: as ``assert_close``'s (a relative error
    the inputs' conditioning allows, computed by the caller in float64)."""
    if got.dtype == torch.float32 or not extra_roundings:
        return assert_close(got, ref64, eager, what=what, floor=floor)
    err = rel_error(got, ref64)
    tol = max(half_precision_tolerance(eager, ref64, got.dtype) + extra_roundings * UNIT_ROUNDOFF[got.dtype], floor)
    assert err <= tol, f"{what} ({got.dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


def log_probs(n_rows, n_cols, dtype=torch.float32, layout="contiguous", scale=2.0):
    shape = (n_cols, n_rows) if layout == "transposed" else (n_rows, 2 * n_cols if layout == "strided" else n_cols)
    dim = 0 if layout == "transposed" else 1
    values = torch.log_softmax(torch.randn(shape, device=DEVICE) * scale, dim).to(dtype)
    return values.t() if layout == "transposed" else values[:, ::2] if layout == "strided" else values


def make_labels(n_rows, mode, ignore_index=-100, dtype=torch.int64):
    if mode is None:
        return None
    labels = torch.randint(0, 10, (2 * n_rows,), device=DEVICE).to(dtype)[::2]
    if mode == "some":
        labels[torch.rand(n_rows, device=DEVICE) < 0.4] = ignore_index
    elif mode == "all":
        labels.fill_(ignore_index)
    return labels


def loss_rounding_floor(x64, target, shift_labels, ignore_index, out64):
    """The loss's float32 error that cancellation allows: the sum cancels where the distributions nearly agree
    (measured: 2.7e-3 relative for 3 rows of 2 columns), each term's rounding about u * (|P log P| + |Q log Q| +
    (|P| + |Q|) |log M|); eight such units (exp, log and the sums' order) over the loss. 0 for a zero loss."""
    t64 = target.detach().double()
    p, q = t64.exp(), x64.detach().exp()
    log_m = torch.logaddexp(t64, x64.detach()) - torch.log(torch.tensor(2.0, dtype=torch.float64))
    terms = ((p * t64).abs() + (q * x64.detach()).abs() + (p + q) * log_m.abs()).sum(-1)
    if shift_labels is not None:
        terms = terms[shift_labels != ignore_index]
    loss = out64.detach().abs().item() * max(terms.numel(), 1)  # the reference averages over the valid rows
    return 8.0 * 2.0**-24 * terms.sum().item() / loss if loss > 0 else 0.0


def grad_rounding_floor(x64, target, shift_labels, ignore_index, beta, grad_scale, grad64):
    """The gradient's float32 error that cancellation allows, relative to the float64 gradient: dX = (1 - beta) * Q
    * (X - log M) (Q * (X - Y + 1) at beta = 1) subtracts numbers of size |X| + |Y| + |log beta| + |log(1 - beta)| (the
    mixture's log-sum-exp) that nearly agree where the distributions do; all of them where a row has one class
    (every log-probability 0: the float64 gradient is rounding noise near 1e-17, CI drew fp32's 1.9e-9 against it).
    Two unit roundoffs of those sizes per element (log M's and the subtraction's); measured over 600 draws of this
    file's shapes: errors up to 1.5 of them, and 1.6e-5 relative on a draw that 1e-5 alone fails."""
    x, y = x64.detach(), target.detach().double()
    if beta == 0.0:  # dX = -P: nothing cancels
        return 0.0
    mixture = 0.0 if beta == 1.0 else abs(math.log(beta)) + abs(math.log1p(-beta))
    sizes = x.exp() * (x.abs() + y.abs() + mixture + 1.0)
    valid = (torch.ones(x.shape[0], dtype=torch.bool, device=x.device) if shift_labels is None
             else shift_labels != ignore_index)
    sizes = sizes * valid[:, None] * (abs(grad_scale) / valid.sum().clamp_min(1))
    norm = grad64.norm().item()
    return 2.0 * 2.0**-24 * sizes.norm().item() / norm if norm > 0 else 0.0


def check(input, target, shift_labels=None, beta=0.5, ignore_index=-100, grad_scale=1.0):
    """Loss (fp32) and grad_input against float64 (half precision: grad against the eager half-precision
    reference's error; the loss of exactly-upcast inputs is judged at fp32), inputs untouched."""
    input = input.detach().requires_grad_(True)
    inputs = (input, target) if shift_labels is None else (input, target, shift_labels)
    before = snapshot(inputs)
    out = npu_liger.jsd(input, target, shift_labels, beta, ignore_index)
    (out * grad_scale).backward()
    assert_unchanged(before, inputs, ("input", "target", "shift_labels")[: len(inputs)])
    assert_no_alias((out, input.grad), inputs)
    x64 = input.detach().double().requires_grad_(True)
    out64 = reference(x64, target.double(), shift_labels, beta, ignore_index)
    (out64 * grad_scale).backward()
    x_lp = input.detach().clone().requires_grad_(True)
    out_lp = reference(x_lp.float() if x_lp.dtype != target.dtype else x_lp, target.to(x_lp.dtype).float()
                       if x_lp.dtype != target.dtype else target, shift_labels, beta, ignore_index)
    (out_lp * grad_scale).backward()
    assert out.dtype == torch.float32 and out.shape == () and input.grad.dtype == input.dtype
    assert_close(out, out64, what=f"jsd (beta={beta})", floor=loss_rounding_floor(x64, target, shift_labels,
                                                                               ignore_index, out64))
    assert_grad_close(input.grad, x64.grad, x_lp.grad, f"grad input (beta={beta})", float(grad_scale != 1.0),
                      grad_rounding_floor(x64, target, shift_labels, ignore_index, beta, grad_scale, x64.grad))
    if shift_labels is not None:
        assert (input.grad[shift_labels == ignore_index] == 0).all()
    return out


@pytest.mark.parametrize("beta", BETAS)
@given(n_rows=ROW_SIZES, n_cols=VOCAB_SIZES, dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(LAYOUTS),
       label_mode=st.sampled_from([None, "some", "all"]), label_dtype=st.sampled_from([torch.int32, torch.int64]),
       ignore_index=st.sampled_from([-100, 3]))
def test_matches_float64_reference(beta, n_rows, n_cols, dtype, layout, label_mode, label_dtype, ignore_index):
    assume(n_rows * n_cols <= 100_000)
    labels = make_labels(n_rows, label_mode, ignore_index, label_dtype)
    check(log_probs(n_rows, n_cols, dtype, layout), log_probs(n_rows, n_cols, dtype, layout), labels, beta,
          ignore_index)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@given(n_rows=ROW_SIZES, input_dtype=st.sampled_from(FLOAT_DTYPES), target_dtype=st.sampled_from(FLOAT_DTYPES))
def test_mixed_dtypes(beta, n_rows, input_dtype, target_dtype):
    """A bf16 student against an fp32 teacher (and every other mix): fp32 math on the values as stored."""
    check(log_probs(n_rows, 37, input_dtype), log_probs(n_rows, 37, target_dtype), make_labels(n_rows, "some"), beta)


@pytest.mark.parametrize("beta", BETAS)
def test_no_valid_row_gives_zero_and_zero_grads(beta):
    x = log_probs(5, 33).requires_grad_(True)
    out = npu_liger.jsd(x, log_probs(5, 33), torch.full((5,), -100, device=DEVICE), beta)
    assert out.item() == 0.0
    out.backward()
    assert (x.grad == 0).all()


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_very_negative_log_probabilities_do_not_underflow(beta):
    """log-probabilities below -103 (e^x is 0 in fp32): the mixture's logarithm is a log-sum-exp, so the terms are
    finite and match float64 (log(beta e^y + (1 - beta) e^x) taken directly gives 0 * -inf = NaN)."""
    x = log_probs(4, 50, scale=60.0)
    y = log_probs(4, 50, scale=60.0)
    assert (x < -120).any() and (y < -120).any()
    out = check(x, y, None, beta)
    assert torch.isfinite(out)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_nan_reaches_the_loss(beta):
    x, y = log_probs(3, 40), log_probs(3, 40)
    for t in (x, y):
        poisoned = t.clone()
        poisoned[1, 7] = float("nan")
        args = (poisoned, y) if t is x else (x, poisoned)
        assert torch.isnan(npu_liger.jsd(*args, None, beta))


def test_persistent_grid_strides_over_rows_and_vocab_tiles(small_ub):
    """A 4 KiB UB gives 64-wide tiles (multiplier 10 -> 102 elements), so a 520-wide row takes 9 tiles, and 85
    rows over 40 programs take up to 3 row iterations per program."""
    small_ub(4096)
    plan = flat_plan("cpu", 520, divergence.JSD_MEMORY_MULTIPLIER)
    assert plan.block == 64 and plan.grid(85) == 40
    for beta in BETAS:
        check(log_probs(85, 520), log_probs(85, 520), make_labels(85, "some"), beta, grad_scale=1.5)
    check(log_probs(50, 333, torch.bfloat16, "transposed"), log_probs(50, 333, torch.bfloat16, "strided"), None, 0.3)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_inputs(shape):
    x = randn(shape, requires_grad=True)
    for labels in (None, torch.zeros(shape[0], dtype=torch.int64, device=DEVICE)):
        out = npu_liger.jsd(x, randn(shape), labels)
        assert out.shape == () and out.item() == 0.0
        out.backward()
        assert x.grad.shape == shape
        x.grad = None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x = log_probs(5, 37, dtype).requires_grad_(True)
    y = log_probs(5, 37, dtype)
    labels = make_labels(5, "some")
    for beta in (0.0, 0.4, 1.0):
        for shift_labels in (None, labels):
            run_opcheck(jsd_op, (x, y, shift_labels, beta, -100))
            run_opcheck(with_grad_op, (x.detach(), y, shift_labels, beta, -100, True))
    run_opcheck(jsd_op, (x, y))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def make_inputs(n):
        return log_probs(n, 2 * n + 1).requires_grad_(True), log_probs(n, 2 * n + 1), make_labels(n, "some")

    assert_compiled_forward_backward(lambda x, y, lab: npu_liger.jsd(x * 1.5, y, lab, 0.3) * 2.0,
                                     lambda x, y, lab: reference(x * 1.5, y, lab, 0.3) * 2.0, make_inputs,
                                     [5, 8, 33, 70])


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    x, y, labels = log_probs(64, 1000).requires_grad_(True), log_probs(64, 1000), make_labels(64, "some")
    torch.cuda.set_sync_debug_mode("error")
    try:
        npu_liger.jsd(x, y, labels).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_eager_entry_matches_the_dispatched_op():
    x, y, labels = log_probs(6, 41).requires_grad_(True), log_probs(6, 41), make_labels(6, "some")
    fast = npu_liger.jsd(x, y, labels, 0.3)
    (fast * 3.0).backward()
    fast_grad, x.grad = x.grad.clone(), None
    slow = jsd_op(x, y, labels, 0.3)
    (slow * 3.0).backward()
    assert torch.equal(fast, slow) and torch.equal(fast_grad, x.grad)
    with torch.no_grad():
        assert npu_liger.jsd(x, y, labels).grad_fn is None


def test_module_has_liger_arguments():
    loss = npu_liger.nn.JSD(beta=0.1, ignore_index=3)
    assert "beta=0.1" in repr(loss)
    x, y, labels = log_probs(7, 45), log_probs(7, 45), make_labels(7, "some", ignore_index=3)
    assert_close(loss(x, y, labels), reference(x.double(), y.double(), labels, 0.1, 3))
    assert_close(npu_liger.nn.JSD()(x, y), reference(x.double(), y.double()))
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        npu_liger.nn.JSD(beta=1.5)


def test_second_backward_and_double_backward_raise_clear_errors():
    x = log_probs(3, 8).requires_grad_(True)
    out = npu_liger.jsd(x, log_probs(3, 8))
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time"):
        out.backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(npu_liger.jsd(x, log_probs(3, 8)), x, create_graph=True)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (lambda: (randn((4, 6)), randn((4, 6))), {"beta": 1.5}, ValueError, r"beta must be in \[0, 1\]"),
        (lambda: (randn((4, 6)), randn((4, 6))), {"beta": float("nan")}, ValueError, "beta must be in"),
        (lambda: (randn((24,)), randn((24,))), {}, ValueError, "input must be 2-D"),
        (lambda: (randn((4, 6)), randn((4, 7))), {}, ValueError, "target must have the shape of input"),
        (lambda: (randn((4, 6)), randn((4, 6)).double()), {}, TypeError, "target must be float32"),
        (lambda: (randn((4, 6)).double(), randn((4, 6))), {}, TypeError, "input must be float32"),
        (lambda: (randn((4, 6)), torch.randn(4, 6, device="meta")), {}, RuntimeError, "target must be on the device"),
        (lambda: (randn((4, 6)), randn((4, 6)), torch.zeros(4, device=DEVICE)), {}, TypeError,
         "shift_labels must be int32 or int64"),
        (lambda: (randn((4, 6)), randn((4, 6)), torch.zeros(5, dtype=torch.int64, device=DEVICE)), {}, ValueError,
         r"shift_labels must have shape \(BT,\) = \(4,\)"),
        (lambda: (randn((4, 6)), randn((4, 6))), {"ignore_index": 1.0}, TypeError, "ignore_index must be an int"),
    ],
)
def test_bad_input_raises_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        npu_liger.jsd(*args(), **kwargs)
