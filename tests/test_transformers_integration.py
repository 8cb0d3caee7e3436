"""npu_liger.transformers: tiny HF models of every supported family, built from configs with random weights,
give the same logits, loss and parameter gradients patched as unpatched, really run the npu_liger ops
(observed at the dispatcher), compile with fullgraph=True, and patch/unpatch harmlessly.

Tolerances: fp32 relative error <= 1e-5 (the fused kernels compute in fp32 and round once; the models are a
few layers deep). bf16: the reference ("truth") is the fp32 model with the same bf16-rounded weights. Each
tensor's error against it may be at most 2x what the unpatched bf16 model gets, the rule of
checklist.assert_close, with two adjustments for whole models: the eager error of one tensor is a noisy
estimate (a gradient can come out nearly exact by luck), so it is floored at the eager model's median error
over all its tensors (and one unit roundoff); and on CPU the Triton interpreter truncates fp32 -> bf16 on store
instead of rounding, which doubles each kernel's rounding error and biases it (reductions over it, e.g. the
q_norm/k_norm weight gradients behind rope, do not average it out): the factor 2 becomes 4 there
(UNIT_ROUNDOFF[bf16] is 2^-7 on CPU vs 2^-8 compiled). A wrong kernel is off by O(1), far outside either.
"""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys

import pytest
import torch

from checklist import CountOps, DEVICE, FP32_RTOL, UNIT_ROUNDOFF, rel_error

transformers = pytest.importorskip("transformers")
import npu_liger.npu_ops.embedding as embedding_kernels  # noqa: E402
import npu_liger.transformers as nlt  # noqa: E402

VOCAB, BATCH, SEQ = 128, 2, 6  # small: the CPU interpreter runs rope one (batch, seq) row per program
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _qwen2_vl():
    text = {k: v for k, v in COMMON.items() if k != "head_dim"}  # Qwen2-VL derives head_dim = hidden / heads
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    vision = dict(depth=1, embed_dim=16, num_heads=2, hidden_size=32, mlp_ratio=2)
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, bos_token_id=1, eos_token_id=2)
    return transformers.Qwen2VLForConditionalGeneration(config)


def _qwen2_vl_rope_op():
    """transformers 5.x merges the M-RoPE sections in the rotary module and calls the plain
    apply_rotary_pos_emb (-> rope); 4.x calls apply_multimodal_rotary_pos_emb (-> qwen2vl_mrope)."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    source = inspect.getsource(modeling_qwen2_vl.Qwen2VLAttention.forward)
    return "qwen2vl_mrope" if "apply_multimodal_rotary_pos_emb" in source else "rope"


def _qwen2_5_vl():
    text = {k: v for k, v in COMMON.items() if k != "head_dim"}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  fullatt_block_indexes=[0])
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, bos_token_id=1, eos_token_id=2)
    return transformers.Qwen2_5_VLForConditionalGeneration(config)


def _qwen3_vl():  # interleaved M-RoPE sections
    text = dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                         "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  deepstack_visual_indexes=[0])
    config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, bos_token_id=1, eos_token_id=2)
    return transformers.Qwen3VLForConditionalGeneration(config)


# family -> (builder, the npu_liger forward ops its patched model must run)
FAMILIES = {
    "llama": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)),
              ("swiglu", "rope", "rms_norm")),
    "mistral": (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON)),
                ("swiglu", "rope", "rms_norm")),
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)),
              ("swiglu", "rope", "rms_norm")),
    "qwen3": (lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON)),
              ("swiglu", "rope", "rms_norm")),
    "gemma": (lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**COMMON)),
              ("geglu", "rope", "rms_norm")),
    "gemma2": (lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**COMMON, sliding_window=4)),
               ("geglu", "rope", "rms_norm")),
    "gemma3": (lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**COMMON, sliding_window=4)),
               ("geglu", "rope", "rms_norm")),
    "qwen2_vl": (_qwen2_vl, ("swiglu", _qwen2_vl_rope_op(), "rms_norm")),
    **({"qwen2_5_vl": (_qwen2_5_vl, ("swiglu", "rope", "rms_norm")),
        "qwen3_vl": (_qwen3_vl, ("swiglu", "rope", "rms_norm"))}
       if hasattr(transformers, "Qwen3VLConfig") else {}),  # 5.x only
    "llama4": (lambda: transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(
        **COMMON, intermediate_size_mlp=48, num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2)),
        ("swiglu", "llama4_rope", "rms_norm")),
}
# RMSNorm modules a text forward runs per family: 2 per layer + the final norm, plus q_norm/k_norm (Qwen3,
# Gemma3) and the pre/post-feedforward norms (Gemma2/3: 4 per layer).
NORMS_PER_LAYER = {"qwen3": 4, "gemma2": 4, "gemma3": 6}




def _require_ops(ops):
    missing = [op for op in ops if not hasattr(torch.ops.npu_liger, op)]
    if missing:
        pytest.skip(f"npu_liger op(s) not available yet: {', '.join(missing)}")


@pytest.fixture(autouse=True)
def _clean_patches():
    nlt.revert()
    yield
    nlt.revert()


def _build(family, dtype=torch.float32):
    torch.manual_seed(0)
    model = FAMILIES[family][0]().to(DEVICE, dtype)
    model.train()  # dropout is 0 in these configs; train() keeps MoE/attention in their training paths
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g).to(DEVICE)
    return ids


def _run(model, ids):
    """Logits, loss and every parameter's gradient of one forward/backward (gradients reset first)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    logits = None if out.logits is None else out.logits.detach().clone()  # None: the loss patch skips them
    return {"logits": logits, "loss": out.loss.detach().clone(), **grads}


