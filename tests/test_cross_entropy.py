"""cross_entropy: loss and gradient against float64 F.cross_entropy (label smoothing, softcap, z-loss, ignored
rows, every reduction), vocabulary tiling loops, opcheck, compile without recompiles, no mutation, the eager
in-place backward, empty and bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._cross_entropy_rows as ce_rows
import npu_liger.npu_ops._loss as loss_family
import npu_liger.npu_ops.cross_entropy as ce_kernels
from npu_liger.npu_ops._triton import COMPUTE_DTYPE_SIZE
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_fp32_close, assert_compiles_without_recompiles,
                       assert_no_alias, assert_unchanged, compile_dynamic, no_recompile_after_first, randn,
                       rel_error, run_opcheck, snapshot)

ce_op = torch.ops.npu_liger.cross_entropy.default
ce_with_grad_op = torch.ops.npu_liger.cross_entropy_with_grad.default
ce_with_stats_op = torch.ops.npu_liger.cross_entropy_with_stats.default

REDUCTIONS = ("none", "sum", "mean")
ROW_SIZES = st.sampled_from([1, 2, 3, 7, 41, 64])
# around the emulated NPU block (4096): one tile, several, and one element past a tile
VOCAB_SIZES = st.sampled_from([1, 2, 7, 127, 1000, 4095, 4097, 8193])
LAYOUTS = ("contiguous", "strided", "transposed")


def reference(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
              lse_square_scale=0.0, use_token_scaling=False):
    """F.cross_entropy (class weights, label smoothing) on softcapped logits plus the z-loss weighted like its
    row, each row times its target's detached probability with token scaling, reduced over valid rows: ``mean``
    divides by their summed class weights, as torch's weighted mean (in logits' dtype)."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target)).long()
    w = weight.to(z.dtype) if weight is not None else None
    rows = F.cross_entropy(z, safe, weight=w, reduction="none", label_smoothing=label_smoothing)
    w_target = w[safe] if w is not None else torch.ones_like(rows)
    if lse_square_scale:
        rows = rows + lse_square_scale * torch.logsumexp(z, dim=-1) ** 2 * w_target
    if use_token_scaling:
        rows = rows * z.detach().softmax(-1).gather(1, safe[:, None])[:, 0]
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    total_weight = torch.where(valid, w_target, torch.zeros_like(w_target)).sum()
    return rows.sum() / (total_weight if valid.any() else 1)


def make_logits(n_rows, n_cols, dtype=torch.float32, layout="contiguous", scale=3.0):
    if layout == "transposed":
        return randn((n_cols, n_rows), dtype, scale=scale).t()
    return randn((n_rows, n_cols), dtype, noncontiguous=layout == "strided", scale=scale)


def make_target(n_rows, n_cols, mode="some", ignore_index=-100, dtype=torch.int64):
    """(BT,) targets (a strided view) with "some", "all" or "no" rows at ignore_index."""
    target = torch.randint(0, n_cols, (2 * n_rows,), device=DEVICE).to(dtype)[::2]
    if mode == "some":
        target[torch.rand(n_rows, device=DEVICE) < 0.3] = ignore_index
    elif mode == "all":
        target.fill_(ignore_index)
    return target


# fp32: compiled Triton on a GPU takes exp and log from the approximate hardware instructions (~2**-22), so a
# correct kernel's loss row and gradient element carry an absolute error of ~1e-7 times the size of the terms
# they are differences of (a row's logsumexp; probabilities <= 1). Where those terms cancel in float64 -- a
# one-word vocabulary leaves only the z-loss of a small logit -- that absolute error dominates the relative
# one (seen on the H200 in fused_linear_cross_entropy: 1.2e-5 to 4e-3 relative). The fp32 checks add
# 2**-20 x the size of the terms to FP32_RTOL x the reference; in ordinary cases that floor is ~10x below it.
APPROXIMATE_MATH_FLOOR = 2.0**-20


