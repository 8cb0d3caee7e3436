"""qwen2vl_mrope: HF Qwen2-VL multimodal rotary numerics (float64 and half precision), gradients, opcheck, compile,
head tiling, no mutation, bad input."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._rotary as rotary_kernels
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward,
                       assert_compiles_without_recompiles, check_rotary_pair, randn, run_opcheck)

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402

mrope_op = torch.ops.npu_liger.qwen2vl_mrope.default
mrope_backward_op = torch.ops.npu_liger.qwen2vl_mrope_backward.default

# transformers < 5 ships apply_multimodal_rotary_pos_emb; 5.x merges the sections inside Qwen2VLRotaryEmbedding
# and applies the plain rotary. Where the function is gone, the reference is its documented formula (below).
HF_MROPE = getattr(modeling_qwen2_vl, "apply_multimodal_rotary_pos_emb", None)


def merge_sections(table, mrope_section):
    """The documented formula: section i of mrope_section * 2 (over the full head dim) from plane i % 3."""
    return torch.cat([m[i % 3] for i, m in enumerate(table.split(list(mrope_section) * 2, dim=-1))], dim=-1)


def reference(q, k, cos, sin, mrope_section):
    if HF_MROPE is not None:
        return HF_MROPE(q, k, cos, sin, list(mrope_section), unsqueeze_dim=1)
    return hf_apply_rotary_pos_emb(q, k, merge_sections(cos, mrope_section), merge_sections(sin, mrope_section),
                                   unsqueeze_dim=1)


def make_qk(bsz, seq, n_q_heads, n_kv_heads, head_dim, dtype, layout="hf"):
    if layout == "hf":
        return (randn((bsz, seq, n_q_heads, head_dim), dtype).transpose(1, 2),
                randn((bsz, seq, n_kv_heads, head_dim), dtype).transpose(1, 2))
    strided = layout == "strided"
    return (randn((bsz, n_q_heads, seq, head_dim), dtype, noncontiguous=strided),
            randn((bsz, n_kv_heads, seq, head_dim), dtype, noncontiguous=strided))


def mrope_planes(bsz, seq, head_dim, dtype, values="table", cos_bsz=None, base=10000.0):
    """(3, bsz or 1, seq, head_dim) cos/sin: "table" from distinct temporal/height/width positions (HF's layout:
    the half-dim angles repeated), "random" arbitrary values."""
    shape = (3, bsz if cos_bsz is None else cos_bsz, seq, head_dim)
    if values == "random":
        return randn(shape, dtype), randn(shape, dtype)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=DEVICE) / head_dim))
    positions = torch.randint(0, 64, shape[:3], device=DEVICE).double()
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check_forward_backward(q, k, cos, sin, mrope_section):
    q_out, k_out, q, k = check_rotary_pair(
        lambda q, k: npu_liger.qwen2vl_mrope(q, k, cos, sin, mrope_section), reference, q, k,
        {"cos": cos, "sin": sin}, (cos.double(), sin.double(), mrope_section),
        (cos.to(q.dtype), sin.to(q.dtype), mrope_section))
    assert q_out.dtype == q.dtype and q_out.shape == q.shape and k_out.shape == k.shape


@st.composite
def mrope_cases(draw):
    head_dim = draw(st.sampled_from([64, 80, 96, 128, 72, 6, 34]))
    half = head_dim // 2
    a, b = sorted(draw(st.lists(st.integers(0, half), min_size=2, max_size=2)))
    n_kv_heads = draw(st.sampled_from([1, 2, 3]))
    bsz = draw(st.sampled_from([1, 2, 3]))
    return dict(bsz=bsz, seq=draw(st.sampled_from([1, 3, 7, 16])),
                n_q_heads=n_kv_heads * draw(st.sampled_from([1, 2, 4])), n_kv_heads=n_kv_heads, head_dim=head_dim,
                mrope_section=[a, b - a, half - b], cos_bsz=draw(st.sampled_from([bsz, 1])))


@given(case=mrope_cases(), dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(["hf", "contiguous", "strided"]),
       values=st.sampled_from(["table", "random"]), cos_in_fp32=st.booleans())
def test_matches_reference(case, dtype, layout, values, cos_in_fp32):
    q, k = make_qk(case["bsz"], case["seq"], case["n_q_heads"], case["n_kv_heads"], case["head_dim"], dtype, layout)
    cos, sin = mrope_planes(case["bsz"], case["seq"], case["head_dim"], torch.float32 if cos_in_fp32 else dtype,
                            values, cos_bsz=case["cos_bsz"])
    check_forward_backward(q, k, cos, sin, case["mrope_section"])


def test_matches_hf_qwen2vl_rotary_embedding():
    """End to end against transformers' own Qwen2-VL rotary embedding (mrope_section [4, 6, 6], head_dim 32)."""
    sections = [4, 6, 6]
    config = transformers.Qwen2VLTextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections},
    )
    rotary = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config).to(DEVICE)
    bsz, seq, head_dim = 2, 5, 32
    position_ids = torch.randint(0, 64, (3, bsz, seq), device=DEVICE)
    hf_cos, hf_sin = rotary(randn((bsz, seq, 64)), position_ids)
    freqs = position_ids[..., None].float() * rotary.inv_freq.float()  # the unmerged planes HF starts from
    planes_cos, planes_sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    q, k = make_qk(bsz, seq, 2, 1, head_dim, torch.float32)
    q_out, k_out = npu_liger.qwen2vl_mrope(q, k, planes_cos, planes_sin, sections)
    if hf_cos.dim() == 4:  # transformers < 5: the embedding returns planes; apply_multimodal_rotary_pos_emb merges
        q_ref, k_ref = HF_MROPE(q, k, hf_cos, hf_sin, sections, unsqueeze_dim=1)
    else:  # transformers 5: the embedding merges, the attention applies the plain rotary
        q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, hf_cos, hf_sin, unsqueeze_dim=1)
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)