def _assert_matches(got, ref, truth=None, what=""):
    """fp32: ``got`` vs ``ref`` within FP32_RTOL. bf16: ``got`` and ``ref`` (the unpatched bf16 model) are both
    judged against the fp32 ``truth`` (see the module docstring for the rule)."""
    assert got.keys() == ref.keys()
    for name in ref:
        if ref[name] is None:
            assert got[name] is None, f"{what}{name}: gradient appeared"
            continue
        assert got[name] is not None, f"{what}{name}: gradient missing"
        assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape, name
        if truth is None:
            err = rel_error(got[name], ref[name])
            assert err <= FP32_RTOL, f"{what}{name}: relative error {err:.2e} > {FP32_RTOL:.0e}"
    if truth is None:
        return
    eager_errors = {name: rel_error(ref[name], truth[name]) for name in ref if ref[name] is not None}
    typical = sorted(eager_errors.values())[len(eager_errors) // 2]
    factor = 2.0 * UNIT_ROUNDOFF[torch.bfloat16] / 2.0**-8  # 4 with the interpreter's truncation, else 2
    for name, eager_err in eager_errors.items():
        err = rel_error(got[name], truth[name])
        tol = factor * max(eager_err, typical, UNIT_ROUNDOFF[torch.bfloat16])
        assert err <= tol, f"{what}{name}: bf16 error {err:.2e} > {tol:.2e} (eager bf16 error {eager_err:.2e})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_matches_unpatched(family, dtype):
    ops = FAMILIES[family][1]
    _require_ops(ops)
    ids = _batch()
    model = _build(family, dtype)
    ref = _run(model, ids)  # before any patch: patching rope is module-wide
    truth = None
    if dtype == torch.bfloat16:  # the same bf16-rounded weights, computed in fp32
        truth = {k: None if v is None else v.float() for k, v in _run(copy.deepcopy(model).float(), ids).items()}

    assert nlt.apply_to_model(model, loss=False) is model  # logits compared too (the loss patch: below)
    with CountOps() as counter:
        got = _run(model, ids)
    _assert_matches(got, ref, truth)
    n_layers = COMMON["num_hidden_layers"]
    for op in ops:  # every layer's MLP (llama4: the dense MLP and the MoE's shared expert + experts) and rope
        assert counter.counts.get(op, 0) >= n_layers, f"{op} ran {counter.counts.get(op, 0)} times: {counter.counts}"
        assert counter.counts.get(f"{op}_backward", 0) >= n_layers, f"{op}_backward: {counter.counts}"

    nlt.apply_to_model(model, loss=False)  # a second patch changes nothing
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, got["logits"])
    nlt.unpatch(model)  # and unpatching gives back transformers' computation exactly
    with CountOps() as counter:
        again = _run(model, ids)
    assert counter.counts == {}
    for name in ref:
        assert (again[name] is None and ref[name] is None) or torch.equal(again[name], ref[name]), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_before_building(family):
    """apply_npu_liger_to_<family>() patches models built afterwards (forward checked here; the gradients of the
    same patched modules are checked above); calling it twice is harmless; revert(family) undoes it."""
    ops = FAMILIES[family][1]
    _require_ops(ops)
    ids = _batch()
    with torch.no_grad():
        ref = _build(family)(input_ids=ids).logits
    getattr(nlt, f"apply_npu_liger_to_{family}")()
    getattr(nlt, f"apply_npu_liger_to_{family}")()
    model = _build(family)
    summary = nlt.patch_summary(model)
    assert summary["mlp"] and summary["rope"], summary
    with CountOps() as counter, torch.no_grad():
        logits = model(input_ids=ids).logits
    assert rel_error(logits, ref) <= FP32_RTOL
    assert set(ops) <= set(counter.counts), counter.counts
    assert summary["norm"]["rms_norm"] >= NORMS_PER_LAYER.get(family, 2) * COMMON["num_hidden_layers"] + 1, summary
    nlt.revert(family)
    assert nlt.patch_summary(_build(family)) == {"mlp": {}, "rope": [], "embedding": 0, "norm": {}, "loss": 0}