def loss_floor(logits64, target, ignore_index, reduction, softcap):
    """APPROXIMATE_MATH_FLOOR x the size of the loss's terms: 1 + |logsumexp| per valid row, reduced."""
    valid = (target != ignore_index).double()
    z = logits64 if softcap is None else softcap * torch.tanh(logits64 / softcap)
    rows = (1.0 + z.detach().logsumexp(-1).abs()) * valid
    size = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / valid.sum().clamp_min(1.0)}[reduction]
    return APPROXIMATE_MATH_FLOOR * size.norm().item()


def logit_grad_sizes(logits64, target, grad_out, ignore_index, reduction):
    """Per row, the size of each dloss/dlogit's terms (probabilities and targets <= 1) times the incoming
    gradient and the mean's 1/n."""
    valid = (target != ignore_index).double()
    scale = valid.sum().clamp_min(1.0) if reduction == "mean" else 1.0
    return grad_out.detach().double().abs() * valid / scale


def make_class_weight(n_cols, dtype=torch.float32):
    """Class weights in [0.5, 1.5) (a strided view, as a column of a matrix would be)."""
    return (torch.rand(n_cols, 2, device=DEVICE) + 0.5).to(dtype)[:, 0]


def check(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
          lse_square_scale=0.0, fn=None, weight=None, use_token_scaling=False):
    """Loss and grad against float64 (half precision against eager half precision) for an incoming gradient of
    1, inputs untouched; then a random incoming gradient scales that gradient exactly (the forward keeps the
    gradient for 1 in logits' dtype, the backward multiplies: the one rounding more that Liger's also has)."""
    fn = fn or npu_liger.cross_entropy
    options = (ignore_index, reduction, label_smoothing, softcap, lse_square_scale, use_token_scaling)
    leaf = logits.detach().requires_grad_(True)
    before = snapshot((leaf, target, weight))
    loss = fn(leaf, target, weight, *options)
    loss.backward(torch.ones_like(loss))
    assert_unchanged(before, (leaf, target, weight), ("logits", "target", "weight"))
    assert_no_alias((loss, leaf.grad), (leaf, target))
    assert loss.dtype == logits.dtype and leaf.grad.dtype == logits.dtype and leaf.grad.shape == logits.shape

    logits64 = logits.detach().double().requires_grad_(True)
    weight64 = None if weight is None else weight.double()
    ref = reference(logits64, target, weight64, *options)
    ref.backward(torch.ones_like(ref))
    logits_lp = logits.detach().clone().requires_grad_(True)
    ref_lp = reference(logits_lp, target, weight, *options)
    ref_lp.backward(torch.ones_like(ref_lp))
    weight_size = 1.0 if weight is None else weight.abs().max().item()  # the class weights scale every term
    if logits.dtype == torch.float32:
        assert_fp32_close(loss, ref, weight_size * loss_floor(logits64, target, ignore_index, reduction, softcap),
                          f"loss ({reduction})")
        grad_sizes = logit_grad_sizes(logits64, target, torch.ones_like(ref), ignore_index, reduction)
        grad_floor = APPROXIMATE_MATH_FLOOR * weight_size * (grad_sizes * logits.shape[-1] ** 0.5).norm().item()
        assert_fp32_close(leaf.grad, logits64.grad, grad_floor, "grad_logits")
    else:
        assert_close(loss, ref, ref_lp, what=f"loss ({reduction})")
        assert_close(leaf.grad, logits64.grad, logits_lp.grad, what="grad_logits")
    assert (leaf.grad[target == ignore_index] == 0).all()

    scaled_leaf = logits.detach().requires_grad_(True)
    grad_out = randn(loss.shape, loss.dtype)
    fn(scaled_leaf, target, weight, *options).backward(grad_out)
    factor = grad_out.unsqueeze(-1) if reduction == "none" else grad_out
    assert_scaled(scaled_leaf.grad, leaf.grad, factor)
    return loss


