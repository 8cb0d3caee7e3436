"""TVD: every reduction against float64, ignored rows, gradients (exact zeros where p == q), opcheck, compile,
tiling loops, no mutation, empty and bad input."""

import importlib

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.tvd as tvd_kernels
from npu_liger.npu_ops._triton import flat_plan
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiles_without_recompiles, assert_no_alias,
                       assert_unchanged, randn, run_opcheck, snapshot)
from checklist import assert_compiled_forward_backward

tvd_op = torch.ops.npu_liger.tvd.default
tvd_backward_op = torch.ops.npu_liger.tvd_backward.default

REDUCTIONS = ("none", "sum", "mean", "batchmean")
# Rows: 1, primes, more rows than the 40 emulated programs. Vocab: 1, primes, around the emulated NPU blocks
# (8192 forward / 4096 backward).
ROW_SIZES = st.sampled_from([1, 2, 3, 7, 13, 41, 64])
VOCAB_SIZES = st.sampled_from([1, 2, 7, 31, 127, 1000, 4095, 4097, 8191, 8193])
LAYOUTS = ("contiguous", "strided", "transposed")


def reference(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    tv = (p - q).abs() * 0.5
    if shift_labels is None:
        valid = torch.ones(p.shape[0], dtype=torch.bool, device=p.device)
    else:
        valid = shift_labels != ignore_index
    tv = torch.where(valid[:, None], tv, torch.zeros_like(tv))
    if reduction == "none":
        return tv
    total = tv.sum()
    if reduction == "sum":
        return total
    divisor = valid.sum() * (p.shape[1] if reduction == "mean" else 1)
    return total / divisor.clamp_min(1)


def probs(n_rows, n_cols, dtype=torch.float32, layout="contiguous"):
    """Rows of probabilities; "strided" views every other column of a wider buffer, "transposed" has column
    stride n_rows and row stride 1."""
    if layout == "transposed":
        return torch.softmax(torch.randn(n_cols, n_rows, device=DEVICE) * 2.0, dim=0).to(dtype).t()
    if layout == "strided":
        return torch.softmax(torch.randn(n_rows, 2 * n_cols, device=DEVICE) * 2.0, dim=1).to(dtype)[:, ::2]
    return torch.softmax(torch.randn(n_rows, n_cols, device=DEVICE) * 2.0, dim=1).to(dtype)


def make_pair(n_rows, n_cols, dtype=torch.float32, layout="contiguous", equal_fraction=0.2):
    """p and q with about ``equal_fraction`` of the elements exactly equal (where the gradient must be 0)."""
    p = probs(n_rows, n_cols, dtype, layout)
    q = probs(n_rows, n_cols, dtype, layout)
    equal = torch.rand(n_rows, n_cols, device=DEVICE) < equal_fraction
    q = q.clone()  # keep q's layout, then copy some of p's values into it
    q[equal] = p[equal]
    return p, q


def make_labels(n_rows, mode, ignore_index=-100, dtype=torch.int64):
    """None, or (BT,) labels (a strided view) with "some", "all" or "no" rows equal to ignore_index."""
    if mode is None:
        return None
    labels = torch.randint(0, 10, (2 * n_rows,), device=DEVICE).to(dtype)[::2]
    if mode == "some":
        labels[torch.rand(n_rows, device=DEVICE) < 0.4] = ignore_index
    elif mode == "all":
        labels.fill_(ignore_index)
    else:
        labels[labels == ignore_index] = ignore_index + 1
    return labels


def check_forward_backward(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    """Forward and both gradients against float64 autograd (half precision against eager half precision),
    exact zeros where p == q or the row is ignored, grad_q == -grad_p, inputs untouched."""
    p = p.detach().requires_grad_(True)
    q = q.detach().requires_grad_(True)
    inputs = (p, q) if shift_labels is None else (p, q, shift_labels)
    before = snapshot(inputs)
    out = npu_liger.tvd(p, q, shift_labels, reduction, ignore_index)
    grad_out = randn(out.shape, out.dtype)
    out.backward(grad_out)
    assert_unchanged(before, inputs, ("p", "q", "shift_labels")[: len(inputs)])
    assert_no_alias((out, p.grad, q.grad), inputs)

    p64 = p.detach().double().requires_grad_(True)
    q64 = q.detach().double().requires_grad_(True)
    out64 = reference(p64, q64, shift_labels, reduction, ignore_index)
    out64.backward(grad_out.double())

    p_lp = p.detach().clone().requires_grad_(True)
    q_lp = q.detach().clone().requires_grad_(True)
    out_lp = reference(p_lp, q_lp, shift_labels, reduction, ignore_index)
    out_lp.backward(grad_out)

    assert out.dtype == torch.promote_types(p.dtype, q.dtype) and out.shape == out64.shape and out.is_contiguous()
    assert p.grad.shape == p.shape and p.grad.dtype == p.dtype and q.grad.dtype == q.dtype
    assert_close(out, out64, out_lp, what=f"tvd ({reduction})")
    assert_close(p.grad, p64.grad, p_lp.grad, what="grad_p")
    assert_close(q.grad, q64.grad, q_lp.grad, what="grad_q")
    if p.dtype == q.dtype:
        assert torch.equal(q.grad, -p.grad)
    zero = p.detach() == q.detach()
    if shift_labels is not None:
        zero |= (shift_labels == ignore_index)[:, None]
    assert (p.grad[zero] == 0).all() and (q.grad[zero] == 0).all()
    return out


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n_rows=ROW_SIZES, n_cols=VOCAB_SIZES, dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(LAYOUTS),
       label_mode=st.sampled_from([None, "some", "all", "no"]), label_dtype=st.sampled_from([torch.int32, torch.int64]),
       ignore_index=st.sampled_from([-100, 3]))
def test_matches_float64_reference(reduction, n_rows, n_cols, dtype, layout, label_mode, label_dtype, ignore_index):
    assume(n_rows * n_cols <= 150_000)
    p, q = make_pair(n_rows, n_cols, dtype, layout)
    labels = make_labels(n_rows, label_mode, ignore_index, label_dtype)
    check_forward_backward(p, q, labels, reduction, ignore_index)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n_rows=ROW_SIZES, n_cols=st.sampled_from([1, 7, 127, 4097]), p_dtype=st.sampled_from(FLOAT_DTYPES),
       q_dtype=st.sampled_from(FLOAT_DTYPES), label_mode=st.sampled_from([None, "some"]))
