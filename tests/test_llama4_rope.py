"""llama4_rope: HF Llama-4 apply_rotary_emb numerics (float64 and half precision), per-batch positions, gradients,
opcheck, compile, head tiling, no mutation, bad input."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._rotary as rotary_kernels
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward,
                       assert_compiles_without_recompiles, check_rotary_pair, compiled_variants, randn, run_opcheck)

transformers = pytest.importorskip("transformers")
from transformers.models.llama4.modeling_llama4 import apply_rotary_emb as hf_apply_rotary_emb  # noqa: E402

llama4_rope_op = torch.ops.npu_liger.llama4_rope.default
llama4_rope_backward_op = torch.ops.npu_liger.llama4_rope_backward.default


def reference(q, k, freqs_cis):
    """transformers' own apply_rotary_emb. It indexes freqs_cis[:, :, None, :], so our 2-D (seq, head_dim // 2)
    form means (1, seq, head_dim // 2). With float64 q/k (exact copies of fp32/half data, so HF's .float() is
    lossless) and complex128 freqs it computes in float64."""
    if freqs_cis.dim() == 2:
        freqs_cis = freqs_cis[None]
    return hf_apply_rotary_emb(q, k, freqs_cis)


def make_qk(bsz, seq, n_q_heads, n_kv_heads, head_dim, dtype, layout="contiguous"):
    """q (bsz, seq, n_q_heads, head_dim), k (bsz, seq, n_kv_heads, head_dim) in the given memory layout."""
    if layout == "fused_qkv":
        qkv = randn((bsz, seq, n_q_heads + 2 * n_kv_heads, head_dim), dtype)
        return qkv[:, :, :n_q_heads], qkv[:, :, n_q_heads:n_q_heads + n_kv_heads]
    if layout == "transposed":
        return (randn((bsz, n_q_heads, seq, head_dim), dtype).transpose(1, 2),
                randn((bsz, n_kv_heads, seq, head_dim), dtype).transpose(1, 2))
    strided = layout == "strided"
    return (randn((bsz, seq, n_q_heads, head_dim), dtype, noncontiguous=strided),
            randn((bsz, seq, n_kv_heads, head_dim), dtype, noncontiguous=strided))


def make_freqs(bsz, seq, head_dim, layout="batch", values="polar", theta=500000.0):
    """complex64 freqs_cis ("batch": (bsz, seq, hd/2), "one": (1, seq, hd/2), "2d": (seq, hd/2)); "polar": HF's
    unit-magnitude table at per-batch positions, "random": arbitrary complex values."""
    lead = {"batch": (bsz,), "one": (1,), "2d": ()}[layout]
    if values == "random":
        return torch.complex(randn((*lead, seq, head_dim // 2)), randn((*lead, seq, head_dim // 2)))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=DEVICE) / head_dim))
    # each batch row its own start position (distinct: a repeat would make two rows' tables equal)
    starts = torch.randperm(1000, device=DEVICE)[: lead[0] if lead else 1].double().reshape(*lead, 1)
    positions = torch.arange(seq, dtype=torch.float64, device=DEVICE) + starts
    angles = positions[..., None] * inv_freq
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def check_forward_backward(q, k, freqs_cis):
    q_out, k_out, q, k = check_rotary_pair(
        lambda q, k: npu_liger.llama4_rope(q, k, freqs_cis), reference, q, k, {"freqs_cis": freqs_cis},
        (freqs_cis.to(torch.complex128),), (freqs_cis,), out_names=("xq_out", "xk_out"))
    for out, x in ((q_out, q), (k_out, k)):  # HF: type_as(xq); ours: new contiguous tensors
        assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()


@st.composite
def llama4_cases(draw):
    n_kv_heads = draw(st.sampled_from([1, 2, 3]))
    return dict(bsz=draw(st.sampled_from([1, 2, 3])), seq=draw(st.sampled_from([1, 2, 5, 7, 16])),
                n_q_heads=n_kv_heads * draw(st.sampled_from([1, 2, 4])), n_kv_heads=n_kv_heads,
                head_dim=draw(st.sampled_from([64, 80, 96, 128, 72, 2, 6, 34, 50])))


@given(case=llama4_cases(), dtype=st.sampled_from(FLOAT_DTYPES),
       layout=st.sampled_from(["contiguous", "fused_qkv", "transposed", "strided"]),
       freqs_layout=st.sampled_from(["batch", "one", "2d"]), values=st.sampled_from(["polar", "random"]))
def test_matches_hf_reference(case, dtype, layout, freqs_layout, values):
    q, k = make_qk(case["bsz"], case["seq"], case["n_q_heads"], case["n_kv_heads"], case["head_dim"], dtype, layout)
    check_forward_backward(q, k, make_freqs(case["bsz"], case["seq"], case["head_dim"], freqs_layout, values))


def test_per_batch_positions_are_honoured():
    """Every batch row rotates by its own positions (not batch 0's for all)."""
    q, k = make_qk(3, 4, 2, 1, 16, torch.float32)
    q = q[:1].expand(3, -1, -1, -1)  # the same q in every batch row: only the frequencies differ
    freqs = make_freqs(3, 4, 16, "batch")
    q_out, k_out = npu_liger.llama4_rope(q, k, freqs)
    assert not torch.allclose(q_out[0], q_out[1]) and not torch.allclose(q_out[1], q_out[2])
    q_ref, k_ref = reference(q.double(), k.double(), freqs.to(torch.complex128))
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)


