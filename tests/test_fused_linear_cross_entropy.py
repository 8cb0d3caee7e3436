"""fused_linear_cross_entropy: loss and grads (x, weight, bias) against float64 ``cross_entropy(x @ W.T + b)``
with chunks shrunk so every loop turns, gradient accumulation with reduction="sum" and a divisor (HF's
num_items_in_batch), compile without recompiles (identical to eager with ignore_index present), chunked memory,
opcheck, no mutation, bad input."""

import contextlib
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.fused_linear_cross_entropy as flce_kernels
from checklist import (DEVICE, FLOAT_DTYPES, UNIT_ROUNDOFF, assert_close, assert_no_alias, assert_rounded_grad_close,
                       assert_unchanged, chunked_rounding_size, randn, rel_error, rounded_logit_grads_sizes,
                       run_opcheck, snapshot)
from test_cross_entropy import (APPROXIMATE_MATH_FLOOR, assert_fp32_close, assert_scaled, logit_grad_sizes,
                                loss_floor, make_class_weight, make_target, reference as ce_reference)

flce_op = torch.ops.npu_liger.fused_linear_cross_entropy.default
with_grad_op = torch.ops.npu_liger.fused_linear_cross_entropy_with_grad.default
backward_op = torch.ops.npu_liger.fused_linear_cross_entropy_backward.default
flce_with_stats_op = torch.ops.npu_liger.fused_linear_cross_entropy_with_stats.default
REDUCTIONS = ("none", "sum", "mean")


@contextlib.contextmanager
def chunks_of(rows):
    """Every call runs chunks of ``rows`` rows (the production size comes from memory: see chunk_rows)."""
    with mock.patch.object(flce_kernels, "chunk_rows", lambda n_rows, hidden, vocab: rows):
        yield


def reference(x, weight, target, bias=None, ce_weight=None, *options):
    """The unfused computation the way HF runs it: logits in x's dtype, the loss from fp32 logits."""
    logits = torch.nn.functional.linear(x, weight, bias)
    if logits.dtype != torch.float64:
        logits = logits.float()
    return ce_reference(logits, target, None if ce_weight is None else ce_weight.to(logits.dtype), *options)


def make_inputs(n_rows, hidden, vocab, dtype=torch.float32, bias=True, strided=False):
    x = randn((n_rows, hidden), dtype, noncontiguous=strided)
    weight = randn((vocab, hidden), dtype, scale=hidden ** -0.5 * 2.0)
    b = randn((vocab,), dtype) if bias else None
    return x, weight, b


def _leaves(x, weight, bias):
    return tuple(None if t is None else t.detach().clone().requires_grad_(True) for t in (x, weight, bias))


def _grads(leaves):
    return [None if t is None else t.grad for t in leaves]


def fp32_floors(x, weight, bias, target, grad_out, ignore_index, reduction, softcap):
    """{"loss", "x", "weight", "bias"} -> the absolute error allowed beyond FP32_RTOL (see test_cross_entropy's
    APPROXIMATE_MATH_FLOOR): the loss's from its rows' logsumexp; the gradients' with every dloss/dlogit taken
    as 1 (times the incoming gradient and the mean's 1/n), pushed through |x|, |weight| (d/dx: sum_v |w_v|...)."""
    logits = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
    row_weights = logit_grad_sizes(logits, target, grad_out, ignore_index, reduction)
    leaves = [None if t is None else t.detach().double().abs().requires_grad_(True) for t in (x, weight, bias)]
    (row_weights[:, None] * torch.nn.functional.linear(*leaves)).sum().backward()
    floors = {name: APPROXIMATE_MATH_FLOOR * t.grad.norm().item()
              for name, t in zip(("x", "weight", "bias"), leaves) if t is not None}
    return dict(floors, loss=loss_floor(logits, target, ignore_index, reduction, softcap))


def assert_loss_close(loss, ref64, ref_lp, dtype, what, floor):
    """The fp32 loss of half-precision inputs comes from half-precision logits (as HF's does): judged like a
    half-precision output, against the unfused half-precision run's own error. fp32: see fp32_floors."""
    if dtype == torch.float32:
        return assert_fp32_close(loss, ref64, floor, what)
    err, tol = rel_error(loss, ref64), max(2.0 * rel_error(ref_lp, ref64), UNIT_ROUNDOFF[dtype])
    assert err <= tol, f"{what} ({dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


