"""rms_norm, fused_add_rms_norm, layer_norm: numerics and gradients against float64 (half precision against the
eager formula in that precision), Hugging Face's own norm modules, both kernel paths (several whole rows per
tile, a row looped in chunks), opcheck, compile, determinism, no mutation, empty and bad input, nn modules."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiles_without_recompiles, assert_no_alias,
                       UNIT_ROUNDOFF, assert_unchanged, randn, rel_error, run_opcheck, snapshot)
from npu_liger.npu_ops import rms_norm as rms_kernels
from npu_liger.npu_ops._norm import PARTIAL_ROWS_PER_STEP, plan_rows, plan_sum_partials, sum_partials

MODES = ("llama", "gemma", "none")
# Last dims: primes, a non-power-of-two head_dim, powers of two; leading shapes of 1-3 dims. (A last dim of 1 is
# in test_single_column: its x gradient is O(eps), all cancellation, so no relative tolerance applies.)
COLS = st.sampled_from([2, 7, 33, 96, 128, 257, 600])
LEADING = st.sampled_from([(1,), (5,), (3, 4), (2, 3, 7), (45,)])


def rms_reference(x, w, eps=1e-6, offset=0.0, mode="llama"):
    """Hugging Face's RMSNorm computations (LlamaRMSNorm: llama, GemmaRMSNorm: gemma) and x's dtype throughout
    (none). Float64 inputs give the exact reference. ``w`` None: no scale (offset unused), as Llama-4's
    Llama4TextL2Norm computes it (llama, gemma) or in x's dtype (none)."""
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    if mode == "none":
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return h if w is None else h * (offset + w)
    h = x.to(stat)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if w is None:
        return h.to(x.dtype)
    if mode == "llama":
        return (offset + w) * h.to(x.dtype)
    return (h * (offset + w.to(stat))).to(x.dtype)


def fused_reference(x, r, w, eps=1e-6, offset=0.0, mode="llama"):
    s = x + r
    return rms_reference(s, w, eps, offset, mode), s


def ln_reference(x, w, b, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def rounding_points(mode, fused=False):
    """How many times the op's results are rounded to x's dtype along the way: llama rounds the normalised x and
    then the product (as HF does), none rstd and the product, gemma the product only; the fused op's sum is
    rounded before it is normalised."""
    return (1 if mode == "gemma" else 2) + (1 if fused else 0)


def assert_close_rounded(out, ref64, eager_lowp, roundings, what):
    """``checklist.assert_close`` with a half-precision floor of ``roundings`` unit roundoffs: a result rounded
    k times may be off by k units where the eager reference, rounding
    to nearest, happened to land close (tiny rows make that likely)."""
    if out.dtype == torch.float32 or roundings == 1 or out.numel() == 0:
        assert_close(out, ref64, eager_lowp, what=what)
        return
    err = rel_error(out, ref64)
    tol = max(2.0 * rel_error(eager_lowp, ref64), roundings * UNIT_ROUNDOFF[out.dtype])
    assert err <= tol, f"{what} ({out.dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


def check_against_reference(fn, reference, inputs, names, roundings=1):
    """``fn(*inputs)`` forward and every input gradient against ``reference`` in float64 and, for half
    precision, against ``reference`` in the inputs' own dtypes; inputs untouched and not aliased.
    ``inputs``: tensors (leaves made here) or other arguments; ``roundings``: the most roundings to the
    half-precision dtype on any path (``assert_close_rounded``; llama's weight gradient sums the rounded
    normalised x, so it inherits that rounding too)."""
    leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in inputs]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    before = snapshot(tensors)
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [randn(o.shape, o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    assert_unchanged(before, tensors, names)
    assert_no_alias([*outs, *(t.grad for t in tensors)], tensors)

    def run(convert):
        ref_leaves = [convert(t).detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in leaves]
        ref_outs = reference(*ref_leaves)
        ref_outs = ref_outs if isinstance(ref_outs, tuple) else (ref_outs,)
        torch.autograd.backward(ref_outs, [g.to(o.dtype) for g, o in zip(grads, ref_outs)])
        return ref_outs, [t.grad for t in ref_leaves if isinstance(t, torch.Tensor)]

    outs64, grads64 = run(lambda t: t.double())
    outs_lp, grads_lp = run(lambda t: t.clone())
    for i, (out, ref64, lp) in enumerate(zip(outs, outs64, outs_lp)):
        assert out.dtype == lp.dtype and out.shape == lp.shape and out.is_contiguous()
        assert_close_rounded(out, ref64, lp, roundings, f"output {i}")
    for name, t, g64, g_lp in zip(names, tensors, grads64, grads_lp):
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert_close_rounded(t.grad, g64, g_lp, roundings, f"grad of {name}")
    return outs


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), mode=st.sampled_from(MODES),
       offset=st.sampled_from([0.0, 1.0]), noncontiguous=st.booleans())
