"""npu_liger.transformers on the MoE families: tiny random models (2 layers, 4 experts, top-2) give the same logits,
loss and every parameter gradient patched as unpatched (fp32), and every MoE layer's experts really run
``fused_moe`` (counted at the dispatcher, and in the patch summary). Router, shared experts and the rest of each
block stay transformers' own."""

from __future__ import annotations

import pytest
import torch

from checklist import CountOps, DEVICE, FP32_RTOL, rel_error

transformers = pytest.importorskip("transformers")
import npu_liger.transformers as nlt  # noqa: E402
from npu_liger.npu_ops import _grouped_mm  # noqa: E402

VOCAB, BATCH, SEQ, LAYERS = 96, 2, 5, 2
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2)


def _config(name, **kw):
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers has no {name}")
    return cls(**{**BASE, **kw})


def _mixtral():
    return transformers.MixtralForCausalLM(_config("MixtralConfig", intermediate_size=24, num_local_experts=4,
                                                   num_experts_per_tok=2))


def _qwen2_moe():
    return transformers.Qwen2MoeForCausalLM(_config("Qwen2MoeConfig", intermediate_size=48, moe_intermediate_size=24,
                                                    shared_expert_intermediate_size=40, **EXPERTS))


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(_config("Qwen3MoeConfig", intermediate_size=48, moe_intermediate_size=24,
                                                    **EXPERTS))


def _olmoe():
    return transformers.OlmoeForCausalLM(_config("OlmoeConfig", intermediate_size=24, **EXPERTS))


def _glm4_moe():
    return transformers.Glm4MoeForCausalLM(_config(
        "Glm4MoeConfig", intermediate_size=48, moe_intermediate_size=24, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=0, n_group=1, topk_group=1))


def _qwen3_vl_moe():
    if not hasattr(transformers, "Qwen3VLMoeConfig"):
        pytest.skip("transformers has no Qwen3-VL-MoE")
    text = dict(BASE, intermediate_size=48, moe_intermediate_size=24, **EXPERTS,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  deepstack_visual_indexes=[0])
    config = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, bos_token_id=1, eos_token_id=2)
    return transformers.Qwen3VLMoeForConditionalGeneration(config)


def _qwen3_5_moe():
    if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
        pytest.skip("transformers has no Qwen3.5-MoE")
    return transformers.Qwen3_5MoeForCausalLM(_config(
        "Qwen3_5MoeTextConfig", moe_intermediate_size=24, shared_expert_intermediate_size=40, **EXPERTS,
        layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8))


def _hunyuan_moe():
    return transformers.HunYuanMoEV1ForCausalLM(_config("HunYuanMoEV1Config", intermediate_size=24, num_experts=4,
                                                        moe_topk=2))


FAMILIES = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "olmoe": _olmoe,
            "glm4_moe": _glm4_moe, "qwen3_vl_moe": _qwen3_vl_moe, "qwen3_5_moe": _qwen3_5_moe,
            "hunyuan_v1_moe": _hunyuan_moe}




@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setitem(_grouped_mm.MM_TILES, "cpu", _grouped_mm.MMTiles(16, 16, 16))
    nlt.revert()
    yield
    nlt.revert()


def _build(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().to(DEVICE)
    model.train()
    return model


def _run(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    return {"logits": out.logits.detach().clone(), "loss": out.loss.detach().clone(), **grads}


def _ids():
    return torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)).to(DEVICE)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_family_matches_unpatched(family):
    ids = _ids()
    model = _build(family)
    ref = _run(model, ids)
    nlt.apply_to_model(model, loss=False)
    summary = nlt.patch_summary(model)
    assert summary["mlp"].get("fused_moe") == LAYERS, summary
    with CountOps() as counter:
        got = _run(model, ids)
    assert counter.counts.get("fused_moe_with_saved") == LAYERS, counter.counts
    for step in ("fused_moe_backward_down", "fused_moe_backward_gate_up"):
        assert counter.counts.get(step) == LAYERS, counter.counts
    assert got.keys() == ref.keys()
    for name in ref:
        if ref[name] is None:
            assert got[name] is None, name
            continue
        err = rel_error(got[name], ref[name])
        assert err <= FP32_RTOL, f"{family} {name}: relative error {err:.2e}"
    nlt.unpatch(model)
    with CountOps() as counter:
        _run(model, ids)
    assert "fused_moe_with_saved" not in counter.counts