def assert_scaled(got, unit, factor):
    """``got == unit * factor`` rounded once to unit's dtype: exactly in fp32. In half precision one unit in the
    last place: a path that scales the fp32 gradient before its one rounding differs from scaling the rounded
    gradient by up to an ulp (an absolute 2^-24 among fp16 subnormals, seen on the H200)."""
    expected = unit.mul(factor).to(unit.dtype)
    if unit.dtype == torch.float32:
        assert torch.equal(got, expected), "the gradient is not the unit gradient scaled"
    else:
        ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[unit.dtype]
        subnormal_ulp = {torch.bfloat16: 0.0, torch.float16: 2.0**-24}[unit.dtype]
        torch.testing.assert_close(got.float(), expected.float(), rtol=ulp, atol=subnormal_ulp)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n_rows=ROW_SIZES, n_cols=VOCAB_SIZES, dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(LAYOUTS),
       mode=st.sampled_from(["some", "all", "no"]), target_dtype=st.sampled_from([torch.int32, torch.int64]),
       ignore_index=st.sampled_from([-100, 0]), label_smoothing=st.sampled_from([0.0, 0.1]),
       softcap=st.sampled_from([None, 4.0]), lse_square_scale=st.sampled_from([0.0, 1e-3]),
       class_weights=st.booleans(), use_token_scaling=st.booleans())
def test_matches_float64_reference(reduction, n_rows, n_cols, dtype, layout, mode, target_dtype, ignore_index,
                                   label_smoothing, softcap, lse_square_scale, class_weights, use_token_scaling):
    assume(n_rows * n_cols <= 60_000)
    logits = make_logits(n_rows, n_cols, dtype, layout)
    target = make_target(n_rows, n_cols, mode, ignore_index, target_dtype)
    weight = make_class_weight(n_cols) if class_weights else None
    check(logits, target, ignore_index, reduction, label_smoothing, softcap, lse_square_scale, weight=weight,
          use_token_scaling=use_token_scaling)


@pytest.mark.parametrize("n_cols", [2, 7])
def test_confident_rows_keep_fp32_accuracy(n_cols):
    """Rows whose target holds the maximum logit have small losses next to their log-sum-exp: the loss must not
    inherit lse's rounding (it did, at 3-7x eager's error, and failed the float64 check now and then)."""
    logits = make_logits(64, n_cols, scale=8.0)
    target = logits.argmax(1)
    for reduction in ("none", "sum"):
        got = npu_liger.cross_entropy(logits, target, reduction=reduction)
        ref = torch.nn.functional.cross_entropy(logits.double(), target, reduction=reduction)
        eager = torch.nn.functional.cross_entropy(logits, target, reduction=reduction)
        err, eager_err = rel_error(got, ref), rel_error(eager, ref)
        assert err <= max(4.0 * eager_err, 1e-6), (reduction, err, eager_err)


def test_vocab_tiling_loops_and_persistent_grid(small_ub):
    """A 4 KiB UB gives 128-wide vocabulary tiles, so a 520-wide row takes 5 tiles per pass, and 85 rows over 40
    programs take up to 3 row iterations per program; large logits check the online log-sum-exp rescaling."""
    small_ub(4096)
    n_rows, n_cols = 85, 520
    plan = npu_liger.tiling.plan_launch("cpu", npu_liger.tiling.TileRequest(
        ce_rows.MEMORY_MULTIPLIER, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE))
    assert plan.block == 128 and plan.block * 4 < n_cols and plan.grid(n_rows) == 40 < n_rows
    logits = make_logits(n_rows, n_cols, scale=30.0)
    logits[:, 400:] += 50.0  # the row maximum sits in a late tile: earlier partial sums must be rescaled
    for reduction in REDUCTIONS:
        check(logits, make_target(n_rows, n_cols), reduction=reduction, label_smoothing=0.1, softcap=30.0,
              lse_square_scale=1e-4)
        check(logits, make_target(n_rows, n_cols), reduction=reduction, label_smoothing=0.1,
              weight=make_class_weight(n_cols), use_token_scaling=True)
    check(make_logits(50, 333, torch.bfloat16, "transposed"), make_target(50, 333))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored_gives_zero_and_zero_grads(reduction):
    logits = make_logits(5, 33).requires_grad_(True)
    loss = npu_liger.cross_entropy(logits, make_target(5, 33, "all"), reduction=reduction, label_smoothing=0.2)
    assert (loss == 0).all() and not torch.isnan(loss).any()
    loss.backward(torch.ones_like(loss))
    assert (logits.grad == 0).all()


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_inputs(shape):
    for reduction in REDUCTIONS:
        logits = randn(shape, requires_grad=True)
        target = torch.full((shape[0],), -100, dtype=torch.int64, device=DEVICE)
        loss = npu_liger.cross_entropy(logits, target, reduction=reduction)
        assert loss.shape == ((shape[0],) if reduction == "none" else ())
        assert (loss == 0).all()
        loss.backward(torch.ones_like(loss))
        assert logits.grad.shape == shape


