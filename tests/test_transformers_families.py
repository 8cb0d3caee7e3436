"""npu_liger.transformers on the families added by the family table's second part (and a family it does not know):
a tiny random model (1 layer, hidden 32, vocab 96) of each gives the same logits, loss and every parameter gradient
patched as unpatched (fp32, FP32_RTOL: the kernels compute in fp32 and round once), the ops the table promises run
(counted at the dispatcher), and what is left to transformers is in the patch report. Families the installed
transformers lacks are skipped. Vision-language families (``VL_CASES``) are built with a one-layer vision tower and
run on text-only input: their language model's patches are checked, and ``patch_summary`` against the table."""

from __future__ import annotations

import pytest
import torch

from checklist import DEVICE, FP32_RTOL, CountOps, rel_error

transformers = pytest.importorskip("transformers")
import npu_liger.transformers as nlt  # noqa: E402

VOCAB, BATCH, SEQ = 96, 2, 5
BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.2, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)
DENSE = ("rms_norm", "swiglu", "rope")
MOE = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
# a gradient whose reference is below this is rounding noise (DeepSeek-V4's router gate: ~3e-9 with loss ~4.6);
# it is compared absolutely, since a relative error of noise means nothing
NOISE = 1e-7

# family -> (config class, causal LM class, extra config, forward ops that must run, loss patched)
CASES = {
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}, DENSE, False),  # logits_scaling: loss left
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}, DENSE, True),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {}, DENSE, True),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", {}, DENSE, True),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {"partial_rotary_factor": 0.5}, ("rope",), True),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.5}, DENSE, True),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}, DENSE, True),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {}, DENSE, True),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {}, ("rms_norm", "swiglu"), True),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {}, DENSE, True),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {}, DENSE, True),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {"residual_dropout": 0.0, "attention_dropout": 0.0},
                 ("rms_norm", "rope"), True),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {"hidden_activation": "gelu_pytorch_tanh"}, ("geglu",),
               True),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(rope_interleave=False, head_dim=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
                         qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, first_k_dense_replace=0, n_group=1, topk_group=1),
                    ("rms_norm", "swiglu", "rope", "fused_moe_with_saved"), True),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {"layer_types": ["full_attention"]}, DENSE, True),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(layer_types=["full_attention"], **MOE, shared_expert_intermediate_size=16),
                   (*DENSE, "fused_moe_with_saved"), True),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", MOE, ("rms_norm", "rope", "fused_moe_with_saved"),
                   False),  # logits_scaling: loss left
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", MOE, ("layer_norm", "rope", "fused_moe_with_saved"), True),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
                      dict(head_dim=4, rope_interleave=False, n_routed_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=16, first_k_dense_replace=0, n_group=1, topk_group=1,
                           q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
                           mlp_layer_types=["sparse"]),  # 5.24 builds its MoE layers from mlp_layer_types only
                      (*DENSE, "fused_moe_with_saved"), True),
    # text part of the VL model; MllamaForCausalLM's loss is left (its logits upcast: families.MLLAMA_LOSS)
    "mllama": ("MllamaTextConfig", "MllamaForCausalLM", {"cross_attention_layers": []}, DENSE, False),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  dict(mamba_d_ssm=16, mamba_n_heads=4, mamba_d_head=4, mamba_d_state=8, mamba_n_groups=1,
                       mamba_chunk_size=4), ("rms_norm", "rope"), False),  # multipliers: loss left
    "deepseek_v4": ("DeepseekV4Config", "DeepseekV4ForCausalLM", MOE, ("rms_norm",), False),
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM",
                dict(hidden_activation="gelu_pytorch_tanh", num_kv_shared_layers=0, laurel_rank=4, altup_num_inputs=2,
                     hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, layer_types=["full_attention"],
                     activation_sparsity_pattern=[0.0], intermediate_size=[48]), (), True),
}


def _build(family):
    config_name, lm_name, extra, *_ = CASES[family]
    if family not in nlt.FAMILIES or not nlt.FAMILIES[family].available() or not hasattr(transformers, lm_name):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    torch.manual_seed(0)
    model = getattr(transformers, lm_name)(getattr(transformers, config_name)(**{**BASE, **extra}))
    return model.to(DEVICE).train()


