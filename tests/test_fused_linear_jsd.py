"""fused_linear_jsd: loss and the student's grads against float64 ``jsd(log_softmax(x @ W.T / T), ...)`` with
chunks shrunk so every loop turns, every beta and temperature, ignored rows, student and teacher of other hidden
sizes and dtypes, no teacher gradient, chunked memory, Liger's module, opcheck, compile without recompiles, no
mutation, empty and bad input."""

import contextlib
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.fused_linear_jsd as fljsd_kernels
from checklist import (DEVICE, FLOAT_DTYPES, RecordedEmptyShapes, assert_close, assert_compiled_forward_backward,
                       assert_no_alias, assert_unchanged, randn, run_opcheck, snapshot)
from op_cases import fused_linear_jsd_reference as reference
from op_cases import jsd_reference as reference_from_log_probs
from test_jsd import assert_grad_close

fljsd_op = torch.ops.npu_liger.fused_linear_jsd.default
with_grad_op = torch.ops.npu_liger.fused_linear_jsd_with_grad.default


@contextlib.contextmanager
def chunks_of(rows):
    with mock.patch.object(fljsd_kernels, "chunk_rows", lambda n_rows, hidden, vocab: rows):
        yield


def make_inputs(n_rows, hidden, teacher_hidden, vocab, dtype=torch.float32, teacher_dtype=None, strided=False):
    teacher_dtype = teacher_dtype or dtype
    return (randn((n_rows, hidden), dtype, noncontiguous=strided),
            randn((vocab, hidden), dtype, scale=hidden ** -0.5 * 2.0),
            randn((n_rows, teacher_hidden), teacher_dtype, noncontiguous=strided),
            randn((vocab, teacher_hidden), teacher_dtype, scale=teacher_hidden ** -0.5 * 2.0))


def make_labels(n_rows, mode):
    if mode is None:
        return None
    labels = torch.randint(0, 10, (n_rows,), device=DEVICE)
    if mode == "some":
        labels[torch.rand(n_rows, device=DEVICE) < 0.4] = -100
    elif mode == "all":
        labels.fill_(-100)
    return labels


# fp32 roundings the student gradients' cancellation floor allows (below): the log-probabilities, the mixture's
# log-sum-exp, the products, the log-softmax Jacobian's subtraction and the matmuls' sums. Measured: at most 10.5
# of them over 700 random draws of test_matches_float64_reference's cases and 300 of its worst one (1 row, 5
# classes, beta 0.5, T 0.7, which failed 1e-5 in 5 of those 300 without the floor).
CANCELLATION_ROUNDINGS = 16


def fp32_grad_floors(inputs, labels, beta, temperature, grad_scale, grads64):
    """The relative errors fp32 allows the student gradients where they cancel: d loss / d logits = (dX - Q *
    sum(dX)) / T subtracts nearly equal terms when the student is confident (Q of its top class near 1; eager fp32
    itself missed 1e-5 by 3.5x on one of 300 draws of 1 row x 5 classes), and the matmuls then sum those terms. Each
    element's terms, |dX| + Q * sum|dX|, taken through |weight| (grad_input) and |input| (grad_weight), times
    CANCELLATION_ROUNDINGS unit roundoffs, relative to the float64 gradient; computed in float64."""
    x, w, tx, tw = (t.detach().double() for t in inputs)
    log_q = ((x @ w.T) / temperature).log_softmax(-1).requires_grad_(True)
    log_p = ((tx @ tw.T) / temperature).log_softmax(-1)
    (reference_from_log_probs(log_q, log_p, labels, beta, -100) * grad_scale).backward()
    d_log_q = log_q.grad.abs()
    sizes = (d_log_q + log_q.detach().exp() * d_log_q.sum(-1, keepdim=True)) / temperature
    floors = []
    for size, grad64 in zip((sizes @ w.abs(), sizes.T @ x.abs()), grads64):
        norm = grad64.norm().item()
        floors.append(CANCELLATION_ROUNDINGS * 2.0**-24 * size.norm().item() / norm if norm > 0 else 0.0)
    return floors


