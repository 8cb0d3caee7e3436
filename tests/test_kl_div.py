"""kl_div: every reduction and log_target against float64 ``F.kl_div`` (both gradients), mixed dtypes, zeros in
y_true (torch's 0 terms and NaN y_true gradient), an inference-mode teacher, Liger's module, opcheck, compile without
recompiles, tiling loops, no mutation, empty and bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.kl_div as kl_kernels
from npu_liger.npu_ops._triton import flat_plan
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward, assert_no_alias,
                       assert_unchanged, randn, run_opcheck, snapshot)

kl_div_op = torch.ops.npu_liger.kl_div.default
kl_div_backward_op = torch.ops.npu_liger.kl_div_backward.default
REDUCTIONS = ("none", "sum", "mean", "batchmean")
ROW_SIZES = st.sampled_from([1, 2, 3, 7, 13, 41, 64])
VOCAB_SIZES = st.sampled_from([1, 2, 7, 31, 127, 1000, 2047, 2049, 4097])
LAYOUTS = ("contiguous", "strided", "transposed")


def make(n_rows, n_cols, dtype=torch.float32, layout="contiguous", log=False):
    """Rows of log-probabilities (log=True) or positive probabilities, in a layout."""
    shape = (n_cols, n_rows) if layout == "transposed" else (n_rows, 2 * n_cols if layout == "strided" else n_cols)
    dim = 0 if layout == "transposed" else 1
    logits = torch.randn(shape, device=DEVICE) * 2.0
    values = torch.log_softmax(logits, dim) if log else torch.softmax(logits, dim)
    # no probability rounded to 0 (torch's y_true gradient is NaN there: test_zeros_in_y_true_... covers it)
    values = values.to(dtype) if log else values.to(dtype).clamp_min(torch.finfo(dtype).tiny)
    return values.t() if layout == "transposed" else values[:, ::2] if layout == "strided" else values


def check(y_pred, y_true, reduction, log_target, grad_true=True):
    """Forward and both gradients against float64 F.kl_div (half precision against eager half precision)."""
    y_pred = y_pred.detach().requires_grad_(True)
    y_true = y_true.detach().requires_grad_(grad_true)
    inputs = (y_pred, y_true)
    before = snapshot(inputs)
    out = npu_liger.kl_div(y_pred, y_true, reduction, log_target)
    grad_out = randn(out.shape, out.dtype)
    out.backward(grad_out)
    assert_unchanged(before, inputs, ("y_pred", "y_true"))
    assert_no_alias((out, y_pred.grad, y_true.grad), inputs)
    leaves64 = [t.detach().double().requires_grad_(t.requires_grad) for t in inputs]
    out64 = F.kl_div(*leaves64, reduction=reduction, log_target=log_target)
    out64.backward(grad_out.double())
    leaves_lp = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out_lp = F.kl_div(*leaves_lp, reduction=reduction, log_target=log_target)
    out_lp.backward(grad_out.to(out_lp.dtype))
    assert out.dtype == out_lp.dtype and out.shape == out64.shape and out.is_contiguous()
    assert_close(out, out64, out_lp, what=f"kl_div ({reduction}, log_target={log_target})")
    assert y_pred.grad.dtype == y_pred.dtype
    assert_close(y_pred.grad, leaves64[0].grad, leaves_lp[0].grad, what="grad y_pred")
    if grad_true:
        assert y_true.grad.dtype == y_true.dtype
        assert_close(y_true.grad, leaves64[1].grad, leaves_lp[1].grad, what="grad y_true")
    return out


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n_rows=ROW_SIZES, n_cols=VOCAB_SIZES, dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(LAYOUTS),
       log_target=st.booleans())
def test_matches_float64_reference(reduction, n_rows, n_cols, dtype, layout, log_target):
    assume(n_rows * n_cols <= 100_000)
    check(make(n_rows, n_cols, dtype, layout, log=True), make(n_rows, n_cols, dtype, layout, log=log_target),
          reduction, log_target)


@pytest.mark.parametrize("reduction", ["none", "batchmean"])
@given(n_rows=ROW_SIZES, pred_dtype=st.sampled_from(FLOAT_DTYPES), true_dtype=st.sampled_from(FLOAT_DTYPES),
       log_target=st.booleans())
def test_mixed_dtypes_match_torch(reduction, n_rows, pred_dtype, true_dtype, log_target):
    """A bf16 student against an fp32 teacher (and every other mix): the loss in torch's promoted dtype."""
    check(make(n_rows, 37, pred_dtype, log=True), make(n_rows, 37, true_dtype, log=log_target), reduction,
          log_target)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_zeros_in_y_true_give_torch_terms_and_gradients(reduction):
    """y_true == 0 contributes 0 (eps only guards the logarithm), y_pred's gradient there is 0, and y_true's
    gradient there is NaN exactly as torch's (t / t); elsewhere both match float64."""
    y_pred = make(6, 40, log=True).requires_grad_(True)
    y_true = make(6, 40)
    y_true[torch.rand(6, 40, device=DEVICE) < 0.3] = 0.0
    y_true.requires_grad_(True)
    out = npu_liger.kl_div(y_pred, y_true, reduction)
    ref_pred, ref_true = y_pred.detach().double().requires_grad_(True), y_true.detach().double().requires_grad_(True)
    ref = F.kl_div(ref_pred, ref_true, reduction=reduction)
    g = randn(out.shape)
    out.backward(g)
    ref.backward(g.double())
    assert torch.isfinite(out).all()
    assert_close(out, ref)
    assert_close(y_pred.grad, ref_pred.grad)
    assert torch.equal(y_true.grad.isnan(), ref_true.grad.isnan()) and y_true.grad.isnan().any()
    finite = ~ref_true.grad.isnan()
    assert_close(y_true.grad[finite], ref_true.grad[finite])
    # eps is no clamp: a y_true below eps keeps its own logarithm (Liger-Kernel's clamp changes the term)
    tiny = torch.full((1, 3), 1e-12, device=DEVICE)
    assert_close(npu_liger.kl_div(torch.zeros(1, 3, device=DEVICE), tiny, "sum", False, 1e-10),
                 F.kl_div(torch.zeros(1, 3, dtype=torch.float64, device=DEVICE), tiny.double(), reduction="sum"))