def test_rms_norm_matches_reference(leading, n_cols, dtype, mode, offset, noncontiguous):
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous)
    w = randn((n_cols,), dtype) * 0.5 + (1.0 - offset)
    check_against_reference(lambda x, w: npu_liger.rms_norm(x, w, 1e-6, offset, mode),
                            lambda x, w: rms_reference(x, w, 1e-6, offset, mode), (x, w), ("x", "weight"),
                            rounding_points(mode))


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), mode=st.sampled_from(MODES),
       offset=st.sampled_from([0.0, 1.0]), noncontiguous=st.booleans(), fused=st.booleans())
def test_rms_norm_without_weight_matches_reference(leading, n_cols, dtype, mode, offset, noncontiguous, fused):
    """``weight=None``: ``x * rsqrt(mean(x^2) + eps)`` in x's dtype, the offset unused; x's (and residual's)
    gradient only. Rounded once in llama and gemma modes (the normalised x is the result), twice in none."""
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous)
    if fused:
        r = randn((*leading, n_cols), dtype)
        outs = check_against_reference(lambda x, r: npu_liger.fused_add_rms_norm(x, r, None, 1e-6, offset, mode),
                                       lambda x, r: fused_reference(x, r, None, 1e-6, 0.0, mode), (x, r),
                                       ("x", "residual"), (1 if mode == "gemma" else 2) + 1)
    else:
        outs = check_against_reference(lambda x: npu_liger.rms_norm(x, None, 1e-6, offset, mode),
                                       lambda x: rms_reference(x, None, 1e-6, 0.0, mode), (x,), ("x",),
                                       1 if mode != "none" else 2)
    assert outs[0].dtype == dtype


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), mode=st.sampled_from(MODES),
       noncontiguous=st.booleans())
def test_fused_add_rms_norm_matches_reference(leading, n_cols, dtype, mode, noncontiguous):
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous)
    r = randn((*leading, n_cols), dtype, scale=2.0)
    w = randn((n_cols,), dtype)
    check_against_reference(lambda x, r, w: npu_liger.fused_add_rms_norm(x, r, w, 1e-5, 0.0, mode),
                            lambda x, r, w: fused_reference(x, r, w, 1e-5, 0.0, mode), (x, r, w),
                            ("x", "residual", "weight"), rounding_points(mode, fused=True))


@given(leading=LEADING, n_cols=COLS.filter(lambda n: n > 2), dtype=st.sampled_from(FLOAT_DTYPES),
       affine=st.sampled_from(["wb", "w", "-"]),
       shift=st.sampled_from([0.0, 30.0]), noncontiguous=st.booleans())
def test_layer_norm_matches_reference(leading, n_cols, dtype, affine, shift, noncontiguous):
    """``shift``: rows whose mean is far from 0 (a one-pass sum of squares would cancel catastrophically). Rows of
    2 are left out: their normalised values are +-1 whatever x is, so x's gradient is all cancellation."""
    x = randn((*leading, n_cols), dtype, noncontiguous=noncontiguous) + shift
    w = randn((n_cols,), dtype) if "w" in affine else None
    b = randn((n_cols,), dtype) if "b" in affine else None
    inputs = tuple(t for t in (x, w, b) if t is not None)
    names = ("x", "weight", "bias")[:len(inputs)]

    def bind(fn):
        return lambda *ts: fn(ts[0], ts[1] if w is not None else None, ts[2] if b is not None else None, 1e-5)

    check_against_reference(bind(npu_liger.layer_norm), bind(ln_reference), inputs, names)


# ---- Hugging Face's own modules ----------------------------------------------------------------------------