def logit_grads64(x, weight, bias, target, grad_out, options) -> torch.Tensor:
    """dloss/dlogits in float64."""
    logits = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
    logits = logits.detach().requires_grad_(True)
    ce_weight, *rest = options
    ce_reference(logits, target, None if ce_weight is None else ce_weight.double(), *rest).backward(
        grad_out.double())
    return logits.grad


def check(x, weight, target, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
          lse_square_scale=0.0, fn=None, chunk_rows=None, ce_weight=None, use_token_scaling=False):
    """Loss and every grad against float64 (half precision: against the unfused half-precision run) for an
    incoming gradient of 1, then with a random one (sum/mean: the unit gradients scaled exactly; none: the
    recomputing backward against float64)."""
    fn = fn or npu_liger.fused_linear_cross_entropy
    options = (ce_weight, ignore_index, reduction, label_smoothing, softcap, lse_square_scale, use_token_scaling)
    names = ("x", "weight", "bias")
    inputs = (x, weight, target, bias)
    before = snapshot(inputs)
    grad_outs = {}
    for which in ("ones", "random"):
        leaves = _leaves(x, weight, bias)
        loss = fn(leaves[0], leaves[1], target, leaves[2], *options)
        grad_out = torch.ones_like(loss) if which == "ones" else randn(loss.shape, torch.float32)
        grad_outs[which] = grad_out
        loss.backward(grad_out)
        assert_unchanged(before, (*leaves[:2], target, leaves[2]), ("x", "weight", "target", "bias"))
        assert loss.dtype == torch.float32
        assert_no_alias((loss, *_grads(leaves)), (*leaves, target))

        ref_leaves = tuple(None if t is None else t.detach().double().requires_grad_(True) for t in (x, weight, bias))
        ref = reference(ref_leaves[0], ref_leaves[1], target, ref_leaves[2], *options)
        ref.backward(grad_out.double())
        floors = fp32_floors(x, weight, bias, target, grad_out, ignore_index, reduction, softcap)
        lp_leaves = _leaves(x, weight, bias)
        ref_lp = reference(lp_leaves[0], lp_leaves[1], target, lp_leaves[2], *options)
        ref_lp.backward(grad_out)
        if which == "ones":
            unit_loss, unit_grads = loss, _grads(leaves)
            assert_loss_close(loss, ref, ref_lp, x.dtype, f"loss ({reduction})", floors["loss"])
        elif reduction != "none":
            assert torch.equal(loss, unit_loss)
            for got, unit in zip(_grads(leaves), unit_grads):
                if got is not None:
                    assert_scaled(got, unit, grad_out)
            continue
        grad_logits64 = logit_grads64(x, weight, bias, target, grad_out, options)
        rounding_sizes = dict(rounded_logit_grads_sizes(grad_logits64, weight),
                              weight=chunked_rounding_size(grad_logits64, x, chunk_rows))
        for name, got, ref_leaf, lp_leaf in zip(names, _grads(leaves), ref_leaves, lp_leaves):
            if got is not None:
                assert got.dtype == x.dtype and got.shape == ref_leaf.shape
                what = f"grad_{name} ({reduction}, {which})"
                assert_rounded_grad_close(got, ref_leaf.grad, lp_leaf.grad, rounding_sizes[name], what,
                                          floors[name])
    return unit_loss


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n_rows=st.sampled_from([1, 3, 17, 50]), hidden=st.sampled_from([1, 8, 33]),
       vocab=st.sampled_from([1, 7, 130, 700]), dtype=st.sampled_from(FLOAT_DTYPES), bias=st.booleans(),
       strided=st.booleans(), mode=st.sampled_from(["some", "all", "no"]), rows=st.sampled_from([1, 4, 16]),
       label_smoothing=st.sampled_from([0.0, 0.1]), softcap=st.sampled_from([None, 5.0]),
       lse_square_scale=st.sampled_from([0.0, 1e-3]), class_weights=st.booleans(), use_token_scaling=st.booleans())
def test_matches_float64_reference(reduction, n_rows, hidden, vocab, dtype, bias, strided, mode, rows,
                                   label_smoothing, softcap, lse_square_scale, class_weights, use_token_scaling):
    x, weight, b = make_inputs(n_rows, hidden, vocab, dtype, bias, strided)
    target = make_target(n_rows, vocab, mode)
    ce_weight = make_class_weight(vocab) if class_weights else None
    with chunks_of(rows):
        check(x, weight, target, b, -100, reduction, label_smoothing, softcap, lse_square_scale,
              chunk_rows=rows, ce_weight=ce_weight, use_token_scaling=use_token_scaling)