@pytest.mark.parametrize("family", ["llama", "gemma"])  # swiglu + rope, geglu + rope (compiling is slow on CPU)
def test_compiled_patched_model(family):
    _require_ops(FAMILIES[family][1])
    import torch._dynamo

    ids = _batch()
    model = nlt.apply_to_model(_build(family))
    eager = _run(model, ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    _run(compiled, ids)  # compile
    with nlt.count_npu_liger_ops(compiled=True) as ops:  # profiler records: they see Inductor's calls too
        got = _run(compiled, ids)
    for op in FAMILIES[family][1]:
        assert ops[f"npu_liger::{op}"] >= COMMON["num_hidden_layers"], ops
        assert ops[f"npu_liger::{op}_backward"] >= COMMON["num_hidden_layers"], ops
    # embedding="compiled", the default: ours inside the graph (Inductor's own embedding backward holds fp32)
    assert ops["npu_liger::embedding"] >= 1 and ops["npu_liger::embedding_backward"] >= 1, ops
    got = {k.replace("_orig_mod.", ""): v for k, v in got.items()}
    _assert_matches(got, eager, what="compiled ")


def test_unsupported_activation_is_left_alone():
    _require_ops(("rope",))
    config = transformers.LlamaConfig(**{**COMMON, "num_hidden_layers": 1}, hidden_act="gelu")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEVICE)
    with pytest.warns(UserWarning, match="activation 'gelu'"):
        nlt.apply_to_model(model)
    assert nlt.patch_summary(model)["mlp"] == {}
    assert nlt.patch_summary(model)["rope"] == ["llama.apply_rotary_pos_emb"]


def test_embedding_patch():
    _require_ops(("embedding",))
    for family in ("llama", "gemma"):  # nn.Embedding and Gemma's scaled embedding
        ids = _batch()
        model = _build(family)
        ref = _run(model, ids)
        nlt.apply_to_model(model, rope=False, mlp=False, embedding=True, loss=False)
        assert nlt.patch_summary(model)["embedding"] == 1
        with CountOps() as counter:
            got = _run(model, ids)
        assert counter.counts.get("embedding") == 1, counter.counts
        _assert_matches(got, ref, what=f"{family} ")


def test_embedding_default_is_torch_in_eager_mode():
    """``embedding="compiled"`` (the default) patches the table, but eager calls keep torch's lookup."""
    model = _build("gemma")  # Gemma's scaled embedding: the unpatched forward must keep its scale
    ids = _batch()
    ref = _run(model, ids)
    nlt.apply_to_model(model, rope=False, mlp=False, loss=False)
    assert nlt.patch_summary(model)["embedding"] == 1
    with CountOps() as counter:
        got = _run(model, ids)
    assert "embedding" not in counter.counts, counter.counts
    _assert_matches(got, ref, what="gemma ")
    with pytest.raises(ValueError, match="embedding= must be True, False or 'compiled'"):
        nlt.apply_to_model(_build("llama"), embedding="always")


# ---- the drop-in functions against transformers' own ------------------------------------------------------