def _hf_norm(name, dim, dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma import modeling_gemma
    from transformers.models.llama import modeling_llama
    from transformers.models.llama4 import modeling_llama4
    from transformers.models.qwen3 import modeling_qwen3

    cls = {"llama": modeling_llama.LlamaRMSNorm, "gemma": modeling_gemma.GemmaRMSNorm,
           "qwen3": modeling_qwen3.Qwen3RMSNorm, "llama4": modeling_llama4.Llama4TextRMSNorm}[name]
    module = cls(dim, eps=1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        module.weight.copy_(randn((dim,), dtype) * 0.3 + (0.0 if name == "gemma" else 1.0))
    del transformers
    return module


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name,shape", [("llama", (3, 5, 64)), ("gemma", (3, 5, 64)), ("llama4", (2, 3, 48)),
                                        ("qwen3", (2, 7, 4, 128))])  # qwen3: q_norm over (bsz, seq, heads, head_dim)
def test_matches_hf_rms_norm_modules(name, shape, dtype):
    hf = _hf_norm(name, shape[-1], dtype)
    ours = npu_liger.nn.RMSNorm(shape[-1], eps=1e-5, offset=1.0 if name == "gemma" else 0.0,
                                casting_mode="gemma" if name == "gemma" else "llama").to(DEVICE, dtype)
    ours.load_state_dict(hf.state_dict())
    x = randn(shape, dtype)
    outs = check_against_reference(lambda x, w: npu_liger.rms_norm(x, w, ours.eps, ours.offset, ours.casting_mode),
                                   lambda x, w: torch.func.functional_call(hf, {"weight": w}, (x,)),
                                   (x, ours.weight), ("x", "weight"), rounding_points(ours.casting_mode))
    assert torch.equal(ours(x), outs[0])  # the module is the function


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_hf_weightless_norm_module(dtype):
    """Llama4TextL2Norm, Llama-4's qk norm, has no weight: ``RMSNorm(..., elementwise_affine=False)``."""
    pytest.importorskip("transformers")
    from transformers.models.llama4 import modeling_llama4

    hf = modeling_llama4.Llama4TextL2Norm(1e-5)
    ours = npu_liger.nn.RMSNorm(48, eps=1e-5, elementwise_affine=False)
    assert ours.weight is None and ours.state_dict() == {} and "elementwise_affine=False" in repr(ours)
    x = randn((2, 3, 4, 48), dtype)
    outs = check_against_reference(ours, hf, (x,), ("x",))
    assert torch.equal(outs[0], npu_liger.rms_norm(x, None, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_llama_mode_promotes_like_hf_with_an_fp32_weight(dtype):
    """LlamaRMSNorm returns ``weight * h.to(x.dtype)``: an fp32 weight with half x gives an fp32 result."""
    x, w = randn((6, 40), dtype), randn((40,), torch.float32)
    out = npu_liger.rms_norm(x, w)
    ref = rms_reference(x, w)
    assert out.dtype == ref.dtype == torch.float32
    assert rel_error(out, ref) <= UNIT_ROUNDOFF[dtype]  # the same rounding points (one rounding to x's dtype)
    assert npu_liger.rms_norm(x, w, casting_mode="gemma").dtype == dtype


# ---- both kernel paths, tiles and determinism ---------------------------------------------------------------


def test_tiny_ub_loops_wide_rows_and_packs_narrow_rows(small_ub):
    """A 4 KiB UB: a 520-wide row loops in 128-wide chunks (forward and backward of each op); 32-wide rows go
    several per tile, and 85 rows over 40 programs take several iterations."""
    small_ub(4096)
    wide = plan_rows("cpu", 9, 520, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, persistent=True)
    narrow = plan_rows("cpu", 85 * 4, 32, rms_kernels.FORWARD_MEMORY_MULTIPLIER, persistent=False)
    assert not wide.whole_row and wide.block_rows == 1 and wide.block_cols < 520
    assert narrow.whole_row and narrow.block_rows > 1 and narrow.grid == 40 < 85 * 4 / narrow.block_rows
    for shape in [(9, 520), (85, 4, 32)]:
        x, r, w, b = randn(shape), randn(shape), randn(shape[-1:]), randn(shape[-1:])
        for mode in MODES:
            check_against_reference(lambda x, w: npu_liger.rms_norm(x, w, 1e-6, 0.0, mode),
                                    lambda x, w: rms_reference(x, w, 1e-6, 0.0, mode), (x, w), ("x", "weight"))
        check_against_reference(lambda x, r, w: npu_liger.fused_add_rms_norm(x, r, w),
                                fused_reference, (x, r, w), ("x", "residual", "weight"))
        # no weight (HAS_WEIGHT off) through the same two paths, plain and fused
        check_against_reference(lambda x: npu_liger.rms_norm(x, None, 1e-6, 0.0, "none"),
                                lambda x: rms_reference(x, None, 1e-6, 0.0, "none"), (x,), ("x",))
        check_against_reference(lambda x, r: npu_liger.fused_add_rms_norm(x, r, None),
                                lambda x, r: fused_reference(x, r, None), (x, r), ("x", "residual"))
        check_against_reference(lambda x, w, b: npu_liger.layer_norm(x + 20.0, w, b),
                                lambda x, w, b: ln_reference(x + 20.0, w, b), (x, w, b), ("x", "weight", "bias"))
    x = randn((7, 300), torch.bfloat16, noncontiguous=True)  # half precision through the looped path
    w = randn((300,), torch.bfloat16)
    check_against_reference(lambda x, w: npu_liger.rms_norm(x, w), rms_reference, (x, w), ("x", "weight"),
                            rounding_points("llama"))


def test_default_ub_keeps_hidden_4096_whole_and_loops_wider_backward():
    if DEVICE != "cpu":
        pytest.skip("the emulated Ascend910B3 plan")
    assert plan_rows("cpu", 64, 4096, rms_kernels.FORWARD_MEMORY_MULTIPLIER, False).whole_row
    assert plan_rows("cpu", 64, 8192, rms_kernels.FORWARD_MEMORY_MULTIPLIER, False).whole_row
    assert not plan_rows("cpu", 64, 8192, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True).whole_row
    head = plan_rows("cpu", 4 * 64 * 32, 128, rms_kernels.FORWARD_MEMORY_MULTIPLIER, False)  # q_norm rows
    assert head.whole_row and head.block_rows == 64 and head.grid == 40


def test_weight_gradient_is_deterministic(small_ub):
    """The dW reduction is a fixed-order sum of per-program partials: two runs agree bitwise."""
    small_ub(8192)
    x, w = randn((50, 200)), randn((200,))
    dy = randn((50, 200))
    for fn, args in ((torch.ops.npu_liger.rms_norm_backward, (dy, x, w, 1e-6, 0.0, "llama")),
                     (torch.ops.npu_liger.layer_norm_backward, (dy, x, w, w, 1e-5))):
        first, second = fn(*args), fn(*args)
        assert all(torch.equal(a, b) for a, b in zip(first, second))


@given(programs=st.sampled_from([1, 3, PARTIAL_ROWS_PER_STEP, 2 * PARTIAL_ROWS_PER_STEP + 5]),
       cols=st.sampled_from([1, 7, 130, 1500]), two=st.booleans(),
       dtypes=st.tuples(st.sampled_from(FLOAT_DTYPES), st.sampled_from(FLOAT_DTYPES)))
def test_sum_partials_matches_float64_sum(programs, cols, two, dtypes):
    """The parameter gradients' reduction: each buffer summed over programs (the inner loop turns past
    PARTIAL_ROWS_PER_STEP programs, the column loop past one column block: 1500 columns are three blocks on the
    emulated chip's UB), rounded once to its own dtype, two separate tensors, deterministic, partials untouched."""
    buffers = 2 if two else 1
    partials = randn((buffers, programs, cols), scale=4.0)
    before = snapshot([partials])
    outs = sum_partials(partials, dtypes[:buffers])
    assert len(outs) == buffers
    for out, buffer, dtype in zip(outs, partials, dtypes):
        assert out.dtype == dtype and out.shape == (cols,) and out.is_contiguous()
        ref = buffer.double().sum(0)
        # fp32 sums of `programs` terms (first-order bound programs * 2**-24 * sum |terms|), then one rounding
        # to the output dtype (its unit roundoff, relative)
        atol = programs * 2.0**-24 * buffer.abs().double().sum(0).cpu()
        rounding = UNIT_ROUNDOFF.get(dtype, 2.0**-24) * ref.abs().cpu()
        assert ((out.double().cpu() - ref.cpu()).abs() <= atol + rounding * (1 + 1e-6)).all()
    if two:
        assert outs[0].data_ptr() != outs[1].data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(outs, sum_partials(partials, dtypes[:buffers])))
    assert_unchanged(before, [partials], ["partials"])


def test_sum_partials_kernel_takes_one_partial_row_as_a_constexpr():
    """Inductor's launches (and wrap_triton's mutation analysis) specialise an int argument equal to 1 into a
    constexpr, which has no ``.to()``: the kernel must widen n_partials through a tensor. Round nineteen's CUDA run
    failed dyt's compiled backward on exactly this (and rms_norm's weight gradient came out wrong beside it). The
    interpreter passes a constexpr through as the compiler would, so CPU runs check the kernel body."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's check; on CUDA tests/test_inductor_launches.py compiles the graphs")
    import triton.language as tl

    from npu_liger.npu_ops._norm import _sum_partials_kernel

    partials = randn((2, 1, 40))
    out, second = torch.empty(40), torch.empty(40)
    _sum_partials_kernel[(1,)](partials, out, second, tl.constexpr(1), 40, TWO=True, BLOCK_P=4, BLOCK_N=64)
    assert torch.equal(out, partials[0, 0]) and torch.equal(second, partials[1, 0])


def test_sum_partials_tiles_columns():
    """On the emulated chip the UB manager's column block is smaller than 1500 columns, so the case above
    exercises the grid-stride column loop (a guard for the test's own premise)."""
    if DEVICE != "cpu":
        pytest.skip("the emulated UB only exists on CPU runs")
    assert plan_sum_partials("cpu", 1500).block_cols < 1500


def test_unused_sum_output_and_broadcast_gradients():
    """``normed.sum().backward()`` hands the backward an expanded grad and no gradient for s."""
    x, r, w = randn((4, 3, 24), requires_grad=True), randn((4, 3, 24), requires_grad=True), randn((24,))
    w.requires_grad_(True)
    normed, _ = npu_liger.fused_add_rms_norm(x, r, w)
    normed.sum().backward()
    s64 = (x.detach().double() + r.detach().double()).requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    rms_reference(s64, w64).sum().backward()
    assert_close(x.grad, s64.grad)
    assert_close(r.grad, s64.grad)
    assert_close(w.grad, w64.grad)
    assert x.grad.data_ptr() != r.grad.data_ptr()


def test_single_column():
    # positive x: n = x * rstd is ~1 in every row, so the weight gradient (their sum) does not cancel
    x, w = (randn((6, 1)).abs() + 0.1).requires_grad_(True), randn((1,), requires_grad=True)
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    for mode in MODES:
        assert_close(npu_liger.rms_norm(x, w, 1e-6, 0.0, mode), rms_reference(x64, w64, 1e-6, 0.0, mode))
    npu_liger.rms_norm(x, w).sum().backward()  # (x's gradient, w * eps / (x^2 + eps)^1.5, is all cancellation)
    rms_reference(x64, w64).sum().backward()
    assert_close(w.grad, w64.grad)
    b = randn((1,))
    assert torch.equal(npu_liger.layer_norm(x, w, b), b.expand(6, 1))  # x - mean is exactly 0


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (2, 0, 8)])
def test_empty_inputs(shape):
    x, r = randn(shape, requires_grad=True), randn(shape, requires_grad=True)
    w, b = randn(shape[-1:], requires_grad=True), randn(shape[-1:], requires_grad=True)
    outs = [npu_liger.rms_norm(x, w), *npu_liger.fused_add_rms_norm(x, r, w), npu_liger.layer_norm(x, w, b),
            npu_liger.rms_norm(x, None), *npu_liger.fused_add_rms_norm(x, r, None)]
    assert all(o.shape == shape for o in outs)
    sum(o.sum() for o in outs).backward()
    assert x.grad.shape == shape and r.grad.shape == shape
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