def test_chunks_never_hold_more_rows_than_chunk_rows(monkeypatch, small_ub):
    """Every kernel launch sees one chunk's logits (the vocabulary loop turns too: 4 KiB UB, 128-wide tiles)."""
    small_ub(4096)
    seen = []
    launch = flce_kernels.launch_rows
    monkeypatch.setattr(flce_kernels, "launch_rows", lambda logits, *a: seen.append(tuple(logits.shape)) or
                        launch(logits, *a))
    x, weight, b = make_inputs(45, 16, 300)
    with chunks_of(8):
        check(x, weight, make_target(45, 300), b, reduction="sum")
    assert seen and all(shape[0] <= 8 for shape in seen) and sum(s[0] for s in seen) % 45 == 0


def test_chunk_rows_from_memory():
    # the benchmark shape: 1024 rows, where the weight-gradient matmul stops being memory-bound
    # (263 MB of bf16 logits, 1/16 of the fp32 logits, not 2.1 GB)
    assert flce_kernels.chunk_rows(8192, 4096, 128256) == 1024
    assert flce_kernels.chunk_rows(2048, 4096, 128256) == 512  # at most a quarter of the rows
    assert flce_kernels.chunk_rows(32768, 4096, 32000) == 4096  # logits of x's size when that is more
    assert flce_kernels.chunk_rows(10, 4096, 128256) == 10  # tiny calls: one chunk (never more than BT)
    assert flce_kernels.chunk_rows(1000, 4096, 128256) == 128  # MIN_CHUNK_ROWS .. a quarter, a power of two
    assert flce_kernels.chunk_rows(100_000, 64, 256_000) == flce_kernels.EFFICIENT_CHUNK_ROWS
    assert flce_kernels.chunk_rows(0, 8, 8) >= 1
    for n_rows in (1, 5, 100, 256, 4096, 10_000):  # a quarter of the rows at most, beyond tiny calls
        rows = flce_kernels.chunk_rows(n_rows, 4096, 128256)
        assert 1 <= rows <= max(n_rows // 4, min(n_rows, flce_kernels.MIN_CHUNK_ROWS))


def test_chunk_rows_override(monkeypatch):
    monkeypatch.setenv("NPU_LIGER_FLCE_CHUNK_ROWS", "256")
    assert flce_kernels.chunk_rows(8192, 4096, 128256) == 256  # Liger's chunk at this shape
    assert flce_kernels.chunk_rows(100, 4096, 128256) == 100
    x, weight, _ = make_inputs(45, 16, 300)
    monkeypatch.setenv("NPU_LIGER_FLCE_CHUNK_ROWS", "8")
    check(x, weight, make_target(45, 300), reduction="sum", chunk_rows=8)
    for bad in ("0", "-4", "many"):
        monkeypatch.setenv("NPU_LIGER_FLCE_CHUNK_ROWS", bad)
        with pytest.raises(ValueError, match="NPU_LIGER_FLCE_CHUNK_ROWS must be a positive integer"):
            flce_kernels.chunk_rows(8192, 4096, 128256)


def test_gradient_accumulation_with_sum_and_num_items_in_batch():
    """HF Trainer: each micro-batch's loss is sum / num_items_in_batch (valid tokens of the whole batch): the
    accumulated gradients equal the full batch's mean."""
    x, weight, _ = make_inputs(40, 16, 97)
    target = make_target(40, 97)
    num_items = (target != -100).sum()
    leaves, full = _leaves(x, weight, None), _leaves(x, weight, None)
    with chunks_of(8):
        total = 0.0
        for part in (slice(0, 15), slice(15, 40)):
            loss = npu_liger.fused_linear_cross_entropy(leaves[0][part], leaves[1], target[part],
                                                        reduction="sum") / num_items
            loss.backward()
            total = total + loss.detach()
        mean = npu_liger.fused_linear_cross_entropy(full[0], full[1], target)
        mean.backward()
    assert_close(total, mean.double())
    assert_close(leaves[0].grad, full[0].grad.double())
    assert_close(leaves[1].grad, full[1].grad.double())


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored_and_empty(reduction):
    x, weight, b = make_inputs(6, 8, 20)
    leaves = _leaves(x, weight, b)
    loss = npu_liger.fused_linear_cross_entropy(leaves[0], leaves[1], make_target(6, 20, "all"), leaves[2],
                                                reduction=reduction)
    assert (loss == 0).all()
    loss.backward(torch.ones_like(loss))
    assert all((g == 0).all() for g in _grads(leaves))
    leaves = _leaves(*make_inputs(0, 8, 20))
    loss = npu_liger.fused_linear_cross_entropy(leaves[0], leaves[1], make_target(0, 20), leaves[2],
                                                reduction=reduction)
    assert loss.shape == ((0,) if reduction == "none" else ()) and (loss == 0).all()
    loss.backward(torch.ones_like(loss))
    assert leaves[0].grad.shape == (0, 8) and (leaves[1].grad == 0).all() and (leaves[2].grad == 0).all()


def test_only_the_needed_gradients_are_computed():
    """A frozen lm_head (LoRA): no grad_weight matmul; no gradient at all without requires_grad."""
    x, weight, _ = make_inputs(9, 8, 30)
    target = make_target(9, 30)
    x.requires_grad_(True)
    calls = []
    with mock.patch.object(torch.Tensor, "addmm_", lambda *a, **k: calls.append("addmm_")):
        npu_liger.fused_linear_cross_entropy(x, weight, target).backward()
        with torch.no_grad():
            npu_liger.fused_linear_cross_entropy(x, weight, target)
    assert calls == [] and x.grad is not None and weight.grad is None
    loss, gx, gw, gb, *stats = with_grad_op(x.detach(), weight, target, None, None, -100, "mean", 0.0, None, 0.0,
                                            False, None, False, False, False, False)
    assert gx.shape == gw.shape == gb.shape == (0,) and all(t.shape == (0,) for t in stats)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_compiled_fullgraph_dynamic_without_recompiles_matches_eager(reduction):
    """Identical loss and gradients compiled and eager, with ignore_index present, across token counts."""
    def fn(x, weight, target, bias):
        loss = npu_liger.fused_linear_cross_entropy(x * 1.0, weight, target, bias, None, -100, reduction, 0.0, 30.0)
        return loss.sum() / 7.0  # a num_items_in_batch-style divisor

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    with chunks_of(4):
        for i, n in enumerate([5, 9, 21]):
            x, weight, b = make_inputs(n, 16, 53)
            target = make_target(n, 53)
            target[0] = -100
            c_leaves, e_leaves = _leaves(x, weight, b), _leaves(x, weight, b)
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                loss = compiled(c_leaves[0], c_leaves[1], target, c_leaves[2])
                loss.backward()
            eager = fn(e_leaves[0], e_leaves[1], target, e_leaves[2])
            eager.backward()
            if reduction == "none":  # the graph's own .sum() may add in another order than eager's
                assert_close(loss, eager.double())
            else:
                assert torch.equal(loss, eager)
            for got, want in zip(_grads(c_leaves), _grads(e_leaves)):
                assert torch.equal(got, want)
            ref_leaves = tuple(t.detach().double().requires_grad_(True) for t in (x, weight, b))
            ref = reference(*ref_leaves[:2], target, ref_leaves[2], None, -100, reduction, 0.0, 30.0)
            (ref.sum() / 7.0).backward()
            for got, ref_leaf in zip(_grads(c_leaves), ref_leaves):
                assert_close(got, ref_leaf.grad)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x, weight, b = make_inputs(6, 8, 19, dtype)
    target = make_target(6, 19)
    with chunks_of(4):
        for reduction in REDUCTIONS:
            run_opcheck(flce_op, (x.requires_grad_(True), weight.requires_grad_(True), target, b, None, -100,
                                  reduction, 0.1, 3.0, 1e-3))
            run_opcheck(flce_op, (x, weight, target, b, make_class_weight(19), -100, reduction, 0.1, None, 0.0, True,
                                  torch.float32))
            run_opcheck(flce_with_stats_op, (x, weight, target, b, None, -100, reduction, 0.0, None, 1e-3))
            run_opcheck(with_grad_op, (x.detach(), weight.detach(), target, b, None, -100, reduction, 0.0, None, 0.0,
                                       False, None, True, True, True, True))
        run_opcheck(backward_op, (randn((6,)), x.detach(), weight.detach(), target, b, None, -100, 0.0, None, 0.0,
                                  False, None, True, False, True))
        run_opcheck(flce_op, (x, weight, target))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_eager_path_matches_the_dispatched_op(reduction):
    x, weight, b = make_inputs(11, 8, 40)
    target = make_target(11, 40)
    fast, slow = _leaves(x, weight, b), _leaves(x, weight, b)
    with chunks_of(4):
        fast_loss = npu_liger.fused_linear_cross_entropy(fast[0], fast[1], target, fast[2], None, -100, reduction,
                                                         0.1)
        slow_loss = flce_op(slow[0], slow[1], target, slow[2], None, -100, reduction, 0.1)
        fast_loss.backward(torch.full_like(fast_loss, 3.0))
        slow_loss.backward(torch.full_like(slow_loss, 3.0))
    assert torch.equal(fast_loss, slow_loss)
    for got, want in zip(_grads(fast), _grads(slow)):
        assert torch.equal(got, want)


def test_second_and_double_backward_raise_clear_errors():
    x, weight, _ = make_inputs(4, 8, 10)
    leaves = _leaves(x, weight, None)
    loss = npu_liger.fused_linear_cross_entropy(leaves[0], leaves[1], make_target(4, 10))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time"):
        loss.backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(npu_liger.fused_linear_cross_entropy(leaves[0], leaves[1], make_target(4, 10)),
                            leaves[0], create_graph=True)


def test_module_matches_functional():
    loss_fn = npu_liger.nn.FusedLinearCrossEntropyLoss(reduction="sum", softcap=30.0)
    assert "softcap=30.0" in repr(loss_fn)
    x, weight, b = make_inputs(7, 8, 45)
    target = make_target(7, 45)
    assert_close(loss_fn(weight, x, target, b), reference(x.double(), weight.double(), target, b.double(), None,
                                                          -100, "sum", 0.0, 30.0))


def _x():
    return randn((4, 8))


def _w(vocab=10, hidden=8, dtype=torch.float32):
    return randn((vocab, hidden), dtype)


def _t(n=4):
    return torch.zeros(n, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (lambda: (randn((4, 8, 1)), _w(), _t()), ValueError, "x must be 2-D"),
        (lambda: (_x(), _w(hidden=9), _t()), ValueError, r"weight must have shape \(V, H\) with H = 8"),
        (lambda: (_x(), _w(dtype=torch.float16), _t()), TypeError, "weight must have the dtype of x"),
        (lambda: (_x(), _w(), _t(), randn((11,))), ValueError, r"bias must have shape \(V,\) = \(10,\)"),
        (lambda: (_x(), _w(), _t(), randn((10,), torch.bfloat16)), TypeError, "bias must have the dtype of x"),
        (lambda: (_x(), _w(), _t(5)), ValueError, r"target must have shape \(BT,\) = \(4,\) to match x"),
        (lambda: (_x(), _w(), torch.zeros(4, device=DEVICE)), TypeError, "target must be int32 or int64"),
        (lambda: (_x().double(), _w().double(), _t()), TypeError, "x must be float32, float16 or bfloat16"),
    ],
)
def test_bad_input_raises_clear_error(args, error, match):
    with pytest.raises(error, match=match):
        npu_liger.fused_linear_cross_entropy(*args())