def _qk(layout_dim, heads=(4, 2), hd=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    shape = lambda h: (BATCH, h, SEQ, hd) if layout_dim == 1 else (BATCH, SEQ, h, hd)  # noqa: E731
    return [torch.randn(shape(h), generator=g, dtype=torch.float32).to(DEVICE, dtype).requires_grad_()
            for h in heads]


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_apply_rotary_pos_emb_dropin(unsqueeze_dim):
    _require_ops(("rope",))
    from transformers.models.llama import modeling_llama

    q, k = _qk(unsqueeze_dim)
    rotary = modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(**COMMON)).to(DEVICE)
    cos, sin = rotary(q, torch.arange(SEQ, device=DEVICE).expand(BATCH, SEQ))
    ref = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    ref_grads = torch.autograd.grad(sum(t.square().sum() for t in ref), (q, k))
    with CountOps() as counter:
        got = nlt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        grads = torch.autograd.grad(sum(t.square().sum() for t in got), (q, k))
    assert counter.counts.get("rope") == 1 and counter.counts.get("rope_backward") == 1, counter.counts
    positional = nlt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)  # 5.x: unsqueeze_dim 5th positional
    for a, b in zip((*got, *grads, *positional), (*ref, *ref_grads, *ref), strict=True):
        assert a.shape == b.shape and rel_error(a, b) <= FP32_RTOL


def test_apply_multimodal_rotary_pos_emb_dropin():
    _require_ops(("qwen2vl_mrope",))
    section, hd = [1, 1, 2], 8
    q, k = _qk(1, hd=hd)
    g = torch.Generator().manual_seed(3)
    freqs = torch.rand(3, BATCH, SEQ, hd // 2, generator=g).to(DEVICE) * 6
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    # transformers 4.x Qwen2-VL: section i of each half of the table comes from table[i % 3]
    merge = lambda t: torch.cat([m[i % 3] for i, m in enumerate(t.split(section * 2, dim=-1))], -1)  # noqa: E731
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rope

    ref = hf_rope(q, k, merge(cos), merge(sin))
    with CountOps() as counter:
        got = nlt.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    assert counter.counts.get("qwen2vl_mrope") == 1, counter.counts
    for a, b in zip(got, ref, strict=True):
        assert rel_error(a, b) <= FP32_RTOL


def test_llama4_apply_rotary_emb_dropin():
    _require_ops(("llama4_rope",))
    from transformers.models.llama4 import modeling_llama4

    q, k = _qk(2)
    g = torch.Generator().manual_seed(4)
    angles = torch.rand(BATCH, SEQ, 4, generator=g).to(DEVICE) * 6
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    ref = modeling_llama4.apply_rotary_emb(q, k, freqs_cis)
    with CountOps() as counter:
        got = nlt.apply_rotary_emb(q, k, freqs_cis)
    assert counter.counts.get("llama4_rope") == 1, counter.counts
    for a, b in zip(got, ref, strict=True):
        assert rel_error(a, b) <= FP32_RTOL


@pytest.mark.parametrize("family", ["llama", "llama4"])
def test_rope_patch_leaves_float64_models_to_transformers(family):
    """The rope patch is module-wide, so it reaches a float64 model of the family, whose dtypes the rope ops refuse:
    the drop-ins compute it as transformers does (chosen from dtypes alone), with the same logits, loss and
    gradients, and no rope op runs."""
    op = FAMILIES[family][1][1]
    _require_ops((op,))
    ids = _batch()
    fp64 = _build(family, torch.float64)
    ref = _run(fp64, ids)
    nlt.apply_to_model(_build(family))  # another model of the family
    assert nlt.patch_summary(fp64)["rope"], "the rope patch did not reach the float64 model"
    with CountOps() as counter:
        got = _run(fp64, ids)
    assert op not in counter.counts, counter.counts
    for name, value in ref.items():
        assert (value is None) == (got[name] is None), name
        assert value is None or (got[name].dtype == value.dtype and torch.equal(got[name], value)), name
    assert ref["logits"].dtype == torch.float64


def test_rope_dropins_leave_unsupported_dtypes_to_transformers():
    """float64 q/k: the ops refuse them; each drop-in gives transformers' result (the same computation)."""
    from transformers.models.llama import modeling_llama
    from transformers.models.llama4 import modeling_llama4

    q, k = (t.detach().double() for t in _qk(1))
    g = torch.Generator().manual_seed(5)
    angles = (torch.rand(BATCH, SEQ, 4, generator=g, dtype=torch.float64) * 6).to(DEVICE)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    for got, ref in ((nlt.apply_rotary_pos_emb(q, k, cos, sin), modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)),
                     (nlt.apply_multimodal_rotary_pos_emb(q, k, cos.expand(3, -1, -1, -1), sin.expand(3, -1, -1, -1),
                                                          [1, 1, 2]),
                      modeling_llama.apply_rotary_pos_emb(q, k, cos, sin))):
        for a, b in zip(got, ref, strict=True):
            assert a.dtype == torch.float64 and torch.equal(a, b)
    q, k = (t.detach().double() for t in _qk(2))
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # complex128
    for a, b in zip(nlt.apply_rotary_emb(q, k, freqs_cis), modeling_llama4.apply_rotary_emb(q, k, freqs_cis),
                    strict=True):
        assert a.dtype == torch.float64 and torch.equal(a, b)