def test_complex128_freqs_are_rounded_to_complex64():
    q, k = make_qk(2, 5, 4, 2, 16, torch.float32)
    freqs = make_freqs(2, 5, 16, "batch", "random").to(torch.complex128) / 3.0
    got = npu_liger.llama4_rope(q, k, freqs)
    want = npu_liger.llama4_rope(q, k, freqs.to(torch.complex64))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_close(got[0], reference(q.double(), k.double(), freqs)[0])


def test_noncontiguous_freqs_cis():
    q, k = make_qk(2, 5, 4, 2, 16, torch.float32)
    wide = make_freqs(2, 5, 32, "batch", "random")
    check_forward_backward(q, k, wide[..., ::2])  # strided complex view
    check_forward_backward(q, k, make_freqs(5, 2, 16, "batch").transpose(0, 1))


def test_head_tiling_loop_iterates(small_ub):
    small_ub(4096)
    assert rotary_kernels.head_tiles("cpu", 32, 8, 64, interleaved=True) == (2, 2)
    for dtype in (torch.float32, torch.bfloat16):
        q, k = make_qk(2, 3, 32, 8, 64, dtype)
        check_forward_backward(q, k, make_freqs(2, 3, 64, "batch"))


def test_default_ub_tile_of_the_interleaved_layout():
    """The interleaved layout's multiplier (the Ascend check's headroom probe): 32 heads of 128 per tile on the
    default emulated chip (64 overflow the UB), against 64 for the half-split layout."""
    assert rotary_kernels.head_tiles("cpu", 64, 8, 128, interleaved=True) == (32, 8)
    assert rotary_kernels.head_tiles("cpu", 64, 8, 128) == (64, 8)


@pytest.mark.parametrize("bsz, seq, n_q_heads", [(0, 3, 2), (2, 0, 2), (2, 3, 0)])
def test_empty_inputs_give_empty_outputs(bsz, seq, n_q_heads):
    q = randn((bsz, seq, n_q_heads, 8), requires_grad=True)
    k = randn((bsz, seq, n_q_heads, 8), requires_grad=True)
    q_out, k_out = npu_liger.llama4_rope(q, k, make_freqs(bsz, seq, 8, "2d"))
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    q, k = make_qk(2, 5, 4, 2, 12, dtype, "fused_qkv")
    freqs = make_freqs(2, 5, 12, "batch")
    run_opcheck(llama4_rope_op, (q.requires_grad_(True), k.requires_grad_(True), freqs))
    run_opcheck(llama4_rope_backward_op, (randn(q.shape, dtype), randn(k.shape, dtype), freqs))
    run_opcheck(llama4_rope_op, (randn(q.shape, dtype), randn(k.shape, dtype), make_freqs(2, 5, 12, "2d", "random")))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def model(rope, q, k, freqs):
        q_out, k_out = rope(q, k, freqs)
        return q_out * 2.0, k_out

    assert_compiled_forward_backward(
        lambda q, k, freqs: model(npu_liger.llama4_rope, q, k, freqs),
        lambda q, k, freqs: model(reference, q, k, freqs),
        lambda size: (randn((*size, 6, 20), requires_grad=True), randn((*size, 2, 20), requires_grad=True),
                      make_freqs(*size, 20, "batch")),
        [(3, 5), (2, 9), (4, 17), (3, 30)],  # (bsz, seq)
    )