def test_mixed_dtypes_match_torch(reduction, n_rows, n_cols, p_dtype, q_dtype, label_mode):
    """As Liger-Kernel allows (a bf16 student, an fp32 teacher): any mix of dtypes; fp32 math, the loss in the
    promoted dtype (torch's ``(p - q).abs()`` gives the same), each gradient in its input's dtype."""
    p, q = make_pair(n_rows, n_cols)
    check_forward_backward(p.to(p_dtype), q.to(q_dtype), make_labels(n_rows, label_mode), reduction)


@pytest.mark.parametrize("reduction", ["none", "batchmean"])
@pytest.mark.parametrize("path", ["eager", "op"])
def test_inference_mode_teacher(reduction, path):
    """q (and the labels) made under torch.inference_mode() need no grad and cannot be saved by autograd;
    the torch reference works with them, so must tvd, on the eager path and through the dispatched op."""
    p, q = make_pair(6, 37, torch.bfloat16)
    with torch.inference_mode():
        teacher = q.float() * 1.0
        labels = make_labels(6, "some")
    assert teacher.is_inference() and labels.is_inference()
    student = p.detach().requires_grad_(True)
    fn = npu_liger.tvd if path == "eager" else tvd_op
    out = fn(student, teacher, labels, reduction)
    grad_out = randn(out.shape, out.dtype)
    out.backward(grad_out)
    student_ref = p.detach().requires_grad_(True)
    ref = reference(student_ref, teacher, labels, reduction)
    ref.backward(grad_out)
    student64 = p.detach().double().requires_grad_(True)
    ref64 = reference(student64, teacher.double(), labels, reduction)
    ref64.backward(grad_out.double())
    assert out.dtype == torch.float32 and student.grad.dtype == torch.bfloat16
    assert_close(out, ref64, ref, what="loss")
    assert_close(student.grad, student64.grad, student_ref.grad, what="grad_p")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored_gives_zero_and_zero_grads(reduction):
    p, q = make_pair(5, 33)
    p.requires_grad_(True)
    q.requires_grad_(True)
    labels = torch.full((5,), -100, device=DEVICE)
    out = npu_liger.tvd(p, q, labels, reduction)
    assert not torch.isnan(out).any() and (out == 0).all()
    out.backward(torch.ones_like(out))
    assert (p.grad == 0).all() and (q.grad == 0).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_grads_are_exactly_zero_where_p_equals_q(reduction, dtype):
    p, q = make_pair(6, 50, dtype, equal_fraction=0.5)
    q[3] = p[3]  # one row identical throughout
    check_forward_backward(p, q, None, reduction)
    p.requires_grad_(True)
    out = npu_liger.tvd(p, p.detach().clone(), reduction=reduction)
    assert (out == 0).all()
    out.backward(torch.ones_like(out))
    assert (p.grad == 0).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_none_backward_reads_a_broadcast_grad(dtype):
    """``out.sum().backward()`` hands the "none" backward an expanded grad (strides (0, 0)): read through strides."""
    p, q = make_pair(9, 70, dtype)
    p.requires_grad_(True)
    q.requires_grad_(True)
    labels = make_labels(9, "some")
    npu_liger.tvd(p, q, labels, "none").sum().backward()
    expected = torch.sign(p.detach().double() - q.detach().double()) * 0.5 * (labels != -100)[:, None]
    assert torch.equal(p.grad.double(), expected) and torch.equal(q.grad.double(), -expected)