# ---- the op checklist ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x, r = randn((5, 37), dtype, requires_grad=True), randn((5, 37), dtype, requires_grad=True)
    w, b = randn((37,), dtype, requires_grad=True), randn((37,), dtype, requires_grad=True)
    strided = randn((3, 2, 37), dtype, noncontiguous=True)
    dy = randn((5, 37), dtype)
    for mode in MODES:
        run_opcheck(torch.ops.npu_liger.rms_norm.default, (x, w, 1e-6, 0.5, mode))
        run_opcheck(torch.ops.npu_liger.fused_add_rms_norm.default, (x, r, w, 1e-6, 1.0, mode))
        run_opcheck(torch.ops.npu_liger.rms_norm_backward.default, (dy, x.detach(), w.detach(), 1e-6, 0.0, mode))
        for grad_sum in (dy, None):
            run_opcheck(torch.ops.npu_liger.fused_add_rms_norm_backward.default,
                        (dy, grad_sum, x.detach(), w.detach(), 1e-6, 0.0, mode))
    run_opcheck(torch.ops.npu_liger.rms_norm.default, (strided, w.detach()))
    for mode in MODES:  # no weight: the backward ops return no weight gradient
        run_opcheck(torch.ops.npu_liger.rms_norm.default, (x, None, 1e-6, 0.5, mode))
        run_opcheck(torch.ops.npu_liger.fused_add_rms_norm.default, (x, r, None, 1e-6, 0.0, mode))
        run_opcheck(torch.ops.npu_liger.rms_norm_backward.default, (dy, x.detach(), None, 1e-6, 0.0, mode))
        run_opcheck(torch.ops.npu_liger.fused_add_rms_norm_backward.default,
                    (dy, dy, x.detach(), None, 1e-6, 0.0, mode))
    assert torch.ops.npu_liger.rms_norm_backward(dy, x.detach(), None, 1e-6, 0.0, "llama")[1] is None
    assert torch.ops.npu_liger.fused_add_rms_norm_backward(dy, None, x.detach(), None, 1e-6, 0.0, "llama")[1] is None
    for weight, bias in ((w, b), (w, None), (None, None)):
        run_opcheck(torch.ops.npu_liger.layer_norm.default, (x, weight, bias, 1e-5))
        run_opcheck(torch.ops.npu_liger.layer_norm_backward.default,
                    (dy, x.detach(), None if weight is None else w.detach(), None if bias is None else b.detach(),
                     1e-5))
    run_opcheck(torch.ops.npu_liger.layer_norm.default, (strided, None, None))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x, r, w, b):
        normed, s = npu_liger.fused_add_rms_norm(x * 2.0, r, w, 1e-6, 1.0, "gemma")
        bare, _ = npu_liger.fused_add_rms_norm(s, x, None)
        return npu_liger.rms_norm(normed, w) + npu_liger.layer_norm(s, w, b) + npu_liger.rms_norm(bare * s, None)

    def make(n):
        return (randn((n, 3, 40), requires_grad=True), randn((n, 3, 40)), randn((40,), requires_grad=True),
                randn((40,), requires_grad=True))

    def check(inputs, got, expected):
        grads = torch.autograd.grad(got.square().sum(), [t for t in inputs if t.requires_grad])
        detached = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
        ref = fn(*detached)
        ref_grads = torch.autograd.grad(ref.square().sum(), [t for t in detached if t.requires_grad])
        assert_close(got, expected.detach().double())
        for g, rg in zip(grads, ref_grads):
            assert_close(g, rg.double())

    assert_compiles_without_recompiles(fn, make, [5, 9, 17], check)