def test_imports_without_transformers():
    """transformers is the optional `hf` extra: the subpackage imports without it and says so when used."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import npu_liger.transformers as nlt\n"
        "try:\n    nlt.apply_npu_liger_to_llama()\nexcept ImportError:\n    print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


# ---- norms ------------------------------------------------------------------------------------------------


def test_norm_flag_and_every_rms_norm_patched():
    """Every RMSNorm instance (Qwen3's q_norm/k_norm included) runs rms_norm; norm=False leaves them alone."""
    model = _build("qwen3")
    n_norms = sum(type(m).__name__ == "Qwen3RMSNorm" for m in model.modules())
    assert n_norms == 4 * COMMON["num_hidden_layers"] + 1
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    assert nlt.patch_summary(model)["norm"] == {}
    nlt.apply_to_model(model, rope=False, mlp=False)
    assert nlt.patch_summary(model)["norm"] == {"rms_norm": n_norms}
    with CountOps() as counter, torch.no_grad():
        model(input_ids=_batch())
    assert counter.counts == {"rms_norm": n_norms}, counter.counts


# Llama-4's weightless qk norm: Llama4TextL2Norm up to transformers 5.24, Llama4TextWeightlessRMSNorm from 5.25
LLAMA4_QK_NORMS = ("Llama4TextL2Norm", "Llama4TextWeightlessRMSNorm")


def test_llama4_weightless_qk_norm_is_patched():
    """Llama-4's qk norm has no weight: rms_norm without one, the same output and gradient."""
    model = _build("llama4")
    qk_norms = [m for m in model.modules() if type(m).__name__ in LLAMA4_QK_NORMS]
    assert qk_norms, "the test model has no qk norm (use_qk_norm)"
    norm = qk_norms[0]
    x = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(6)).to(DEVICE).requires_grad_(True)

    def run():
        x.grad = None
        out = norm(x)
        (out * torch.linspace(-1, 2, out.numel(), device=DEVICE).view(out.shape)).sum().backward()
        return {"out": out.detach().clone(), "x": x.grad.clone()}

    ref = run()
    nlt.apply_to_model(model, rope=False, mlp=False)
    norms = nlt.patch_summary(model)["norm"]["rms_norm"]
    assert norms == sum(type(m).__name__ in ("Llama4TextRMSNorm", *LLAMA4_QK_NORMS) for m in model.modules())
    with CountOps() as counter:
        got = run()
    assert counter.counts == {"rms_norm": 1, "rms_norm_backward": 1}, counter.counts
    _assert_matches(got, ref)