def test_non_finite_inputs_follow_torch():
    y_pred = make(3, 8, log=True)
    y_true = make(3, 8)
    y_pred[0, 1], y_true[1, 2], y_pred[2, 3], y_true[2, 3] = float("nan"), float("nan"), float("-inf"), 0.0
    for reduction in REDUCTIONS:
        out = npu_liger.kl_div(y_pred, y_true, reduction)
        ref = F.kl_div(y_pred, y_true, reduction=reduction)
        assert torch.equal(out.isnan(), ref.isnan()), reduction


@pytest.mark.parametrize("path", ["eager", "op"])
def test_inference_mode_teacher(path):
    student = make(6, 37, torch.bfloat16, log=True).requires_grad_(True)
    with torch.inference_mode():
        teacher = make(6, 37) * 1.0
    fn = npu_liger.kl_div if path == "eager" else kl_div_op
    out = fn(student, teacher, "batchmean")
    out.backward()
    ref_student = student.detach().double().requires_grad_(True)
    F.kl_div(ref_student, teacher.double(), reduction="batchmean").backward()
    eager_student = student.detach().clone().requires_grad_(True)
    F.kl_div(eager_student, teacher.clone(), reduction="batchmean").backward()  # torch cannot save it
    assert out.dtype == torch.float32 and student.grad.dtype == torch.bfloat16
    assert_close(student.grad, ref_student.grad, eager_student.grad)