@pytest.mark.parametrize("bad", [-1, 33, 10_000])
def test_out_of_range_target_is_an_error(bad):
    if DEVICE != "cpu":
        pytest.skip("on CUDA a bad target is a device-side assert, which ends the process's CUDA context")
    target = make_target(4, 33, "no")
    target[2] = bad
    with pytest.raises(ValueError, match=f"target {bad} is out of range for 33 classes"):
        npu_liger.cross_entropy(make_logits(4, 33), target)
    with pytest.raises(ValueError, match="out of range"):
        ce_op(make_logits(4, 33), target)


def test_out_of_range_target_poisons_the_loss_without_reading_outside_the_row(monkeypatch):
    """The kernel itself (the host check switched off): NaN loss for that row, other rows unchanged."""
    monkeypatch.setattr(loss_family, "report_bad_targets", lambda *args: None)
    logits = make_logits(3, 17)
    target = make_target(3, 17, "no")
    good = ce_kernels.cross_entropy_forward(logits, target, reduction="none")[0]
    target[1] = 1 << 40 if DEVICE == "cpu" else 17
    bad = ce_kernels.cross_entropy_forward(logits, target, reduction="none")[0]
    assert torch.isnan(bad[1]) and torch.equal(bad[[0, 2]], good[[0, 2]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    logits = make_logits(5, 37, dtype).requires_grad_(True)
    target = make_target(5, 37)
    for reduction in REDUCTIONS:
        run_opcheck(ce_op, (logits, target, None, -100, reduction, 0.1, 5.0, 1e-3))
        run_opcheck(ce_op, (logits, target, make_class_weight(37, dtype), -100, reduction, 0.1, None, 1e-3, True))
        run_opcheck(ce_with_stats_op, (logits, target, make_class_weight(37), -100, reduction, 0.1))
        for compute_grad in (False, True):
            for stats in (False, True):
                run_opcheck(ce_with_grad_op, (logits.detach(), target, None, -100, reduction, 0.0, None, 0.0, False,
                                              compute_grad, stats))
    run_opcheck(ce_op, (logits, target))
    run_opcheck(ce_op, (make_logits(3, 6, dtype, "strided"), make_target(3, 6, ignore_index=3), None, 3, "sum"))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_fullgraph_dynamic_without_recompiles_matches_eager(reduction):
    def fn(logits, target):
        return npu_liger.cross_entropy(logits * 1.5, target, None, -100, reduction, 0.1).sum()

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for i, n in enumerate([5, 8, 33]):
        logits = make_logits(n, 2 * n + 1).requires_grad_(True)
        target = make_target(n, 2 * n + 1)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            loss = compiled(logits, target)
            loss.backward()
        eager_logits = logits.detach().clone().requires_grad_(True)
        eager = fn(eager_logits, target)
        eager.backward()
        # the graph's own .sum() may add in another order than eager's; the op's numbers are the same
        assert_close(loss, eager.double())
        assert torch.equal(logits.grad, eager_logits.grad)
        ref_logits = logits.detach().double().requires_grad_(True)
        reference(ref_logits * 1.5, target, None, -100, reduction, 0.1).sum().backward()
        assert_close(logits.grad, ref_logits.grad)


def test_compile_helper_inference():
    assert_compiles_without_recompiles(
        lambda logits, target: npu_liger.cross_entropy(logits, target, reduction="sum") + 1.0,
        lambda n: (make_logits(n, 3 * n), make_target(n, 3 * n)),
        [4, 9, 17],
        lambda inputs, got, eager: assert_close(got, reference(inputs[0].double(), inputs[1], reduction="sum") + 1.0),
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_eager_path_matches_the_dispatched_op(reduction):
    logits = make_logits(6, 41).requires_grad_(True)
    target = make_target(6, 41)
    fast = npu_liger.cross_entropy(logits, target, None, -100, reduction, 0.1, 3.0, 1e-3)
    assert "CrossEntropyEager" in type(fast.grad_fn).__name__
    fast.backward(torch.full_like(fast, 3.0))
    fast_grad, logits.grad = logits.grad, None
    slow = ce_op(logits, target, None, -100, reduction, 0.1, 3.0, 1e-3)
    slow.backward(torch.full_like(slow, 3.0))
    assert torch.equal(fast, slow) and torch.equal(fast_grad, logits.grad)
    with torch.no_grad():
        assert npu_liger.cross_entropy(logits, target).grad_fn is None


def test_second_backward_and_double_backward_raise_clear_errors():
    logits = make_logits(3, 8).requires_grad_(True)
    target = make_target(3, 8, "no")
    loss = npu_liger.cross_entropy(logits, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time"):
        loss.backward()
    loss = ce_op(logits, target)  # the op's formula keeps its gradient: retain_graph works there
    loss.backward(retain_graph=True)
    loss.backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        (grad,) = torch.autograd.grad(npu_liger.cross_entropy(logits, target), logits, create_graph=True)
    scale = torch.tensor(2.0, device=DEVICE, requires_grad=True)  # the op's formula: a differentiable grad_loss
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(ce_op(logits, target) * scale, logits, create_graph=True)


def test_module_matches_functional():
    loss_fn = npu_liger.nn.CrossEntropyLoss(ignore_index=3, reduction="sum", label_smoothing=0.1, softcap=5.0)
    assert "softcap=5.0" in repr(loss_fn)
    logits, target = make_logits(7, 45), make_target(7, 45, ignore_index=3)
    assert_close(loss_fn(logits, target), reference(logits.double(), target, None, 3, "sum", 0.1, 5.0))
    with pytest.raises(ValueError, match="reduction must be one of"):
        npu_liger.nn.CrossEntropyLoss(reduction="batchmean")


def test_module_takes_ligers_constructor_arguments():
    """``LigerCrossEntropyLoss(weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap,
    return_z_loss, return_token_accuracy, return_predicted_tokens)``, positionally, in Liger's order."""
    weight = make_class_weight(45)
    loss_fn = npu_liger.nn.CrossEntropyLoss(weight, 3, 1e-3, 0.1, "sum", 5.0, True, True, True)
    logits, target = make_logits(7, 45), make_target(7, 45, ignore_index=3)
    out = loss_fn(logits, target)
    want = npu_liger.cross_entropy(logits, target, weight, 3, "sum", 0.1, 5.0, 1e-3, return_z_loss=True,
                                   return_token_accuracy=True, return_predicted_tokens=True)
    for got, expected in zip(out, want):
        torch.testing.assert_close(got, expected)
    assert loss_fn.weight is weight


# ---- class weights, statistics, token scaling --------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_class_weights_are_torchs(reduction, label_smoothing):
    """Against ``F.cross_entropy(weight=...)`` itself (not our reference): a weighted mean over valid rows."""
    logits, target, weight = make_logits(9, 31), make_target(9, 31), make_class_weight(31)
    leaf, leaf64 = logits.clone().requires_grad_(True), logits.double().requires_grad_(True)
    loss = npu_liger.cross_entropy(leaf, target, weight, reduction=reduction, label_smoothing=label_smoothing)
    ref = F.cross_entropy(leaf64, target, weight.double(), reduction=reduction, label_smoothing=label_smoothing)
    grad_out = randn(ref.shape)
    loss.backward(grad_out)
    ref.backward(grad_out.double())
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(leaf.grad.double(), leaf64.grad, rtol=1e-5, atol=1e-6)


def test_weightless_valid_rows_give_torchs_nan():
    """Valid rows whose classes all weigh 0: ``mean`` is 0 / 0 in torch, and here."""
    logits, target = make_logits(4, 6), torch.tensor([1, 2, 1, -100], device=DEVICE)
    weight = torch.ones(6, device=DEVICE)
    weight[[1, 2]] = 0.0
    assert torch.isnan(npu_liger.cross_entropy(logits, target, weight))
    assert torch.isnan(F.cross_entropy(logits, target, weight))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_statistics(reduction, dtype):
    """z_loss: the z-loss term as it enters the loss (reduced like it); token_accuracy: argmax == target over
    valid rows (per row for none); predicted_tokens: the argmax, -1 on ignored rows. The loss is unchanged."""
    n_rows, n_cols = 11, 600
    logits, target, weight = make_logits(n_rows, n_cols, dtype), make_target(n_rows, n_cols), make_class_weight(n_cols)
    target[0] = logits[0].float().argmax()  # one row certainly right
    options = dict(ignore_index=-100, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-2)
    out = npu_liger.cross_entropy(logits, target, weight, **options, return_z_loss=True, return_token_accuracy=True,
                                  return_predicted_tokens=True)
    assert isinstance(out, npu_liger.CrossEntropyOutput)
    torch.testing.assert_close(out.loss, npu_liger.cross_entropy(logits, target, weight, **options))
    valid = target != -100
    predicted = torch.where(valid, logits.float().argmax(-1), -1)
    assert torch.equal(out.predicted_tokens, predicted)
    correct = ((predicted == target) & valid).float()
    torch.testing.assert_close(out.token_accuracy, correct if reduction == "none"
                               else correct.sum() / valid.sum().clamp_min(1))
    z_only = reference(logits.double(), target, weight.double(), **options) - reference(
        logits.double(), target, weight.double(), **dict(options, lse_square_scale=0.0))
    assert out.z_loss.dtype == dtype
    assert_close(out.z_loss, z_only, z_only.to(dtype), what="z_loss")
    only_accuracy = npu_liger.cross_entropy(logits, target, return_token_accuracy=True)
    assert only_accuracy.z_loss is None and only_accuracy.predicted_tokens is None


def test_statistics_compile_without_recompiles_and_train():
    def step(logits, target, weight):
        out = npu_liger.cross_entropy(logits * 2.0, target, weight, label_smoothing=0.1, use_token_scaling=True,
                                      return_token_accuracy=True, return_z_loss=True, lse_square_scale=1e-3)
        return out.loss + out.z_loss, out.token_accuracy

    compiled = compile_dynamic(step)
    for i, n_rows in enumerate((5, 9, 13)):
        logits = make_logits(n_rows, 37).requires_grad_(True)
        target, weight = make_target(n_rows, 37), make_class_weight(37)
        with no_recompile_after_first(i):
            loss, accuracy = compiled(logits, target, weight)
        loss.backward()
        eager_logits = logits.detach().requires_grad_(True)
        eager_loss, eager_accuracy = step(eager_logits, target, weight)
        eager_loss.backward()
        torch.testing.assert_close(loss, eager_loss)
        torch.testing.assert_close(accuracy, eager_accuracy)
        torch.testing.assert_close(logits.grad, eager_logits.grad)


def _l():
    return make_logits(4, 6)


def _t(n=4, dtype=torch.int64):
    return torch.zeros(n, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (lambda: (_l(), _t()), {"reduction": "batchmean"}, ValueError, "reduction must be one of"),
        (lambda: (randn((24,)), _t(24)), {}, ValueError, "logits must be 2-D"),
        (lambda: (_l().double(), _t()), {}, TypeError, "logits must be float32, float16 or bfloat16"),
        (lambda: (_l(), torch.zeros(4, device=DEVICE)), {}, TypeError, "target must be int32 or int64"),
        (lambda: (_l(), _t(5)), {}, ValueError, r"target must have shape \(BT,\) = \(4,\)"),
        (lambda: (_l(), torch.zeros(4, dtype=torch.int64, device="meta")), {}, RuntimeError,
         "target must be on the device of logits"),
        (lambda: (_l(), _t()), {"label_smoothing": 1.5}, ValueError, "label_smoothing must be in"),
        (lambda: (_l(), _t()), {"softcap": 0.0}, ValueError, "softcap must be None or > 0"),
        (lambda: (_l(), _t()), {"lse_square_scale": -1.0}, ValueError, "lse_square_scale must be >= 0"),
        (lambda: (_l(), _t()), {"weight": torch.ones(5, device=DEVICE)}, ValueError,
         r"weight \(class weights\) must have shape \(V,\) = \(6,\)"),
        (lambda: (_l(), _t()), {"weight": torch.ones(6, dtype=torch.int64, device=DEVICE)}, TypeError,
         "weight must be float32"),
    ],
)
def test_bad_input_raises_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        npu_liger.cross_entropy(*args(), **kwargs)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    logits = make_logits(64, 1000).requires_grad_(True)
    target = make_target(64, 1000)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for reduction in REDUCTIONS:
            loss = npu_liger.cross_entropy(logits, target, reduction=reduction)
            loss.backward(torch.ones_like(loss))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(DEVICE == "cpu", reason="a race between a GPU program's threads; the interpreter runs in order")
def test_target_column_gradient_at_training_size():
    """Many rows and a wide vocabulary, as in training: the target column's gradient ((p - 1) / n_valid) is
    written after the row's block stores and must not be overwritten by them (it was, on the H200, without a
    barrier: ~10% error in the gradient)."""
    logits = randn((4096, 32000), torch.bfloat16, scale=2.0).requires_grad_(True)
    target = torch.randint(0, 32000, (4096,), device=DEVICE)
    target[::7] = -100
    (grad,) = torch.autograd.grad(npu_liger.cross_entropy(logits, target), logits)
    logits32 = logits.detach().float().requires_grad_(True)
    (ref,) = torch.autograd.grad(F.cross_entropy(logits32, target), logits32)
    rows = (target != -100).nonzero().squeeze(1)
    assert rel_error(grad[rows, target[rows]], ref[rows, target[rows]]) < 2**-7
    assert rel_error(grad, ref) < 2**-7


# ---- non-finite logits: what torch gives ----------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["cross_entropy", "fused_linear_cross_entropy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_non_finite_logits_give_what_torch_gives(fn, bad, softcap):
    """A NaN logit gives a NaN loss and NaN gradients for its row (not a finite loss: a diverged run must look
    diverged); +inf gives torch's NaN, -inf in a non-target column is exp(-inf) = 0. FLCE: the bad value sits in
    lm_head's weight, so every row's logits carry it, as in a model whose lm_head diverged."""
    logits = randn((3, 6))
    target = torch.tensor([1, 4, 2], device=DEVICE)
    if fn == "cross_entropy":
        logits[0, 3] = bad
        args, ref_args = (logits,), (logits.clone(),)
        ours_fn = lambda t: npu_liger.cross_entropy(t[0], target, softcap=softcap)  # noqa: E731
        ref_fn = lambda t: reference(t[0], target, softcap=softcap)  # noqa: E731
    else:
        x, weight = randn((3, 4)), randn((6, 4))
        weight[3, 1] = bad
        args, ref_args = (x, weight), (x.clone(), weight.clone())
        ours_fn = lambda t: npu_liger.fused_linear_cross_entropy(t[0], t[1], target, softcap=softcap)  # noqa: E731
        ref_fn = lambda t: reference(torch.nn.functional.linear(t[0], t[1]), target, softcap=softcap)  # noqa: E731
    leaves = [a.detach().requires_grad_(True) for a in args]
    ref_leaves = [a.detach().requires_grad_(True) for a in ref_args]
    loss, ref_loss = ours_fn(leaves), ref_fn(ref_leaves)
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.to(loss.dtype), rtol=1e-5, atol=1e-6, equal_nan=True)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_infinite_softcap_is_no_softcap():
    logits, target = randn((4, 9)), make_target(4, 9)
    torch.testing.assert_close(npu_liger.cross_entropy(logits, target, softcap=float("inf")),
                               npu_liger.cross_entropy(logits, target))