def test_vision_layer_norms_are_patched():
    """Qwen2-VL's vision tower uses torch.nn.LayerNorm: patched to layer_norm, same output and gradients."""
    model = _build("qwen2_vl")
    block = model.model.visual.blocks[0]
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-trivial affine parameters (they start at 1 and 0)
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(DEVICE))
    x = torch.randn(5, block.norm1.normalized_shape[0], generator=g).to(DEVICE).requires_grad_(True)
    weights = torch.randn(5, block.norm1.normalized_shape[0], generator=g).to(DEVICE)

    def run():
        x.grad = None
        block.zero_grad(set_to_none=True)
        out = block.norm2(block.norm1(x).sin() + 0.25)
        (out * weights).sum().backward()
        return {"out": out.detach().clone(), "x": x.grad.clone(),
                **{n: p.grad.clone() for n, p in block.named_parameters() if p.grad is not None}}

    ref = run()
    nlt.apply_to_model(model, rope=False, mlp=False)
    assert nlt.patch_summary(model)["norm"].get("layer_norm", 0) >= 3  # norm1, norm2 per block, the merger's ln_q
    with CountOps() as counter:
        got = run()
    assert counter.counts == {"layer_norm": 2, "layer_norm_backward": 2}, counter.counts
    _assert_matches(got, ref)


def test_changed_norm_source_is_left_alone(monkeypatch):
    from transformers.models.llama import modeling_llama

    import npu_liger.transformers.norms as norms

    def forward(self, hidden_states):  # a different computation under the same class name
        return self.weight * hidden_states

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)
    norms._source.cache_clear()
    try:
        model = _build("llama")
        with pytest.warns(UserWarning, match="LlamaRMSNorm.forward is not the computation"):
            nlt.apply_to_model(model, rope=False, mlp=False)
        assert nlt.patch_summary(model)["norm"] == {}
    finally:
        norms._source.cache_clear()


# ---------------------------------------------------------------------------------------------------------------
# The training loss through fused linear cross entropy (npu_liger/transformers/loss.py)

def _labels(ids):
    labels = ids.clone()
    labels[0, :2] = -100  # ignored tokens, as a chat template's prompt masking gives
    labels[1, -1] = -100
    return labels


def _run_loss(model, ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    return out, {"loss": out.loss.detach().clone(), **grads}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loss_patch_matches_unpatched_loss_and_gradients(family):
    """Training with labels (some -100): the loss and every parameter gradient equal the unpatched model's
    (Gemma-2/3: final logit softcapping), fused_linear_cross_entropy ran, and no logits were built. With
    num_items_in_batch (HF Trainer's gradient accumulation) too. Eval mode and calls without labels return
    exactly what transformers returns."""
    _require_ops(("fused_linear_cross_entropy",))
    ids = _batch()
    labels = _labels(ids)
    model = _build(family)
    ref_out, ref = _run_loss(model, ids, labels)
    _, ref_items = _run_loss(model, ids, labels, num_items_in_batch=torch.tensor(7, device=DEVICE))
    model.eval()
    with torch.no_grad():
        ref_eval = model(input_ids=ids, labels=labels)
    model.train()

    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    assert nlt.patch_summary(model)["loss"] == 1
    with CountOps() as counter:
        out, got = _run_loss(model, ids, labels)
    assert counter.counts.get("fused_linear_cross_entropy_with_grad") == 1, counter.counts
    assert out.logits is None and type(out) is type(ref_out)
    _assert_matches(got, ref, what="loss patch: ")
    _, got_items = _run_loss(model, ids, labels, num_items_in_batch=torch.tensor(7, device=DEVICE))
    _assert_matches(got_items, ref_items, what="num_items_in_batch: ")
    out, _ = _run_loss(model, ids, labels, skip_logits=False)  # logits asked for: transformers' own forward
    assert torch.equal(out.logits, ref_out.logits.detach())

    model.eval()
    with CountOps() as counter, torch.no_grad():
        got_eval = model(input_ids=ids, labels=labels)
    assert counter.counts == {}
    assert torch.equal(got_eval.logits, ref_eval.logits) and torch.equal(got_eval.loss, ref_eval.loss)
    model.train()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref_out.logits)
    nlt.unpatch(model)
    assert nlt.patch_summary(model)["loss"] == 0


def test_loss_patch_before_building_and_flag_off():
    _require_ops(("fused_linear_cross_entropy",))
    nlt.apply_npu_liger_to_llama(rope=False, mlp=False, norm=False)
    assert nlt.patch_summary(_build("llama"))["loss"] == 1
    nlt.apply_npu_liger_to_llama(rope=False, mlp=False, norm=False, loss=False)
    assert nlt.patch_summary(_build("llama"))["loss"] == 0
    nlt.apply_npu_liger_to_llama(rope=False, mlp=False, norm=False)
    nlt.revert("llama")
    assert nlt.patch_summary(_build("llama"))["loss"] == 0
    model = nlt.apply_to_model(_build("llama"), loss=False)
    assert nlt.patch_summary(model)["loss"] == 0