def test_double_backward_raises_clear_error():
    x, w = randn((3, 8), requires_grad=True), randn((8,), requires_grad=True)
    (gx,) = torch.autograd.grad(torch.ops.npu_liger.rms_norm(x, w).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.rms_norm(randn((3, 8)), randn((7,))), ValueError, r"weight must have shape \(8,\)"),
    (lambda: npu_liger.rms_norm(randn((3, 8)).long(), randn((8,))), TypeError, "x must be float32"),
    (lambda: npu_liger.rms_norm(randn(()), randn((1,))), ValueError, "x must have at least one dimension"),
    (lambda: npu_liger.rms_norm(randn((3, 8)), randn((8,)), casting_mode="t5"), ValueError, "casting_mode"),
    (lambda: npu_liger.rms_norm(randn((3, 8)), randn((8,)), eps=-1.0), ValueError, "eps must be >= 0"),
    (lambda: npu_liger.rms_norm(randn((3, 8)), randn((8,)), eps="1"), TypeError, "eps must be a float"),
    (lambda: npu_liger.fused_add_rms_norm(randn((3, 8)), randn((3, 9)), randn((8,))), ValueError, "residual"),
    (lambda: npu_liger.fused_add_rms_norm(randn((3, 8)), randn((3, 8), torch.float16), randn((8,))), TypeError,
     "residual must have the dtype of x"),
    (lambda: npu_liger.layer_norm(randn((3, 8)), None, randn((2, 4))), ValueError, r"bias must have shape \(8,\)"),
    (lambda: npu_liger.layer_norm(randn((3, 8)), randn((8,)).int()), TypeError, "weight must be float32"),
    (lambda: torch.ops.npu_liger.rms_norm_backward(randn((3, 8), torch.float16), randn((3, 8)), randn((8,)), 1e-6,
                                                   0.0, "llama"), TypeError, "grad_out must be torch.float32"),
    (lambda: torch.ops.npu_liger.rms_norm_backward(randn((3, 8), torch.float16), randn((3, 8)), None, 1e-6, 0.0,
                                                   "llama"), TypeError, "grad_out must be torch.float32"),
    (lambda: npu_liger.rms_norm(randn((3, 8)), randn((8,)).cpu().numpy()), TypeError, "weight must be a torch.Tensor"),
    (lambda: torch.ops.npu_liger.layer_norm_backward(randn((3, 9)), randn((3, 8)), None, None, 1e-5), ValueError,
     r"grad_out must have shape \(3, 8\)"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- nn modules ---------------------------------------------------------------------------------------------


def test_modules_load_state_dicts_and_match_the_functions():
    norm = npu_liger.nn.RMSNorm(24, eps=1e-5, offset=1.0, casting_mode="gemma").to(DEVICE)
    assert torch.equal(norm.weight, torch.zeros(24, device=DEVICE)) and "gemma" in repr(norm)
    norm.load_state_dict({"weight": randn((24,))})
    x, r = randn((3, 24)), randn((3, 24))
    assert torch.equal(norm(x), npu_liger.rms_norm(x, norm.weight, 1e-5, 1.0, "gemma"))
    fused, s = norm(x, r)
    assert torch.equal(fused, norm(x + r)) and torch.equal(s, x + r)

    torch_ln = torch.nn.LayerNorm(24, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        torch_ln.weight.copy_(randn((24,)))
        torch_ln.bias.copy_(randn((24,)))
    ln = npu_liger.nn.LayerNorm(24, eps=1e-6).to(DEVICE)
    ln.load_state_dict(torch_ln.state_dict())
    assert_close(ln(x), torch_ln(x.double().float()).double())
    assert npu_liger.nn.LayerNorm(24, bias=False).bias is None
    assert npu_liger.nn.LayerNorm(24, elementwise_affine=False).weight is None
    with pytest.raises(ValueError, match="casting_mode"):
        npu_liger.nn.RMSNorm(8, casting_mode="t5")
    with pytest.raises(ValueError, match="normalized_shape"):
        npu_liger.nn.LayerNorm((4, 8))


def test_cuda_plan_keeps_whole_rows_and_caps_the_backward_grid(monkeypatch):
    """The two TileRequest fields the norms use (no GPU needed: the CUDA policy is plain arithmetic)."""
    from npu_liger.tiling import TileRequest, launch

    launch._plan_cuda.cache_clear()
    plan_rows.cache_clear()
    monkeypatch.setattr(launch, "cuda_sm_count", lambda: 132)
    try:
        plain = launch.plan_launch("cuda", TileRequest(7.0, ((8192,),), (0,), 4))
        lifted = launch.plan_launch("cuda", TileRequest(7.0, ((8192,),), (0,), 4, cuda_max_block=16384))
        assert plain.block < 8192 and lifted.block == 8192 and lifted.num_warps == 8
        assert launch.plan_launch("cuda", TileRequest(7.0, ((100,),), (0,), 4, cuda_max_block=16384)).block == 128
        assert lifted.max_programs is None and lifted.grid(10**6) == 10**6
        capped = launch.plan_launch("cuda", TileRequest(7.0, ((8192,),), (0,), 4, cuda_programs_per_sm=2))
        assert capped.max_programs == 264 and capped.grid(10**6) == 264
        # the norms' plan: whole rows up to 16384 on CUDA; narrow rows several per program
        wide = plan_rows("cuda", 16384, 8192, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
        assert wide.whole_row and wide.block_rows == 1 and wide.grid == 264 and wide.options == {"num_warps": 16}
        # narrow rows (Qwen3's q/k norm over head_dim 128) need more programs in flight: 8 per SM, not 2
        narrow = plan_rows("cuda", 4 * 2048 * 16, 128, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
        assert narrow.whole_row and narrow.grid == 8 * 132
        assert plan_rows("cuda", 32768, 2048, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True).grid == 264
        assert wide.prefetch and not plan_rows("cuda", 16384, 8192, 4.0, False).prefetch
        assert plan_rows("cuda", 32768, 4096, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True).options == {"num_warps": 4}
        # each forward kernel's measured wide-row tiles, weight (and bias) loaded per tile
        from npu_liger.npu_ops import layer_norm as ln_kernels
        rms_fwd = plan_rows("cuda", 16384, 8192, rms_kernels.FORWARD_MEMORY_MULTIPLIER, False,
                            rms_kernels.CUDA_FORWARD_WIDE_ROWS)
        assert (rms_fwd.block_rows, rms_fwd.options, rms_fwd.params_per_tile) == (1, {"num_warps": 8}, True)
        ln_fwd = plan_rows("cuda", 8192, 4096, ln_kernels.FORWARD_MEMORY_MULTIPLIER, False,
                           ln_kernels.CUDA_FORWARD_WIDE_ROWS)
        assert (ln_fwd.block_rows, ln_fwd.options, ln_fwd.grid) == (2, {"num_warps": 4}, 4096)
        assert not plan_rows("cpu", 8192, 4096, 4.0, False).params_per_tile  # the NPU plan keeps them once
        head = plan_rows("cuda", 4 * 4096 * 32, 128, rms_kernels.FORWARD_MEMORY_MULTIPLIER, False)
        assert head.whole_row and head.block_rows == 16 and head.grid == 4 * 4096 * 32 // 16
    finally:
        launch._plan_cuda.cache_clear()
        plan_rows.cache_clear()


def test_cuda_kernel_variants_give_the_same_results(monkeypatch, small_ub):
    """The CUDA plans load weight and bias for every forward tile (``_norm.CUDA_PARAMS_PER_TILE``) and prefetch
    the next tile in the persistent backward (``_norm.CUDA_PREFETCH``); the emulated NPU does neither. Forcing
    both here runs those kernel paths under the interpreter, with several tiles per program (small UB)."""
    from npu_liger.npu_ops import _norm, layer_norm as ln_kernels

    def cuda_like(device_type, n_rows, n_cols, multiplier, persistent, **kwargs):
        tiles = _norm.plan_rows(device_type, n_rows, n_cols, multiplier, persistent, **kwargs)
        return tiles._replace(params_per_tile=True, prefetch=tiles.whole_row and persistent)

    monkeypatch.setattr(rms_kernels, "plan_rows", cuda_like)
    monkeypatch.setattr(ln_kernels, "plan_rows", cuda_like)
    small_ub(8192)
    shape = (37, 15, 40)  # 555 rows of 40: several rows per tile, several tiles per program, a partial last tile
    plan = cuda_like("cpu", 555, 40, rms_kernels.BACKWARD_MEMORY_MULTIPLIER, True)
    assert plan.prefetch and plan.block_rows > 1 and plan.grid * 4 * plan.block_rows < 555
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w, b = randn(shape, dtype), randn(shape, dtype), randn(shape[-1:], dtype), randn(shape[-1:], dtype)
        for mode, offset in (("llama", 0.0), ("gemma", 1.0)):
            check_against_reference(lambda x, w: npu_liger.rms_norm(x, w, 1e-6, offset, mode),
                                    lambda x, w: rms_reference(x, w, 1e-6, offset, mode), (x, w), ("x", "weight"),
                                    rounding_points(mode))
        check_against_reference(lambda x, r, w: npu_liger.fused_add_rms_norm(x, r, w), fused_reference, (x, r, w),
                                ("x", "residual", "weight"), rounding_points("llama", fused=True))
        if dtype == torch.bfloat16:  # no weight: the per-tile path without its weight load
            check_against_reference(lambda x: npu_liger.rms_norm(x, None), lambda x: rms_reference(x, None), (x,),
                                    ("x",))
        check_against_reference(lambda x, w, b: npu_liger.layer_norm(x, w, b), ln_reference, (x, w, b),
                                ("x", "weight", "bias"))
    check_against_reference(lambda x: npu_liger.layer_norm(x, None, None), lambda x: ln_reference(x, None, None),
                            (x.float(),), ("x",))


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_eps_zero_weight_gradient_is_finite_with_padded_rows(norm):
    """A tile's rows past the last one are padding (45 rows of 16 columns: several rows per tile); with eps = 0
    their normalised values are 0 * inf = NaN, which must not reach the weight gradient's sum."""
    x, w = randn((45, 16)), randn((16,)).requires_grad_(True)
    x = x.requires_grad_(True)
    out = npu_liger.rms_norm(x, w, 0.0) if norm == "rms_norm" else npu_liger.layer_norm(x, w, None, 0.0)
    out.backward(randn(out.shape))
    assert torch.isfinite(w.grad).all() and torch.isfinite(x.grad).all()