def test_persistent_grid_strides_over_rows_and_vocab_tiles(small_ub):
    """A 4 KiB UB gives 128-wide forward and 64-wide backward tiles, so a 520-wide row takes 5 and 9 tiles, and
    85 rows over 40 programs take up to 3 row iterations per program."""
    small_ub(4096)
    fwd = flat_plan("cpu", 520, kl_kernels.FORWARD_MEMORY_MULTIPLIER)
    bwd = flat_plan("cpu", 520, kl_kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert fwd.block == 64 and bwd.block == 64 and fwd.grid(85) == 40
    for reduction in REDUCTIONS:
        for log_target in (False, True):
            check(make(85, 520, log=True), make(85, 520, log=log_target), reduction, log_target)
    check(make(50, 333, torch.bfloat16, "transposed", log=True), make(50, 333, torch.bfloat16, "transposed"), "sum",
          False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_inputs_follow_torch(shape, reduction):
    y_pred, y_true = randn(shape, requires_grad=True), randn(shape, requires_grad=True)
    out = npu_liger.kl_div(y_pred, y_true, reduction)
    ref = F.kl_div(y_pred, y_true, reduction=reduction)  # 0 / 0 is NaN for mean (and batchmean of 0 rows)
    assert out.shape == ref.shape and torch.equal(out.isnan(), ref.isnan())
    out.backward(torch.ones_like(out))
    assert y_pred.grad.shape == shape and y_true.grad.shape == shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    y_pred = make(5, 37, dtype, log=True).requires_grad_(True)
    y_true = make(5, 37, dtype).requires_grad_(True)
    for reduction in REDUCTIONS:
        for log_target in (False, True):
            run_opcheck(kl_div_op, (y_pred, y_true, reduction, log_target, 1e-10))
        grad = randn(y_pred.shape if reduction == "none" else (), dtype)
        run_opcheck(kl_div_backward_op, (grad, y_pred.detach(), y_true.detach(), reduction, False, 1e-10, True, True))
        run_opcheck(kl_div_backward_op, (grad, y_pred.detach(), y_true.detach(), reduction, True, 1e-10, True, False))
    run_opcheck(kl_div_op, (y_pred, y_true))


@pytest.mark.parametrize("reduction", ["none", "batchmean"])
def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles(reduction):
    def make_inputs(n):
        return make(n, 2 * n + 1, log=True).requires_grad_(True), make(n, 2 * n + 1).requires_grad_(True)

    assert_compiled_forward_backward(lambda x, t: npu_liger.kl_div(x * 1.5, t, reduction) * 2.0,
                                     lambda x, t: F.kl_div(x * 1.5, t, reduction=reduction) * 2.0, make_inputs,
                                     [5, 8, 33, 70])


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    y_pred, y_true = make(64, 1000, log=True).requires_grad_(True), make(64, 1000)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for reduction in REDUCTIONS:
            out = npu_liger.kl_div(y_pred, y_true, reduction)
            out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_module_is_torch_kl_div_loss_with_liger_arguments():
    loss = npu_liger.nn.KLDivLoss(1e-10, reduction="batchmean", log_target=True)
    assert isinstance(loss, torch.nn.KLDivLoss) and "eps=1e-10" in repr(loss)
    x, t = make(7, 45, log=True), make(7, 45, log=True)
    assert_close(loss(x, t), F.kl_div(x.double(), t.double(), reduction="batchmean", log_target=True))
    default = npu_liger.nn.KLDivLoss()
    assert default.reduction == torch.nn.KLDivLoss().reduction and default.eps == 1e-10
    assert_close(default(x, t.exp()), F.kl_div(x.double(), t.exp().double()))
    with pytest.raises(ValueError, match="eps must be > 0"):
        npu_liger.nn.KLDivLoss(eps=0.0)


def test_double_backward_raises_clear_error():
    x = make(3, 8, log=True).requires_grad_(True)
    (grad,) = torch.autograd.grad(npu_liger.kl_div(x, make(3, 8), "sum") * 2.0, x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad.sum().backward()


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (lambda: (randn((4, 6)), randn((4, 6))), {"reduction": "avg"}, ValueError, "reduction must be one of"),
        (lambda: (randn((24,)), randn((24,))), {}, ValueError, "y_pred must be 2-D"),
        (lambda: (randn((4, 6)), randn((4, 7))), {}, ValueError, "y_true must have the shape of y_pred"),
        (lambda: (randn((4, 6)), randn((4, 6)).double()), {}, TypeError, "y_true must be float32"),
        (lambda: (randn((4, 6)).double(), randn((4, 6))), {}, TypeError, "y_pred must be float32"),
        (lambda: (randn((4, 6)), torch.randn(4, 6, device="meta")), {}, RuntimeError, "y_true must be on the device"),
        (lambda: (randn((4, 6)), randn((4, 6))), {"eps": -1.0}, ValueError, "eps must be > 0"),
        (lambda: (randn((4, 6)), randn((4, 6))), {"log_target": 1}, TypeError, "log_target must be a bool"),
    ],
)
def test_bad_input_raises_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        npu_liger.kl_div(*args(), **kwargs)


def test_bad_backward_input_raises_clear_errors():
    x, t = randn((4, 6)), randn((4, 6))
    with pytest.raises(ValueError, match="grad_out must be a 0-d tensor"):
        kl_div_backward_op(randn((4, 6)), x, t, "sum", False, 1e-10, True, False)
    with pytest.raises(ValueError, match="grad_out must have the shape of y_pred"):
        kl_div_backward_op(randn(()), x, t, "none", False, 1e-10, True, False)
    with pytest.raises(TypeError, match="grad_out must have the dtype of the loss"):
        kl_div_backward_op(randn((), torch.float16), x, t, "mean", False, 1e-10, True, False)