def check(inputs, labels=None, beta=0.5, temperature=1.0, rows=None, grad_scale=1.0):
    """Loss and the student's gradients against float64; half precision against the unfused run in the inputs'
    dtype (logits in that dtype, the JSD in fp32, as HF-style code computes it)."""
    x, w, tx, tw = inputs
    leaves = [x.detach().requires_grad_(True), w.detach().requires_grad_(True), tx, tw]
    before = snapshot(leaves)
    with chunks_of(rows) if rows else contextlib.nullcontext():
        out = npu_liger.fused_linear_jsd(*leaves, labels, beta, -100, temperature)
    (out * grad_scale).backward()
    assert_unchanged(before, leaves, ("student_input", "student_weight", "teacher_input", "teacher_weight"))
    assert_no_alias((out, leaves[0].grad, leaves[1].grad), leaves)
    leaves64 = [t.detach().double().requires_grad_(i < 2) for i, t in enumerate(inputs)]
    out64 = reference(*leaves64, labels, beta, -100, temperature)
    (out64 * grad_scale).backward()
    leaves_lp = [t.detach().clone().requires_grad_(i < 2) for i, t in enumerate(inputs)]
    out_lp = reference(*leaves_lp, labels, beta, -100, temperature)
    (out_lp * grad_scale).backward()
    assert out.dtype == torch.float32 and out.shape == ()
    if x.dtype == torch.float32:
        assert_close(out, out64, what="loss")
    else:  # half-precision logits: judged against the unfused half-precision run's error
        assert_close(out.to(x.dtype), out64, out_lp.to(x.dtype), what="loss")
    n_chunks = -(-x.shape[0] // rows) if rows else 1
    scaled = float(grad_scale != 1.0)  # the backward scales the forward's rounded gradients: one more rounding
    floors = fp32_grad_floors(inputs, labels, beta, temperature, grad_scale, (leaves64[0].grad, leaves64[1].grad))
    for name, got, want, eager, extra, floor in zip(("student_input", "student_weight"), leaves, leaves64, leaves_lp,
                                                    (scaled, scaled + n_chunks - 1), floors):
        assert got.grad.dtype == got.dtype
        assert_grad_close(got.grad, want.grad, eager.grad, f"grad {name} (beta={beta}, T={temperature})", extra,
                          floor)
    return out


@given(n_rows=st.sampled_from([1, 3, 7, 17]), vocab=st.sampled_from([1, 5, 33, 130]),
       beta=st.sampled_from([0.0, 0.3, 0.5, 1.0]), temperature=st.sampled_from([1.0, 0.7, 2.0]),
       label_mode=st.sampled_from([None, "some", "all"]), rows=st.sampled_from([1, 2, 5, None]),
       strided=st.booleans())
def test_matches_float64_reference(n_rows, vocab, beta, temperature, label_mode, rows, strided):
    check(make_inputs(n_rows, 12, 9, vocab, strided=strided), make_labels(n_rows, label_mode), beta, temperature,
          rows, grad_scale=1.7)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_log_probabilities_of_offset_logits_keep_their_precision(beta):
    """Logits around +1000 (student) and -700 (teacher), whose softmax ignores the offset: log-probabilities
    computed as log_softmax does, (z - max) - log(sum), subtract numbers near each other (exact) and keep fp32's
    precision; z - (max + log(sum)) rounds max + log(sum) to fp32's spacing at 1000 (6e-5), an error every
    log-probability of the row shares (the kernel did that before: loss and gradients 2.6e-5 to 4e-5 off)."""
    vocab = 33
    student = 1000.0 + 2.0 * torch.randn(2, vocab, device=DEVICE)
    teacher = -700.0 + 2.0 * torch.randn(2, vocab, device=DEVICE)
    identity = torch.eye(vocab, device=DEVICE)  # logits = input @ identity.T: the inputs are the logits
    check((student, identity, teacher, identity), beta=beta, temperature=1.0, grad_scale=1.3)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("teacher_dtype", [None, torch.float32])
def test_half_precision_and_mixed_teacher(dtype, teacher_dtype):
    check(make_inputs(13, 16, 24, 70, dtype, teacher_dtype), make_labels(13, "some"), 0.5, 2.0, rows=4)


def test_tiled_vocab_and_many_chunks(small_ub):
    """A 4 KiB UB: 64-wide vocab tiles (multiplier 12), so a 300-wide row takes 5 tiles in each of the kernel's
    three passes; 45 rows in chunks of 8 over 40 programs."""
    small_ub(4096)
    for beta in (0.0, 0.5, 1.0):
        check(make_inputs(45, 16, 8, 300), make_labels(45, "some"), beta, 1.3, rows=8)


def test_teacher_gets_no_gradient_and_chunk_memory():
    """Only the student's gradients are computed; no buffer of (BT, V) logits is made: one chunk per model."""
    x, w, tx, tw = make_inputs(12, 8, 6, 40)
    tx.requires_grad_(True)
    tw.requires_grad_(True)
    with chunks_of(4), RecordedEmptyShapes(fljsd_kernels) as shapes:
        out = npu_liger.fused_linear_jsd(x.requires_grad_(True), w, tx, tw)
    assert (4, 40) in shapes and (12, 40) not in shapes
    out.backward()
    assert x.grad is not None and tx.grad is None and tw.grad is None


def test_no_valid_row_gives_zero():
    x, w, tx, tw = make_inputs(5, 8, 6, 20)
    x.requires_grad_(True)
    out = npu_liger.fused_linear_jsd(x, w, tx, tw, torch.full((5,), -100, device=DEVICE))
    assert out.item() == 0.0
    out.backward()
    assert (x.grad == 0).all()


@pytest.mark.parametrize("n_rows, vocab", [(0, 5), (3, 0)])
def test_empty_inputs(n_rows, vocab):
    x, w, tx, tw = make_inputs(n_rows, 4, 3, vocab)
    x.requires_grad_(True)
    w.requires_grad_(True)
    out = npu_liger.fused_linear_jsd(x, w, tx, tw)
    assert out.shape == () and out.item() == 0.0
    out.backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and (w.grad == 0).all()


def test_opcheck():
    x, w, tx, tw = make_inputs(5, 8, 6, 20)
    labels = make_labels(5, "some")
    with chunks_of(2):
        for labels_ in (None, labels):
            run_opcheck(fljsd_op, (x.requires_grad_(True), w.requires_grad_(True), tx, tw, labels_, 0.3, -100, 2.0))
            run_opcheck(with_grad_op, (x.detach(), w.detach(), tx, tw, labels_, 0.0, -100, 1.0, True, True))
            run_opcheck(with_grad_op, (x.detach(), w.detach(), tx, tw, labels_, 1.0, -100, 1.0, False, True))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def make(n):
        x, w, tx, tw = make_inputs(n, 12, 9, 31)
        return x.requires_grad_(True), w.requires_grad_(True), tx, tw, make_labels(n, "some")

    with chunks_of(4):
        assert_compiled_forward_backward(
            lambda x, w, tx, tw, lab: npu_liger.fused_linear_jsd(x * 1.5, w, tx, tw, lab, 0.3, -100, 2.0) * 2.0,
            lambda x, w, tx, tw, lab: reference(x * 1.5, w, tx, tw, lab, 0.3, -100, 2.0) * 2.0, make, [5, 8, 19])


def test_eager_entry_matches_the_dispatched_op():
    x, w, tx, tw = make_inputs(9, 8, 6, 20)
    labels = make_labels(9, "some")
    grads = []
    for fn in (npu_liger.fused_linear_jsd, fljsd_op):
        xs, ws = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        with chunks_of(4):
            out = fn(xs, ws, tx, tw, labels, 0.3, -100, 2.0)
        (out * 3.0).backward()
        grads.append((out, xs.grad, ws.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_module_has_liger_arguments():
    loss = npu_liger.nn.FusedLinearJSD(jsd_beta=0.1, ignore_index=-100, temperature=2.0, accum_dtype=torch.float32)
    assert "jsd_beta=0.1" in repr(loss)
    inputs = make_inputs(7, 8, 6, 20)
    labels = make_labels(7, "some")
    assert_close(loss(*inputs, labels), reference(*[t.double() for t in inputs], labels, 0.1, -100, 2.0))
    with pytest.raises(ValueError, match="temperature must be positive"):
        npu_liger.nn.FusedLinearJSD(temperature=0.0)


def test_second_backward_and_double_backward_raise_clear_errors():
    x, w, tx, tw = make_inputs(3, 4, 5, 6)
    x.requires_grad_(True)
    out = npu_liger.fused_linear_jsd(x, w, tx, tw)
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time"):
        out.backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(npu_liger.fused_linear_jsd(x, w, tx, tw), x, create_graph=True)


@pytest.mark.parametrize(
    "change, kwargs, error, match",
    [
        (lambda a: (a[0][0], a[1], a[2], a[3]), {}, ValueError, "student_input must be 2-D"),
        (lambda a: (a[0], a[1][:, :3], a[2], a[3]), {}, ValueError, "student_weight must have shape"),
        (lambda a: (a[0], a[1].double(), a[2], a[3]), {}, TypeError, "student_weight must be float32"),
        (lambda a: (a[0], a[1].half(), a[2], a[3]), {}, TypeError, "student_weight must have the dtype"),
        (lambda a: (a[0], a[1], a[2][:2], a[3]), {}, ValueError, "teacher_input must have the rows"),
        (lambda a: (a[0], a[1], a[2], a[3][:4]), {}, ValueError, "teacher_weight must have the vocabulary"),
        (lambda a: a, {"jsd_beta": -0.5}, ValueError, r"jsd_beta must be in \[0, 1\]"),
        (lambda a: a, {"temperature": -1.0}, ValueError, "temperature must be positive"),
        (lambda a: a + (torch.zeros(4, dtype=torch.int64, device=DEVICE),), {}, ValueError, "shift_labels must have"),
    ],
)
def test_bad_input_raises_clear_error(change, kwargs, error, match):
    with pytest.raises(error, match=match):
        npu_liger.fused_linear_jsd(*change(make_inputs(3, 4, 5, 6)), **kwargs)