def test_out_of_range_target_is_an_error():
    if DEVICE != "cpu":
        pytest.skip("on CUDA a bad target is a device-side assert, which ends the process's CUDA context")
    with pytest.raises(ValueError, match="target 10 is out of range for 10 classes"):
        npu_liger.fused_linear_cross_entropy(_x(), _w(), torch.tensor([0, 10, 1, 2], device=DEVICE))


@pytest.mark.skipif(DEVICE != "cuda", reason="measures CUDA memory")
def test_peak_memory_is_one_chunk_not_the_logits():
    n_rows, hidden, vocab = 4096, 1024, 32768
    x, weight, _ = make_inputs(n_rows, hidden, vocab, torch.bfloat16)
    x.requires_grad_(True)
    weight.requires_grad_(True)
    target = make_target(n_rows, vocab)
    npu_liger.fused_linear_cross_entropy(x, weight, target).backward()  # warm-up: cuBLAS workspaces
    x.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    npu_liger.fused_linear_cross_entropy(x, weight, target).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - x.grad.nbytes - weight.grad.nbytes
    chunk_bytes = flce_kernels.chunk_rows(n_rows, hidden, vocab) * vocab * 2
    fp32_logits = n_rows * vocab * 4
    assert extra <= 2 * chunk_bytes + 16 * 2**20 and extra <= 0.25 * fp32_logits, (extra, chunk_bytes)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    x, weight, b = make_inputs(300, 64, 1000)
    target = make_target(300, 1000)
    leaves = _leaves(x, weight, b)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for reduction in REDUCTIONS:
            loss = npu_liger.fused_linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], reduction=reduction)
            loss.backward(torch.ones_like(loss))
    finally:
        torch.cuda.set_sync_debug_mode("default")