def test_loss_patch_leaves_an_unknown_forward_alone():
    _require_ops(("fused_linear_cross_entropy",))

    class Custom(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, labels=None, **kwargs):  # not the computation the patch knows
            return super().forward(input_ids=input_ids, labels=labels, **kwargs)

    Custom.__module__ = transformers.LlamaForCausalLM.__module__
    Custom.__name__ = "LlamaForCausalLM"
    torch.manual_seed(0)
    model = Custom(transformers.LlamaConfig(**COMMON)).to(DEVICE)
    with pytest.warns(UserWarning, match="loss is left unpatched"):
        nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    assert nlt.patch_summary(model)["loss"] == 0


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")  # 5.x's new name
@pytest.mark.parametrize("family", ["llama", "llama4"])  # the rope and llama4_rope ops (their shared backward)
def test_gradient_checkpointing(family):
    """``gradient_checkpointing_enable()`` (non-reentrant in transformers 5): the checkpoint unpacks each saved
    tensor once, so every backward formula must read ``ctx.saved_tensors`` once. Every patch on; the loss and
    every gradient equal the unpatched checkpointed model's."""
    _require_ops(FAMILIES[family][1] + ("fused_linear_cross_entropy",))
    ids = _batch()
    labels = _labels(ids)
    model = _build(family)
    model.gradient_checkpointing_enable()
    _, ref = _run_loss(model, ids, labels)  # before any patch: patching rope is module-wide
    nlt.apply_to_model(model)
    _, got = _run_loss(model, ids, labels)  # plain eager: the backward formulas launch the kernels directly
    _assert_matches(got, ref, what="gradient checkpointing: ")
    with CountOps() as counter:  # under a dispatch mode: through the backward ops
        _, got = _run_loss(model, ids, labels)
    for op in FAMILIES[family][1]:
        assert counter.counts.get(f"{op}_backward", 0) >= COMMON["num_hidden_layers"], counter.counts
    _assert_matches(got, ref, what="gradient checkpointing, dispatch mode: ")


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs: CUDA only")
@pytest.mark.parametrize("launches", ["auto", "0"], ids=["inductor_launches", "opaque"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
def test_cuda_graph_training_follows_eager(family, launches, set_inductor_launches, monkeypatch):
    """Training under torch.compile(mode="reduce-overhead") takes the eager model's steps: a new batch every step
    and the optimizer's in-place updates, so a kernel that a replayed graph left out (its output kept from the
    recording) shows as a wrong loss or parameter. Rounds seventeen to nineteen of BENCHMARKS.md timed such steps:
    they ran below the kernels' own time and trained to NaN. Our ops launched from Inductor's code (the default
    under CUDA graphs) and opaque (NPU_LIGER_INDUCTOR_LAUNCHES=0) both. (Opaque, the embedding's first call kept
    its index flag in the graph's memory pool, which torch refused, until the flag was allocated outside it.)"""
    _require_ops(FAMILIES[family][1])
    set_inductor_launches(launches)
    # the embedding's kept index flag is made afresh by the first call, here inside the CUDA-graph warm-up
    monkeypatch.setattr(embedding_kernels, "_INDEX_FLAGS", {})
    model = nlt.apply_to_model(_build(family))
    reference = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    # SGD: an update proportional to the gradient keeps rounding differences at rounding size (Adam's m / sqrt(v)
    # would turn a near-zero gradient's rounding into a whole step)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    g = torch.Generator().manual_seed(2)
    for step in range(6):  # warm-up, recording, then replays
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g).to(DEVICE)
        losses = []
        for run, opt in zip((compiled, reference), optimizers, strict=True):
            torch.compiler.cudagraph_mark_step_begin()
            loss = run(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
        got, want = losses
        assert torch.isfinite(got), f"step {step}: loss {got.item()} (eager {want.item()})"
        assert rel_error(got, want) <= 1e-4, f"step {step}: loss {got.item()} against eager {want.item()}"
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert rel_error(p, q) <= 1e-4, f"{name} after 6 steps: relative error {rel_error(p, q):.2e}"