@pytest.fixture(autouse=True)
def _clean():
    nlt.revert()
    yield
    nlt.revert()


def _run(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    logits = None if out.logits is None else out.logits.detach().clone()
    return {"logits": logits, "loss": out.loss.detach().clone(), **grads}


def _assert_close(got, ref, what):
    for name, value in ref.items():
        if value is None:
            assert got[name] is None, f"{what} {name}: gradient appeared"
            continue
        if value.abs().max() <= NOISE:
            assert (got[name] - value).abs().max() <= NOISE, f"{what} {name}: beyond rounding noise"
            continue
        err = rel_error(got[name], value)
        assert err <= FP32_RTOL, f"{what} {name}: relative error {err:.2e}"


@pytest.mark.parametrize("family", list(CASES))
def test_family_matches_unpatched(family):
    ops, loss = CASES[family][3], CASES[family][4]
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _check_family(family, _build(family), ids, ops, loss)


def _check_family(family, model, ids, ops, loss):
    """Logits, loss and every gradient of ``model`` patched (loss=False) equal the unpatched run and ``ops`` ran;
    the table's reasons are in the report; then the loss patch alone (fused loss iff ``loss``) gives the same loss
    and gradients."""
    ref = _run(model, ids)  # before any patch: the rope patch is module-wide
    nlt.apply_to_model(model, loss=False)  # logits compared too
    with CountOps() as counter:
        got = _run(model, ids)
    _assert_close(got, ref, family)
    for op in ops:
        assert counter.counts.get(op, 0) >= 1, f"{family}: {op} did not run: {counter.counts}"
    report = nlt.patch_report(model)
    assert report is not None and family in report.families, report
    for piece, _why in nlt.FAMILIES[family].left:  # every reason of the table is in the report
        assert any(_why in reason for reason in report.left.get(piece, {}).values()) or piece in ("norm", "mlp",
                                                                                                "experts", "loss")
    nlt.unpatch(model)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)  # the loss patch alone
    with CountOps() as counter:
        got = _run(model, ids)
    assert (counter.counts.get("fused_linear_cross_entropy_with_grad", 0) == 1) == loss, counter.counts
    if loss:
        assert got["logits"] is None
        del got["logits"]
        _assert_close(got, {k: v for k, v in ref.items() if k != "logits"}, f"{family} loss patch:")
    else:
        assert "GraniteForCausalLM" in nlt.patch_report(model).left["loss"] or family != "granite"
        _assert_close(got, ref, family)


def test_glm4_moe_lite_experts_run_fused_moe():
    """GLM-4-MoE-Lite's experts (transformers 5's 3-D layout, silu) are found by their code and run fused_moe; its
    dense MLP and shared experts run swiglu."""
    model = _build("glm4_moe_lite")
    nlt.apply_to_model(model)
    report = nlt.patch_report(model)
    assert report.is_patched("experts", "Glm4MoeLiteExperts") and "Glm4MoeLiteExperts" not in report.left["experts"]
    summary = nlt.patch_summary(model)
    assert summary["mlp"] == {"fused_moe": 1, "swiglu": 1} and summary["loss"] == 1, summary