def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda q, k, freqs: npu_liger.llama4_rope(q, k, freqs)[0] + 1.0,
        lambda seq: (*make_qk(2, seq, 4, 2, 16, torch.float32), make_freqs(2, seq, 16, "one")),
        [5, 9, 23],
        lambda inputs, got, eager: assert_close(
            got, reference(inputs[0].double(), inputs[1].double(), inputs[2].to(torch.complex128))[0] + 1.0),
    )


def test_double_backward_raises_clear_error():
    q, k = make_qk(1, 2, 2, 1, 8, torch.float32)
    q = q.requires_grad_(True)
    q_out = npu_liger.llama4_rope(q, k, make_freqs(1, 2, 8))[0]
    (grad_q,) = torch.autograd.grad(q_out, q, randn(q_out.shape, requires_grad=True), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_q.sum().backward()


@pytest.mark.skipif(DEVICE == "cpu", reason="the Triton interpreter compiles nothing")
def test_new_batch_and_seq_compile_no_new_kernel_variant():
    def run(bsz, seq):
        q, k = make_qk(bsz, seq, 8, 2, 128, torch.bfloat16)
        q, k = q.requires_grad_(True), k.requires_grad_(True)
        q_out, k_out = npu_liger.llama4_rope(q, k, make_freqs(bsz, seq, 128))
        (q_out.float().sum() + k_out.float().sum()).backward()

    run(2, 64)
    fwd = compiled_variants(rotary_kernels._rotary_fwd_kernel)
    bwd = compiled_variants(rotary_kernels._rotary_bwd_kernel)
    for bsz, seq in [(1, 1), (3, 17), (4, 4096), (5, 129)]:
        run(bsz, seq)
    assert compiled_variants(rotary_kernels._rotary_fwd_kernel) == fwd
    assert compiled_variants(rotary_kernels._rotary_bwd_kernel) == bwd


def _qk(hd=8, dtype=torch.float32):
    return randn((2, 3, 4, hd), dtype), randn((2, 3, 2, hd), dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: (*_qk(), randn((2, 3, 4))), TypeError, r"freqs_cis must be complex64 .*, got torch.float32"),
        (lambda: (*_qk(), make_freqs(2, 3, 8).to(torch.complex32)), TypeError,
         r"freqs_cis must be complex64 \(or complex128, rounded to complex64\), got torch.complex32"),
        (lambda: (*_qk(), [1.0]), TypeError, "freqs_cis must be a torch.Tensor, got list"),
        (lambda: (*_qk(), make_freqs(2, 4, 8)), ValueError, r"freqs_cis must be \(bsz or 1, seq, head_dim // 2\)"),
        (lambda: (*_qk(), make_freqs(2, 3, 6)), ValueError, r"= \(2 or 1, 3, 4\)"),
        (lambda: (*_qk(), make_freqs(3, 3, 8)), ValueError, "freqs_cis must be"),
        (lambda: (*_qk(), make_freqs(2, 3, 8)[None]), ValueError, "freqs_cis must be"),
        (lambda: (*_qk(hd=7), make_freqs(2, 3, 6)), ValueError, "head_dim must be even"),
        (lambda: (randn((2, 3, 4, 8)), randn((2, 5, 2, 8)), make_freqs(2, 3, 8)), ValueError, "k must match q in seq"),
        (lambda: (randn((2, 3, 4, 8)), randn((2, 3, 2, 6)), make_freqs(2, 3, 8)), ValueError,
         "k must match q in head_dim"),
        (lambda: (randn((3, 4, 8)), randn((3, 2, 8)), make_freqs(2, 3, 8)), ValueError,
         r"q must be 4-D \(bsz, seq, heads, head_dim\)"),
        (lambda: (*_qk(dtype=torch.float64), make_freqs(2, 3, 8)), TypeError, "q must be float32"),
        (lambda: (randn((2, 3, 4, 8)), randn((2, 3, 2, 8), torch.bfloat16), make_freqs(2, 3, 8)), TypeError,
         "k must have the dtype of q"),
        (lambda: (*_qk(), make_freqs(2, 3, 8).to("meta")), RuntimeError, "freqs_cis must be on the device of q"),
    ],
)
def test_bad_input_raises_clear_error(make, error, match):
    with pytest.raises(error, match=match):
        npu_liger.llama4_rope(*make())