@pytest.mark.parametrize("router_logits", [True, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_causal_lm_loss_matches_unpatched(family, router_logits):
    """The fused loss patch on an MoE causal LM: the cross-entropy through fused_linear_cross_entropy (no logits),
    plus, when the router logits are asked for, the router's load-balancing loss as the original forward adds it
    (the same aux_loss in the output); every parameter gradient as unpatched."""
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # the load-balancing loss weighs tokens by the attention mask
    model = _build(family)

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask, labels=ids, output_router_logits=router_logits)
        out.loss.backward()
        return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    ref, ref_grads = run()
    has_router = getattr(ref, "aux_loss", None) is not None
    assert has_router == (router_logits and hasattr(ref, "aux_loss") and family not in ("glm4_moe", "hunyuan_v1_moe"))
    nlt.apply_to_model(model)
    assert nlt.patch_summary(model)["loss"], nlt.patch_summary(model)
    with CountOps() as counter:
        got, got_grads = run()
    assert got.logits is None and counter.counts.get("fused_linear_cross_entropy_with_grad") == 1, counter.counts
    assert rel_error(got.loss, ref.loss) <= FP32_RTOL
    if has_router:
        assert got.aux_loss is not None and rel_error(got.aux_loss, ref.aux_loss) <= FP32_RTOL
    else:
        assert getattr(got, "aux_loss", None) is None
    assert got_grads.keys() == ref_grads.keys()
    for name in ref_grads:
        err = rel_error(got_grads[name], ref_grads[name])
        assert err <= FP32_RTOL, f"{family} {name}: relative error {err:.2e}"


@pytest.mark.parametrize("router_logits", [True, False, None])
def test_moe_causal_lm_loss_compiles_whole(router_logits):
    """The patched MoE causal LM under ``torch.compile(fullgraph=True)`` of the whole module, as a training step
    compiles it: the router-loss attributes are read with plain getattr (``operator.attrgetter`` broke the graph
    here, which the H200 training step showed as one graph break); the loss equals the eager patched model's."""
    torch._dynamo.reset()
    ids = _ids()
    model = _build("qwen3_moe")
    nlt.apply_to_model(model)
    flag = {} if router_logits is None else {"output_router_logits": router_logits}  # None: the config's default
    want = model(input_ids=ids, labels=ids, **flag).loss
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(input_ids=ids, labels=ids, **flag).loss
    got.backward()
    assert rel_error(got, want) <= FP32_RTOL


@pytest.mark.parametrize("family", ["qwen3_moe"])
def test_patch_before_building(family):
    ids = _ids()
    with torch.no_grad():
        ref = _build(family)(input_ids=ids).logits
    getattr(nlt, f"apply_npu_liger_to_{family}")()
    model = _build(family)
    assert nlt.patch_summary(model)["mlp"]["fused_moe"] == LAYERS
    with torch.no_grad():
        assert rel_error(model(input_ids=ids).logits, ref) <= FP32_RTOL


def test_gpt_oss_experts_are_left_alone():
    """gpt-oss interleaves gate/up columns, transposes its weights, adds biases and clamps its SwiGLU: not the
    layout fused_moe reads, so its experts stay transformers' (and the family is not in the table)."""
    from npu_liger.transformers.modules import patch_experts

    assert "gpt_oss" not in nlt.FAMILIES
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = transformers.GptOssConfig(hidden_size=16, intermediate_size=8, num_local_experts=2)
    with pytest.warns(UserWarning, match="not the computation npu_liger knows"):
        assert patch_experts(GptOssExperts(config), "silu") is None


def test_other_layouts_and_activations_are_left_alone():
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    from npu_liger.transformers.modules import patch_experts, patched_op

    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=2)
    biased = MixtralExperts(config)
    biased.has_bias = True  # what use_experts_implementation(has_bias=True) records
    with pytest.warns(UserWarning, match="stores its experts differently"):
        assert patch_experts(biased, "silu") is None
    with pytest.warns(UserWarning, match="silu experts"):
        assert patch_experts(MixtralExperts(transformers.MixtralConfig(
            hidden_size=16, intermediate_size=8, num_local_experts=2, hidden_act="gelu_pytorch_tanh")),
            "gelu_pytorch_tanh") is None
    plain = MixtralExperts(config)
    assert patch_experts(plain, "silu") == "fused_moe" and patched_op(plain) == "fused_moe"