def test_mllama_causal_lm_loss_left_with_reason():
    """MllamaForCausalLM upcasts its logits (``.float()`` after lm_head): its loss is left, and the report and the
    warning-free pass say why (the table's reason), not just "not the known form"."""
    import warnings

    model = _build("mllama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the table names it: no "a different transformers version?" warning
        nlt.apply_to_model(model)
    reason = nlt.patch_report(model).left["loss"]["MllamaForCausalLM"]
    assert reason == nlt.FAMILIES["mllama"].left[-1][1] and "lm_head(hidden_states).float()" in reason, reason
    assert nlt.patch_summary(model)["loss"] == 0
    # the reason's second half: MllamaForConditionalGeneration (text-only input) gets the fused loss, same results
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
                  image_size=16, patch_size=8, vision_output_dim=32, max_num_tiles=4, intermediate_layers_indices=[0])
    torch.manual_seed(0)
    config = transformers.MllamaConfig(text_config={**BASE, **CASES["mllama"][2]}, vision_config=vision,
                                       image_token_index=VOCAB - 1)
    model = transformers.MllamaForConditionalGeneration(config).to(DEVICE).train()
    ids = torch.randint(3, VOCAB - 1, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ref = _run(model, ids)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    assert nlt.patch_report(model).is_patched("loss", "MllamaForConditionalGeneration")
    with CountOps() as counter:
        got = _run(model, ids)
    assert counter.counts.get("fused_linear_cross_entropy_with_grad", 0) == 1 and got.pop("logits") is None
    _assert_close(got, {k: v for k, v in ref.items() if k != "logits"}, "MllamaForConditionalGeneration loss")


# Vision-language models whose language model is another family's: a tiny vision tower, text-only input (no pixel
# values; the image token, VOCAB - 1, never occurs). family -> (config class, model class, text config, vision
# config, forward ops, patch_summary's expected mlp ops and rope functions)
VL_TEXT = dict(BASE)
VL_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                 patch_size=8, depth=1, num_heads=2, out_hidden_size=32, head_dim=8)
VL_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0, n_group=1,
              topk_group=1, n_shared_experts=1)
GLM_MROPE = dict(rope_parameters=dict(rope_type="default", mrope_section=[1, 1, 0], partial_rotary_factor=0.5))
VL_CASES = {
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration", dict(VL_TEXT, model_type="mistral"),
                 dict(VL_VISION, model_type="pixtral"), DENSE, {"swiglu": 1},
                 ["mistral.apply_rotary_pos_emb", "pixtral.apply_rotary_pos_emb"]),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", dict(VL_TEXT, model_type="llama"),
              dict(VL_VISION, model_type="clip_vision_model"), DENSE, {"swiglu": 1}, ["llama.apply_rotary_pos_emb"]),
    "internvl": ("InternVLConfig", "InternVLForConditionalGeneration", dict(VL_TEXT, model_type="qwen2"), VL_VISION,
                 DENSE, {"swiglu": 1}, ["qwen2.apply_rotary_pos_emb"]),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration", dict(VL_TEXT, model_type="llama"), VL_VISION,
                DENSE, {"swiglu": 1}, ["llama.apply_rotary_pos_emb"]),
    # rotate_half_llm (interleaved pairs): rope left, with the table's reason
    "glm4v": ("Glm4vConfig", "Glm4vForConditionalGeneration", dict(VL_TEXT, **GLM_MROPE), VL_VISION,
              ("rms_norm", "swiglu"), {"swiglu": 1}, []),
    "glm4v_moe": ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", dict(VL_TEXT, **VL_MOE, **GLM_MROPE),
                  VL_VISION, (*DENSE, "fused_moe_with_saved"), {"swiglu": 1, "fused_moe": 1},
                  ["glm4v_moe.apply_rotary_pos_emb"]),
}