@pytest.mark.parametrize("mrope_section", [[8, 12, 12], [8, 24], [4, 8, 8, 12], [0, 32, 0], [32]])
def test_section_lists_of_any_length(mrope_section):
    """Qwen2-VL's proportions ([16, 24, 24] at head_dim 128) and lists of other lengths: section i of
    mrope_section * 2 always reads plane i % 3."""
    q, k = make_qk(2, 3, 4, 2, 64, torch.float32)
    cos, sin = mrope_planes(2, 3, 64, torch.float32, "random")
    check_forward_backward(q, k, cos, sin, mrope_section)


@pytest.mark.parametrize("mrope_section", [[8, 12, 12], [0, 32, 0], [5, 11, 16]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_plane_reads(monkeypatch, mrope_section, dtype):
    """The kernel reads the planes either with three masked loads per vector (CUDA) or with a per-column gather
    (NPU, CPU): both give the merged table's result, here both in the interpreter (or both on the GPU)."""
    q, k = make_qk(2, 3, 4, 2, 64, dtype)
    cos, sin = mrope_planes(2, 3, 64, torch.float32, "random")
    for backends in (("cuda", "cpu"), ()):
        monkeypatch.setattr(rotary_kernels, "PLANE_MASK_BACKENDS", backends)
        check_forward_backward(q, k, cos, sin, mrope_section)


def test_head_tiling_loop_iterates(small_ub):
    small_ub(4096)
    assert rotary_kernels.head_tiles("cpu", 32, 8, 64) == (2, 2)
    for dtype in (torch.float32, torch.bfloat16):
        q, k = make_qk(2, 3, 32, 8, 64, dtype)
        cos, sin = mrope_planes(2, 3, 64, torch.float32, "table")
        check_forward_backward(q, k, cos, sin, [8, 12, 12])


@pytest.mark.parametrize("bsz, seq, n_q_heads", [(0, 3, 2), (2, 0, 2), (2, 3, 0)])
def test_empty_inputs_give_empty_outputs(bsz, seq, n_q_heads):
    q = randn((bsz, n_q_heads, seq, 8), requires_grad=True)
    k = randn((bsz, n_q_heads, seq, 8), requires_grad=True)
    cos, sin = randn((3, 1, seq, 8)), randn((3, 1, seq, 8))
    q_out, k_out = npu_liger.qwen2vl_mrope(q, k, cos, sin, [1, 2, 1])
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    q, k = make_qk(2, 5, 4, 2, 12, dtype)
    cos, sin = mrope_planes(2, 5, 12, dtype, "random")
    run_opcheck(mrope_op, (q.requires_grad_(True), k.requires_grad_(True), cos, sin, [2, 2, 2]))
    run_opcheck(mrope_backward_op, (randn(q.shape, dtype), randn(k.shape, dtype), cos, sin, [2, 2, 2]))
    cos1, sin1 = mrope_planes(2, 5, 12, torch.float32, "table", cos_bsz=1)
    run_opcheck(mrope_op, (q, k, cos1, sin1, [1, 3, 2]))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    sections = [2, 3, 3]

    def model(mrope, qs, ks, cos, sin):
        q_out, k_out = mrope(qs.transpose(1, 2), ks.transpose(1, 2), cos, sin, sections)
        return q_out * 2.0, k_out

    # First sizes distinct from every other dim, 3 included: Dynamo's duck sizing would give a bsz of 3 the symbol
    # of the planes dim, which the fake checks, and so specialise bsz to 3 (one recompile on the next bsz).
    assert_compiled_forward_backward(
        lambda qs, ks, cos, sin: model(npu_liger.qwen2vl_mrope, qs, ks, cos, sin),
        lambda qs, ks, cos, sin: model(reference, qs, ks, cos, sin),
        lambda size: (randn((*size, 6, 16), requires_grad=True), randn((*size, 2, 16), requires_grad=True),
                      *mrope_planes(*size, 16, torch.float32, "random")),
        [(4, 5), (2, 9), (3, 17)],  # (bsz, seq)
    )

def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda q, k, cos, sin: npu_liger.qwen2vl_mrope(q, k, cos, sin, [4, 2, 2])[1] + 1.0,
        lambda seq: (*make_qk(2, seq, 4, 2, 16, torch.float32), *mrope_planes(2, seq, 16, torch.float32, cos_bsz=1)),
        [5, 9, 23],
        lambda inputs, got, eager: assert_close(got, reference(*(t.double() for t in inputs), [4, 2, 2])[1] + 1.0),
    )


def test_double_backward_raises_clear_error():
    q, k = make_qk(1, 2, 2, 1, 8, torch.float32)
    q = q.requires_grad_(True)
    cos, sin = mrope_planes(1, 2, 8, torch.float32, "random")
    q_out = npu_liger.qwen2vl_mrope(q, k, cos, sin, [2, 1, 1])[0]
    (grad_q,) = torch.autograd.grad(q_out, q, randn(q_out.shape, requires_grad=True), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_q.sum().backward()


def _qk(hd=8, dtype=torch.float32):
    return randn((2, 4, 3, hd), dtype), randn((2, 2, 3, hd), dtype)


def _planes(*shape, dtype=torch.float32):
    return randn(shape, dtype), randn(shape, dtype)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: (*_qk(), *_planes(3, 2, 3, 8), [1, 1, 1]), ValueError, r"mrope_section must sum to head_dim // 2 = 4"),
        (lambda: (*_qk(), *_planes(3, 2, 3, 8), [2, 2, 2]), ValueError, r"got \[2, 2, 2\] \(sum 6\)"),
        (lambda: (*_qk(), *_planes(3, 2, 3, 8), [5, -1]), ValueError, "non-negative ints"),
        (lambda: (*_qk(), *_planes(3, 2, 3, 8), []), ValueError, "non-empty list"),
        (lambda: (*_qk(), *_planes(2, 3, 8), [2, 1, 1]), ValueError, r"cos must be \(3, bsz or 1, seq, head_dim\)"),
        (lambda: (*_qk(), *_planes(2, 2, 3, 8), [2, 1, 1]), ValueError, r"cos must be \(3, bsz or 1"),
        (lambda: (*_qk(), *_planes(3, 3, 3, 8), [2, 1, 1]), ValueError, "batch size 1 or q's bsz 2"),
        (lambda: (*_qk(), *_planes(3, 2, 4, 8), [2, 1, 1]), ValueError, "q's seq length 3"),
        (lambda: (*_qk(), *_planes(3, 2, 3, 6), [1, 1, 1]), ValueError, "q's head_dim 8"),
        (lambda: (*_qk(hd=7), *_planes(3, 2, 3, 7), [1, 1, 1]), ValueError, "head_dim must be even"),
        (lambda: (*_qk(), randn((3, 2, 3, 8)), randn((3, 2, 3, 8), torch.float16), [2, 1, 1]), TypeError,
         "sin must have the dtype of cos"),
        (lambda: (*_qk(dtype=torch.float64), *_planes(3, 2, 3, 8), [2, 1, 1]), TypeError, "q must be float32"),
        (lambda: (randn((2, 4, 3, 8)), randn((2, 2, 5, 8)), *_planes(3, 2, 3, 8), [2, 1, 1]), ValueError,
         "k must match q in seq"),
        (lambda: (*_qk(), torch.randn(3, 2, 3, 8, device="meta"), torch.randn(3, 2, 3, 8, device="meta"), [2, 1, 1]),
         RuntimeError, "cos must be on the device of q"),
    ],
)
def test_bad_input_raises_clear_error(make, error, match):
    with pytest.raises(error, match=match):
        npu_liger.qwen2vl_mrope(*make())
