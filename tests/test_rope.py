"""rope: HF apply_rotary_pos_emb numerics (float64 and half precision), gradients, opcheck, compile, head tiling,
no mutation, bad input."""

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._rotary as rotary_kernels
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward,
                       assert_compiles_without_recompiles, check_rotary_pair, compiled_variants, randn, run_opcheck)

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as hf_partial_rotary  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb  # noqa: E402

rope_op = torch.ops.npu_liger.rope.default
rope_backward_op = torch.ops.npu_liger.rope_backward.default

HEAD_DIMS = [64, 80, 96, 128, 72, 2, 6, 34, 50]
Q_LAYOUTS = ["hf", "fused_qkv", "contiguous", "strided"]


def reference(q, k, cos, sin):
    """transformers' own functions: Llama's apply_rotary_pos_emb for full rotary, GPT-NeoX's (the same
    rotate_half plus the pass-through of columns past rotary_dim) for partial rotary. Our 2-D (seq, rotary_dim)
    cos/sin mean (1, seq, rotary_dim)."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    fn = hf_apply_rotary_pos_emb if cos.shape[-1] == q.shape[-1] else hf_partial_rotary
    return fn(q, k, cos, sin, unsqueeze_dim=1)


def make_qk(bsz, seq, n_q_heads, n_kv_heads, head_dim, dtype, layout):
    """q (bsz, n_q_heads, seq, head_dim), k (bsz, n_kv_heads, seq, head_dim) in the given memory layout."""
    if layout == "hf":  # HF: view(bsz, seq, heads, head_dim).transpose(1, 2)
        q = randn((bsz, seq, n_q_heads, head_dim), dtype).transpose(1, 2)
        k = randn((bsz, seq, n_kv_heads, head_dim), dtype).transpose(1, 2)
    elif layout == "fused_qkv":  # slices of one fused qkv projection
        qkv = randn((bsz, seq, n_q_heads + 2 * n_kv_heads, head_dim), dtype)
        q = qkv[:, :, :n_q_heads].transpose(1, 2)
        k = qkv[:, :, n_q_heads:n_q_heads + n_kv_heads].transpose(1, 2)
    else:
        strided = layout == "strided"
        q = randn((bsz, n_q_heads, seq, head_dim), dtype, noncontiguous=strided)
        k = randn((bsz, n_kv_heads, seq, head_dim), dtype, noncontiguous=strided)
    return q, k


def rope_table(bsz, seq, rotary_dim, dtype, layout, values, base=10000.0):
    """cos/sin of the given layout ("batch": (bsz, seq, rd), "one": (1, seq, rd), "2d": (seq, rd)). "table": HF's
    usual table (equal halves, per-batch positions); "random": arbitrary values (halves differ)."""
    lead = {"batch": (bsz,), "one": (1,), "2d": ()}[layout]
    shape = (*lead, seq, rotary_dim)
    if values == "random":
        return randn(shape, dtype), randn(shape, dtype)
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=DEVICE) / max(rotary_dim, 1)))
    positions = torch.arange(seq, dtype=torch.float64, device=DEVICE) + torch.randint(
        0, 1000, (*lead, 1), device=DEVICE).double()
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def expected_strides(x):
    bsz, heads, seq, head_dim = x.shape
    return (seq * heads * head_dim, head_dim, heads * head_dim, 1)


def check_forward_backward(q, k, cos, sin):
    """Forward and both gradients against transformers in float64; half precision against HF eager in the same
    dtype (cos/sin cast to q's dtype, as HF's rotary embeddings return them)."""
    q_out, k_out, q, k = check_rotary_pair(
        lambda q, k: npu_liger.rope(q, k, cos, sin), reference, q, k, {"cos": cos, "sin": sin},
        (cos.double(), sin.double()), (cos.to(q.dtype), sin.to(q.dtype)))
    for out, x in ((q_out, q), (k_out, k)):
        assert out.dtype == x.dtype and out.shape == x.shape and out.stride() == expected_strides(x)


@st.composite
def rope_cases(draw):
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    partial = draw(st.booleans()) and head_dim > 2
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2 - 1)) if partial else head_dim
    n_kv_heads = draw(st.sampled_from([1, 2, 3]))
    return dict(
        bsz=draw(st.sampled_from([1, 2, 3])), seq=draw(st.sampled_from([1, 2, 5, 7, 16])),
        n_q_heads=n_kv_heads * draw(st.sampled_from([1, 2, 4])), n_kv_heads=n_kv_heads, head_dim=head_dim,
        rotary_dim=rotary_dim,
    )


@given(case=rope_cases(), dtype=st.sampled_from(FLOAT_DTYPES), q_layout=st.sampled_from(Q_LAYOUTS),
       cos_layout=st.sampled_from(["batch", "one", "2d"]), values=st.sampled_from(["table", "random"]),
       table_dtype=st.sampled_from(["q", torch.float32, torch.float64]))
def test_matches_hf_reference(case, dtype, q_layout, cos_layout, values, table_dtype):
    q, k = make_qk(case["bsz"], case["seq"], case["n_q_heads"], case["n_kv_heads"], case["head_dim"], dtype, q_layout)
    cos, sin = rope_table(case["bsz"], case["seq"], case["rotary_dim"], dtype if table_dtype == "q" else table_dtype,
                          cos_layout, values)
    check_forward_backward(q, k, cos, sin)


@pytest.mark.parametrize("head_dim, rotary_dim", [(8, 8), (10, 6), (7, 4)])
def test_exact_for_cos_sin_halves_that_differ(head_dim, rotary_dim):
    """Every column of cos/sin is used as written: the two halves are never assumed equal (odd head_dim with
    partial rotary too)."""
    q, k = make_qk(2, 3, 4, 2, head_dim, torch.float32, "hf")
    cos, sin = randn((2, 3, rotary_dim)), randn((2, 3, rotary_dim))
    check_forward_backward(q, k, cos, sin)
    half = rotary_dim // 2
    q_out, _ = npu_liger.rope(q, k, cos, sin)
    x1, x2 = q[..., :half], q[..., half:rotary_dim]
    c, s = cos[:, None], sin[:, None]
    torch.testing.assert_close(q_out[..., :half], x1 * c[..., :half] - x2 * s[..., :half])
    torch.testing.assert_close(q_out[..., half:rotary_dim], x2 * c[..., half:] + x1 * s[..., half:])
    assert torch.equal(q_out[..., rotary_dim:], q[..., rotary_dim:])


def test_per_batch_positions_are_honoured():
    q, k = make_qk(3, 4, 2, 1, 16, torch.float32, "hf")
    q = q[:1].expand(3, -1, -1, -1)  # the same q in every batch row: only cos/sin differ
    cos, sin = rope_table(3, 4, 16, torch.float32, "batch", "table")
    q_out, _ = npu_liger.rope(q, k, cos, sin)
    assert not torch.allclose(q_out[0], q_out[1])
    assert_close(q_out, reference(q.double(), k.double(), cos.double(), sin.double())[0])


def test_layouts_of_one_shape_each_get_their_own_launch():
    """The launch arguments are memoised on sizes and strides (``_rotary._launch_arguments``): q/k of one shape in
    every layout, one call after another, each match transformers (a memo keyed on the shape alone would reuse the
    first layout's strides)."""
    cos, sin = rope_table(2, 5, 16, torch.float32, "batch", "table")
    for layout in Q_LAYOUTS + Q_LAYOUTS[::-1]:
        check_forward_backward(*make_qk(2, 5, 4, 2, 16, torch.float32, layout), cos, sin)


def test_head_tiling_loop_iterates(small_ub):
    """A 4 KiB UB fits 2 heads of head_dim 64 per tile: 32 q heads take 16 iterations, 8 kv heads 4."""
    small_ub(4096)
    assert rotary_kernels.head_tiles("cpu", 32, 8, 64) == (2, 2)
    assert rotary_kernels.head_tiles("cpu", 32, 8, 64, backward=True) == (2, 2)
    for dtype, rotary_dim in ((torch.float32, 64), (torch.bfloat16, 48)):
        q, k = make_qk(2, 3, 32, 8, 64, dtype, "hf")
        cos, sin = rope_table(2, 3, rotary_dim, torch.float32, "batch", "random")
        check_forward_backward(q, k, cos, sin)


def test_default_ub_fits_llama_heads_in_one_tile():
    assert rotary_kernels.head_tiles("cpu", 32, 8, 128) == (32, 8)


@pytest.mark.parametrize("bsz, seq, n_q_heads, n_kv_heads", [(0, 3, 2, 1), (2, 0, 2, 1), (2, 3, 0, 0)])
def test_empty_inputs_give_empty_outputs(bsz, seq, n_q_heads, n_kv_heads):
    q = randn((bsz, n_q_heads, seq, 8), requires_grad=True)
    k = randn((bsz, n_kv_heads, seq, 8), requires_grad=True)
    cos, sin = randn((1, seq, 8)), randn((1, seq, 8))
    q_out, k_out = npu_liger.rope(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_unused_output_gets_zero_gradient():
    q, k = make_qk(2, 3, 4, 2, 16, torch.float32, "hf")
    q, k = q.requires_grad_(True), k.requires_grad_(True)
    cos, sin = rope_table(2, 3, 16, torch.float32, "one", "table")
    q_out, _ = npu_liger.rope(q, k, cos, sin)
    q_out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    q, k = make_qk(2, 5, 4, 2, 12, dtype, "hf")
    q, k = q.requires_grad_(True), k.requires_grad_(True)
    cos, sin = rope_table(2, 5, 12, dtype, "batch", "random")
    run_opcheck(rope_op, (q, k, cos, sin))
    run_opcheck(rope_backward_op, (randn(q.shape, dtype), randn(k.shape, dtype), cos, sin))
    q2, k2 = make_qk(1, 3, 2, 2, 10, dtype, "strided")
    cos2, sin2 = rope_table(1, 3, 6, torch.float32, "2d", "random")  # partial rotary, fp32 tables
    run_opcheck(rope_op, (q2.requires_grad_(True), k2.requires_grad_(True), cos2, sin2))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    """bsz and seq change between calls (first sizes distinct from every other dim, so no duck-sized relation
    is guarded); no recompilation, and compiled == HF in float64."""

    def model(rope, qs, ks, cos, sin):
        q_out, k_out = rope(qs.transpose(1, 2), ks.transpose(1, 2), cos, sin)
        return q_out * 2.0, k_out

    assert_compiled_forward_backward(
        lambda qs, ks, cos, sin: model(npu_liger.rope, qs, ks, cos, sin),
        lambda qs, ks, cos, sin: model(reference, qs, ks, cos, sin),
        lambda size: (randn((*size, 6, 20), requires_grad=True), randn((*size, 2, 20), requires_grad=True),
                      *rope_table(*size, 12, torch.float32, "batch", "random")),
        [(3, 5), (2, 9), (4, 17), (3, 30)],  # (bsz, seq)
    )

def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda q, k, cos, sin: npu_liger.rope(q, k, cos, sin)[0] + 1.0,
        lambda seq: (*make_qk(2, seq, 4, 2, 16, torch.float32, "hf"),
                     *rope_table(2, seq, 16, torch.float32, "2d", "table")),
        [5, 9, 23],
        lambda inputs, got, eager: assert_close(got, reference(*(t.double() for t in inputs))[0] + 1.0),
    )


def test_double_backward_raises_clear_error():
    q, k = make_qk(1, 2, 2, 1, 8, torch.float32, "hf")
    q = q.requires_grad_(True)
    cos, sin = randn((2, 8)), randn((2, 8))
    q_out = npu_liger.rope(q, k, cos, sin)[0]
    # rope is linear in q: only a gradient that itself requires grad reaches the backward op's autograd formula
    grad_q_out = randn(q_out.shape, requires_grad=True)
    (grad_q,) = torch.autograd.grad(q_out, q, grad_q_out, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_q.sum().backward()


def test_shape_arguments_are_never_specialised():
    """Only block sizes and switches are constexpr; every integer that changes with bsz or seq is excluded from
    Triton's value specialisation (==1, %16), so new sizes never compile a new kernel variant."""
    for kernel in (rotary_kernels._rotary_fwd_kernel, rotary_kernels._rotary_bwd_kernel):
        parameters = inspect.signature(kernel.fn).parameters
        names = list(parameters)
        # JITFunction keeps do_not_specialize as given; the interpreter keeps the jit kwargs
        unspecialised = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]
        unspecialised = {names[p] if isinstance(p, int) else p for p in unspecialised}
        assert set(rotary_kernels.SHAPE_DEPENDENT_ARGS) <= unspecialised <= set(names)
        constexprs = {name for name, p in parameters.items() if "constexpr" in str(p.annotation)}
        assert constexprs == {"BLOCK_QH", "BLOCK_KH", "BLOCK_HALF", "VEC", "TVEC", "INTERLEAVED",
                              "MROPE", "PLANE_MASKS"}


@pytest.mark.skipif(DEVICE == "cpu", reason="the Triton interpreter compiles nothing")
def test_new_batch_and_seq_compile_no_new_kernel_variant():
    def run(bsz, seq):
        q, k = make_qk(bsz, seq, 8, 2, 128, torch.bfloat16, "hf")
        cos, sin = rope_table(bsz, seq, 128, torch.bfloat16, "batch", "table")
        q, k = q.requires_grad_(True), k.requires_grad_(True)
        q_out, k_out = npu_liger.rope(q, k, cos, sin)
        (q_out.float().sum() + k_out.float().sum()).backward()

    run(2, 64)
    fwd = compiled_variants(rotary_kernels._rotary_fwd_kernel)
    bwd = compiled_variants(rotary_kernels._rotary_bwd_kernel)
    for bsz, seq in [(1, 1), (3, 17), (4, 4096), (5, 129)]:
        run(bsz, seq)
    assert compiled_variants(rotary_kernels._rotary_fwd_kernel) == fwd
    assert compiled_variants(rotary_kernels._rotary_bwd_kernel) == bwd


def _qk(bsz=2, seq=3, hq=4, hk=2, hd=8, dtype=torch.float32):
    return randn((bsz, hq, seq, hd), dtype), randn((bsz, hk, seq, hd), dtype)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: (*_qk(), randn((2, 3, 8)), randn((2, 3, 6))), ValueError, "sin must have the shape of cos"),
        (lambda: (*_qk(), randn((2, 4, 8)), randn((2, 4, 8))), ValueError, "cos must have q's seq length 3"),
        (lambda: (*_qk(), randn((3, 3, 8)), randn((3, 3, 8))), ValueError, "cos must have batch size 1 or q's bsz 2"),
        (lambda: (*_qk(), randn((1, 2, 3, 8)), randn((1, 2, 3, 8))), ValueError, r"cos must be \(bsz or 1"),
        (lambda: (*_qk(), randn((2, 3, 5)), randn((2, 3, 5))), ValueError, "rotary_dim .* must be even, got 5"),
        (lambda: (*_qk(), randn((2, 3, 10)), randn((2, 3, 10))), ValueError, "rotary_dim .* must be <= head_dim 8"),
        (lambda: (randn((2, 4, 3, 8)), randn((2, 2, 4, 8)), randn((3, 8)), randn((3, 8))), ValueError,
         "k must match q in seq"),
        (lambda: (randn((2, 4, 3, 8)), randn((1, 2, 3, 8)), randn((3, 8)), randn((3, 8))), ValueError,
         "k must match q in bsz"),
        (lambda: (randn((2, 4, 3, 8)), randn((2, 2, 3, 6)), randn((3, 6)), randn((3, 6))), ValueError,
         "k must match q in head_dim"),
        (lambda: (randn((4, 3, 8)), randn((2, 3, 8)), randn((3, 8)), randn((3, 8))), ValueError, "q must be 4-D"),
        (lambda: (*_qk(), randn((3, 8)), randn((3, 8), torch.float16)), TypeError, "sin must have the dtype of cos"),
        (lambda: (randn((2, 4, 3, 8)), randn((2, 2, 3, 8), torch.float16), randn((3, 8)), randn((3, 8))), TypeError,
         "k must have the dtype of q"),
        (lambda: (*_qk(), torch.ones(3, 8, dtype=torch.int32, device=DEVICE), randn((3, 8))), TypeError,
         "cos must be float32, float16, bfloat16 or float64, got torch.int32"),
        (lambda: (*_qk(dtype=torch.float64), randn((3, 8)), randn((3, 8))), TypeError, "q must be float32"),
        (lambda: (torch.ones(2, 4, 3, 8, dtype=torch.int32, device=DEVICE), *_qk()[1:], randn((3, 8)), randn((3, 8))),
         TypeError, "q must be float32"),
        (lambda: (*_qk(), torch.randn(3, 8, device="meta"), torch.randn(3, 8, device="meta")), RuntimeError,
         "cos must be on the device of q"),
        (lambda: (randn((2, 4, 3, 8)), torch.randn(2, 2, 3, 8, device="meta"), randn((3, 8)), randn((3, 8))),
         RuntimeError, "k must be on the device of q"),
    ],
)
def test_bad_input_raises_clear_error(make, error, match):
    with pytest.raises(error, match=match):
        npu_liger.rope(*make())


@pytest.mark.parametrize("kv_heads", [2, 4])  # GQA: k's heads differ from q's; MHA: the cos check trips
def test_hf_layout_error_says_which_layout_is_expected(kv_heads):
    """q and k straight from HF's projections, (bsz, seq, heads, head_dim): the error names the expected layout
    and the transpose that gives it."""
    q, k, cos = randn((2, 5, 4, 8)), randn((2, 5, kv_heads, 8)), randn((5, 8))
    with pytest.raises(ValueError, match=r"q and k are \(bsz, heads, seq, head_dim\), e\.g\. q\.transpose\(1, 2\)"):
        npu_liger.rope(q, k, cos, cos)
    npu_liger.rope(q.transpose(1, 2), k.transpose(1, 2), cos, cos)  # what the message says works


def test_backward_op_names_its_arguments():
    q, k = _qk()
    with pytest.raises(ValueError, match="grad_k must match grad_q in seq"):
        rope_backward_op(q, randn((2, 2, 4, 8)), randn((3, 8)), randn((3, 8)))