@pytest.mark.parametrize("family", list(VL_CASES))
def test_vl_family_matches_unpatched(family):
    config_name, model_name, text, vision, ops, mlp, rope = VL_CASES[family]
    if family not in nlt.FAMILIES or not nlt.FAMILIES[family].available() or not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(text_config=text, vision_config=vision, image_token_id=VOCAB - 1)
    model = getattr(transformers, model_name)(config).to(DEVICE).train()
    nlt.apply_to_model(model)  # what the table claims is patched
    summary, report = nlt.patch_summary(model), nlt.patch_report(model)
    assert family in report.families and summary["mlp"] == mlp and sorted(summary["rope"]) == sorted(rope), summary
    assert summary["norm"].get("rms_norm", 0) >= 3 and summary["loss"] == 1, summary
    assert report.is_patched("loss", model_name), report
    for piece, why in nlt.FAMILIES[family].left:
        assert why in report.left[piece].values(), report
    nlt.unpatch(model)
    ids = torch.randint(3, VOCAB - 1, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _check_family(family, model, ids, ops, True)


def test_unknown_family_is_patched_by_structure(monkeypatch):
    """A family the table does not know (here: Llama's classes under other names, in a module the table does not
    name) gets the structural patches, with the same results, and a report of what was patched."""
    import types

    from transformers.models.llama import modeling_llama

    from npu_liger.transformers import _patching

    module = types.ModuleType("transformers.models.mystery.modeling_mystery")
    for name in ("rotate_half", "apply_rotary_pos_emb"):
        function = getattr(modeling_llama, name)
        if _patching.is_hub_function(function):  # kernels installed (transformers >= 5.25): a Func module
            function = _patching.wrapped_function(function)
        setattr(module, name, types.FunctionType(function.__code__, vars(module), name, function.__defaults__))
    monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    model = _build("ministral").__class__  # any Llama-like; below, Llama with renamed classes
    del model
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE)).to(DEVICE).train()
    renamed = {}
    for sub in llama.modules():
        cls = type(sub)
        if cls.__module__ == modeling_llama.__name__:
            if cls not in renamed:
                renamed[cls] = type("Mystery" + cls.__name__[5:], (cls,), {"__module__": module.__name__})
            sub.__class__ = renamed[cls]
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ref = _run(llama, ids)
    nlt.apply_to_model(llama, loss=False)
    report = nlt.patch_report(llama)
    assert report.families == [], report
    assert report.patched["norm"] and report.patched["mlp"], report
    with CountOps() as counter:
        got = _run(llama, ids)
    _assert_close(got, ref, "structural")
    assert {"rms_norm", "swiglu"} <= set(counter.counts), counter.counts


def test_different_code_is_left_and_reported():
    """A gated MLP whose forward adds anything (Seed-OSS's dropout) and a norm of another formula (Nemotron's
    LayerNorm1P) are not patched, and the report says so."""
    model = _build("nemotron")
    nlt.apply_to_model(model, loss=False)
    report = nlt.patch_report(model)
    assert "NemotronMLP" in report.left["mlp"] and "NemotronLayerNorm1P" in report.left["norm"], report
    assert nlt.patch_summary(model)["mlp"] == {} and nlt.patch_summary(model)["norm"] == {}


def test_recognised_family_with_nothing_patched_says_why():
    """Granite with only the loss patch asked for: the family is recognised but its scaled logits keep the loss
    transformers'; the warning names the family, what was left and why, and what the call turned off (not the
    "no module of a supported family" message)."""
    model = _build("granite")
    with pytest.warns(UserWarning) as caught:
        nlt.apply_to_model(model, rope=False, mlp=False, norm=False, embedding=False)
    message = " ".join(str(w.message) for w in caught)
    assert "no module of a supported family" not in message, message
    assert "family granite" in message and "nothing was patched" in message, message
    assert "GraniteForCausalLM" in message and "logits" in message, message
    assert "turned off by the call: rope, mlp, norm" in message, message


# dense, MoE, VL (its text LM); the MoE's reference is fp32, since its experts' grouped matmul has no float64 (fp32's
# error, ~1e-7, is far below bf16's 4e-3, so it serves as the exact value)
@pytest.mark.parametrize("family,ref_dtype", [("ministral", torch.float64), ("qwen3_next", torch.float32),
                                              ("mllama", torch.float64)])
def test_family_bf16_within_eager_error(family, ref_dtype):
    """bf16: the patched model's logits, loss and gradients are judged against the float64 run of the same
    weights, with the eager (unpatched) bf16 run's own error as the yardstick (checklist.assert_close: no worse
    than twice it). Floor: 4 bf16 roundings, since a whole layer's forward and backward round many times and
    eager's error on a small tensor can be small by luck."""
    import copy

    from checklist import assert_close

    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    model = _build(family)
    ref64 = _run(copy.deepcopy(model).to(ref_dtype), ids)
    eager = _run(copy.deepcopy(model).to(torch.bfloat16), ids)
    model = model.to(torch.bfloat16)
    nlt.apply_to_model(model, loss=False)
    got = _run(model, ids)
    for name, value in ref64.items():
        if value is None or value.abs().max() <= NOISE:
            continue
        # the loss comes back fp32 (HF upcasts the bf16 logits): judged as bf16, one more rounding within the floor
        assert_close(got[name].to(torch.bfloat16), value, eager[name].to(torch.bfloat16),
                     what=f"{family} bf16 {name}", roundings=4)