def test_schema_defaults_work_from_python():
    p, q = make_pair(4, 19)
    expected = reference(p.double(), q.double())
    assert_close(torch.ops.npu_liger.tvd(p, q), expected)
    assert_close(npu_liger.tvd(p, q), expected)
    assert_close(tvd_op(p, q, reduction="sum"), reference(p.double(), q.double(), reduction="sum"))
    labels = make_labels(4, "some")
    assert_close(torch.ops.npu_liger.tvd(p, q, labels), reference(p.double(), q.double(), labels))
    assert_close(npu_liger.tvd(p, q, shift_labels=labels, reduction="mean", ignore_index=-100),
                 reference(p.double(), q.double(), labels, "mean"))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_module_matches_functional(reduction):
    loss = npu_liger.nn.TVDLoss(reduction=reduction, ignore_index=3)
    assert "reduction" in repr(loss)
    p, q = make_pair(7, 45)
    labels = make_labels(7, "some", ignore_index=3)
    assert_close(loss(p, q, labels), reference(p.double(), q.double(), labels, reduction, 3))
    assert_close(loss(p, q), reference(p.double(), q.double(), None, reduction, 3))


def test_persistent_grid_strides_over_rows_and_vocab_tiles(small_ub):
    """A 4 KiB UB gives 128-wide vocab tiles for both kernels, so a 520-wide row takes 5 tiles, and 85 rows
    over 40 programs take up to 3 row iterations per program."""
    small_ub(4096)
    n_rows, n_cols = 85, 520
    fwd = flat_plan("cpu", n_cols, tvd_kernels.FORWARD_MEMORY_MULTIPLIER)
    bwd = flat_plan("cpu", n_cols, tvd_kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert fwd.block == 128 and bwd.block == 128 and fwd.block * 4 < n_cols
    assert fwd.grid(n_rows) == 40 < n_rows
    for reduction in REDUCTIONS:
        p, q = make_pair(n_rows, n_cols)
        check_forward_backward(p, q, make_labels(n_rows, "some"), reduction)
    p, q = make_pair(50, 333, torch.bfloat16, "transposed")
    check_forward_backward(p, q, None, "batchmean")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_inputs(shape, reduction):
    p = randn(shape, requires_grad=True)
    q = randn(shape, requires_grad=True)
    labels = torch.zeros(shape[0], dtype=torch.int64, device=DEVICE)
    for shift_labels in (None, labels):
        out = npu_liger.tvd(p, q, shift_labels, reduction)
        if reduction == "none":
            assert out.shape == shape
        else:
            assert out.shape == () and out.item() == 0.0
        out.backward(torch.ones_like(out))
        assert p.grad.shape == shape and q.grad.shape == shape
        p.grad = q.grad = None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    p, q = make_pair(5, 37, dtype)
    p.requires_grad_(True)
    q.requires_grad_(True)
    labels = make_labels(5, "some")
    for reduction in REDUCTIONS:
        for shift_labels in (None, labels):
            run_opcheck(tvd_op, (p, q, shift_labels, reduction, -100))
            grad_shape = p.shape if reduction == "none" else ()
            run_opcheck(tvd_backward_op, (randn(grad_shape, dtype), p.detach(), q.detach(), shift_labels, reduction,
                                          -100))
    run_opcheck(tvd_op, (p, q))
    strided = make_pair(3, 6, dtype, "strided")
    run_opcheck(tvd_op, (*strided, make_labels(3, "some"), "none", -100))


@pytest.mark.parametrize("reduction", ["none", "batchmean"])
def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles(reduction):
    def make_inputs(n):
        p, q = make_pair(n, 2 * n + 1)
        return p.requires_grad_(True), q.requires_grad_(True), make_labels(n, "some")

    assert_compiled_forward_backward(
        lambda p, q, labels: npu_liger.tvd(p * 1.5, q, labels, reduction),
        lambda p, q, labels: reference(p * 1.5, q, labels, reduction),
        make_inputs,
        [5, 8, 33, 70],
    )

def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda p, q: npu_liger.tvd(p, q, None, "mean") + 1.0,
        lambda n: make_pair(n, 3 * n),
        [4, 9, 17],
        lambda inputs, got, eager: assert_close(got, reference(inputs[0].double(), inputs[1].double(), None,
                                                               "mean") + 1.0),
    )


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    p, q = make_pair(64, 1000)
    p.requires_grad_(True)
    labels = make_labels(64, "some")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for reduction in REDUCTIONS:
            out = npu_liger.tvd(p, q, labels, reduction)
            out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_eager_entry_matches_the_dispatched_op(reduction):
    p, q = make_pair(6, 41)
    p.requires_grad_(True)
    q.requires_grad_(True)
    labels = make_labels(6, "some")
    fast = npu_liger.tvd(p, q, labels, reduction)
    fast.backward(torch.ones_like(fast))
    fast_grads = (p.grad.clone(), q.grad.clone())
    p.grad = q.grad = None
    slow = tvd_op(p, q, labels, reduction)
    slow.backward(torch.ones_like(slow))
    assert torch.equal(fast, slow) and torch.equal(fast_grads[0], p.grad) and torch.equal(fast_grads[1], q.grad)
    with torch.no_grad():
        assert npu_liger.tvd(p, q, labels, reduction).grad_fn is None


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("the backward recomputed from p and q in an eager training call")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bwd_multiplier", [None, 24.0])
def test_eager_training_backward_reads_codes_not_p_and_q(reduction, bwd_multiplier, monkeypatch):
    """Eager training calls save 2-bit sign codes in the forward; the backward reads them (never p and q) and
    gives the op's bits. A larger backward multiplier makes the backward's code tiles narrower than the
    forward's (BYTES < QUARTER), so a forward tile is read back in several pieces."""
    if bwd_multiplier is not None:
        monkeypatch.setattr(tvd_kernels, "BACKWARD_MEMORY_MULTIPLIER", bwd_multiplier)
    p, q = make_pair(11, 4100 if DEVICE != "cpu" else 1030, equal_fraction=0.3)
    labels = make_labels(11, "some")
    slow_p, slow_q = p.clone().requires_grad_(True), q.clone().requires_grad_(True)
    slow = tvd_op(slow_p, slow_q, labels, reduction)
    slow.backward(torch.ones_like(slow) * 3.0)
    monkeypatch.setattr(tvd_kernels, "_tvd_bwd_kernel", _NoLaunch())
    p.requires_grad_(True)
    q.requires_grad_(True)
    fast = npu_liger.tvd(p, q, labels, reduction)
    assert fast.grad_fn is not None and "TvdEager" in type(fast.grad_fn).__name__
    fast.backward(torch.ones_like(fast) * 3.0)
    assert torch.equal(fast, slow) and torch.equal(p.grad, slow_p.grad) and torch.equal(q.grad, slow_q.grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("student", ["p", "q"])
def test_eager_backward_writes_only_the_needed_gradient(reduction, student, monkeypatch):
    """A distillation teacher needs no gradient: the eager backward neither allocates nor writes it (a quarter
    of forward+backward's bytes), and the student's gradient keeps the op's bits."""
    registration = importlib.import_module("npu_liger.registrations.tvd")
    p, q = make_pair(7, 4100 if DEVICE != "cpu" else 1030, equal_fraction=0.3)
    labels = make_labels(7, "some")
    slow_p, slow_q = p.clone().requires_grad_(True), q.clone().requires_grad_(True)
    slow = tvd_op(slow_p, slow_q, labels, reduction)
    slow.backward(torch.ones_like(slow) * 3.0)
    returned = []

    def recording(*args, **kwargs):
        returned.append(tvd_kernels.tvd_backward_from_codes(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(registration, "tvd_backward_from_codes", recording)
    leaf, teacher = (p, q) if student == "p" else (q, p)
    leaf.requires_grad_(True)
    fast = npu_liger.tvd(p, q, labels, reduction)
    fast.backward(torch.ones_like(fast) * 3.0)
    assert len(returned) == 1
    grad_p, grad_q = returned[0]
    assert (grad_q is None) == (student == "p") and (grad_p is None) == (student == "q")
    assert teacher.grad is None and torch.equal(fast, slow)
    assert torch.equal(leaf.grad, slow_p.grad if student == "p" else slow_q.grad)


def test_double_backward_raises_clear_error():
    p, q = make_pair(3, 8)
    p.requires_grad_(True)
    (grad_p,) = torch.autograd.grad(npu_liger.tvd(p, q, reduction="sum") * 2.0, p, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_p.sum().backward()


def _p():
    return randn((4, 6))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (lambda: (_p(), _p()), {"reduction": "avg"}, ValueError, "reduction must be one of"),
        (lambda: (randn((24,)), randn((24,))), {}, ValueError, "p must be 2-D"),
        (lambda: (_p(), randn((4, 7))), {}, ValueError, "q must have the shape of p"),
        (lambda: (_p(), randn((4, 6)).double()), {}, TypeError, "q must be float32, float16 or bfloat16"),
        (lambda: (_p(), torch.randn(4, 6, device="meta")), {}, RuntimeError, "q must be on the device of p"),
        (lambda: (_p().double(), _p().double()), {}, TypeError, "p must be float32, float16 or bfloat16"),
        (lambda: (torch.ones(4, 6, dtype=torch.int64, device=DEVICE), _p()), {}, TypeError, "p must be float32"),
        (lambda: (_p(), _p(), torch.zeros(4, device=DEVICE)), {}, TypeError, "shift_labels must be int32 or int64"),
        (lambda: (_p(), _p(), torch.zeros(5, dtype=torch.int64, device=DEVICE)), {}, ValueError,
         r"shift_labels must have shape \(BT,\) = \(4,\)"),
        (lambda: (_p(), _p(), torch.zeros(4, 1, dtype=torch.int64, device=DEVICE)), {}, ValueError,
         "shift_labels must have shape"),
        (lambda: (_p(), _p(), torch.zeros(4, dtype=torch.int64, device="meta")), {}, RuntimeError,
         "shift_labels must be on the device of p"),
    ],
)
def test_bad_input_raises_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        npu_liger.tvd(*args(), **kwargs)


def test_bad_module_and_backward_input_raise_clear_errors():
    with pytest.raises(ValueError, match="reduction must be one of"):
        npu_liger.nn.TVDLoss(reduction="batch_mean")
    p, q = make_pair(4, 6)
    with pytest.raises(ValueError, match="grad_out must be a 0-d tensor"):
        tvd_backward_op(randn((4, 6)), p, q, None, "sum", -100)
    with pytest.raises(ValueError, match="grad_out must have the shape of p"):
        tvd_backward_op(randn(()), p, q, None, "none", -100)
    with pytest.raises(TypeError, match="grad_out must have the dtype of the loss"):
        tvd_backward_op(randn((), torch.float16), p, q, None, "mean", -100)
