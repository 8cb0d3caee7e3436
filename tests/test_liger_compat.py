"""Code written for Liger-Kernel, run against npu_liger (docs/SWITCHING.md): the nn modules built with
``LigerRMSNorm`` / ``LigerLayerNorm`` / ``LigerSwiGLUMLP`` / ``LigerGEGLUMLP``'s constructor arguments compute what
Liger documents (and what our modules built our way compute), and ``apply_liger_kernel_to_<family>`` maps Liger's
keywords onto ``apply_to_family`` / ``apply_to_model``."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_liger
from checklist import DEVICE, assert_close, randn
from npu_liger.nn import GEGLUMLP, LayerNorm, RMSNorm, SwiGLUMLP


def rms_reference(x, w, eps, offset):
    """What Liger documents for LigerRMSNorm: ``x / rms(x) * (offset + w)`` (no weight: ``x / rms(x)``), float64."""
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * (offset + w.double())


# ---- RMSNorm ----------------------------------------------------------------------------------------------


def test_rms_norm_takes_liger_arguments_in_liger_order():
    """LigerRMSNorm(hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode, elementwise_affine)."""
    norm = RMSNorm(24, 1e-5, 1.0, "gemma", "zeros", False, True, True).to(DEVICE)
    assert (norm.eps, norm.variance_epsilon, norm.offset, norm.casting_mode) == (1e-5, 1e-5, 1.0, "gemma")
    assert (norm.in_place, norm.row_mode) == (False, True)
    assert torch.equal(norm.weight, torch.zeros(24, device=DEVICE))  # init_fn="zeros": Liger's Gemma start
    with torch.no_grad():
        norm.weight.copy_(randn((24,)) * 0.3)
    ours = RMSNorm(24, eps=1e-5, offset=1.0, casting_mode="gemma").to(DEVICE)
    ours.load_state_dict(norm.state_dict())
    x = randn((3, 5, 24))
    assert torch.equal(norm(x), ours(x))
    assert_close(norm(x), rms_reference(x, norm.weight.detach(), 1e-5, 1.0))


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("row_mode", [None, True, False])
def test_in_place_and_row_mode_change_nothing(in_place, row_mode):
    """Liger's in-place backward and its row_mode kernel choice: accepted, no effect here (results, gradients, and
    the incoming gradient left unwritten)."""
    norm = RMSNorm(40, in_place=in_place, row_mode=row_mode).to(DEVICE)
    plain = RMSNorm(40).to(DEVICE)
    x = randn((6, 40), requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    dy = randn((6, 40))
    before = dy.clone()
    norm(x).backward(dy)
    plain(x2).backward(dy)
    assert torch.equal(dy, before) and torch.equal(x.grad, x2.grad) and torch.equal(norm.weight.grad, plain.weight.grad)


def test_rms_norm_init_fn_follows_liger_and_defaults_to_a_unit_scale():
    assert torch.equal(RMSNorm(8, offset=1.0, init_fn="ones").weight.detach(), torch.ones(8))  # Liger's default
    assert torch.equal(RMSNorm(8, offset=1.0).weight.detach(), torch.zeros(8))  # ours: 1 - offset
    assert torch.equal(RMSNorm(8).weight.detach(), torch.ones(8))
    assert RMSNorm(8, dtype=torch.bfloat16).weight.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_without_elementwise_affine(dtype):
    """Liger's elementwise_affine=False: no weight parameter, ``x / rms(x)`` (offset unused), x's gradient only."""
    norm = RMSNorm(32, 1e-6, 1.0, "gemma", elementwise_affine=False).to(DEVICE)
    assert norm.weight is None and list(norm.parameters()) == [] and norm.state_dict() == {}
    x = randn((4, 32), dtype, requires_grad=True)
    out = norm(x)
    assert out.dtype == dtype
    assert_close(out, rms_reference(x.detach(), None, 1e-6, 1.0), out.detach().clone() if dtype != torch.float32
                 else None)
    out.float().square().sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    normed, s = norm(x, x)  # the fused residual form too
    assert torch.equal(s, x + x) and torch.equal(normed, norm(x + x))


@pytest.mark.parametrize("call,error,match", [
    (lambda: RMSNorm(8, init_fn="normal"), ValueError, "init_fn must be 'ones' or 'zeros'"),
    (lambda: RMSNorm(8, in_place="yes"), TypeError, "in_place must be a bool"),
    (lambda: RMSNorm(8, row_mode=1), TypeError, "row_mode must be a bool or None"),
    (lambda: RMSNorm(8, elementwise_affine=None), TypeError, "elementwise_affine must be a bool"),
    (lambda: RMSNorm(8, 1e-6, 0.0, "llama", "ones", True, None, True, "cpu"), TypeError, "RMSNorm.__init__"),
])
def test_rms_norm_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- LayerNorm --------------------------------------------------------------------------------------------


def test_layer_norm_takes_liger_keywords():
    """LigerLayerNorm(hidden_size, eps, bias, init_fn): hidden_size= and init_fn= by name; the weight and a zero
    bias as Liger starts them (its default bias=False keeps a zero bias parameter: ours by default)."""
    norm = LayerNorm(hidden_size=24, eps=1e-6, init_fn="zeros").to(DEVICE)
    assert norm.normalized_shape == (24,) and norm.hidden_size == 24 and norm.variance_epsilon == 1e-6
    assert torch.equal(norm.weight, torch.zeros(24, device=DEVICE)) and torch.equal(norm.bias, torch.zeros(24,
                                                                                                       device=DEVICE))
    liger_default = LayerNorm(24, 1e-6).to(DEVICE)
    assert sorted(liger_default.state_dict()) == ["bias", "weight"]
    x = randn((3, 24))
    with torch.no_grad():
        liger_default.weight.copy_(randn((24,)))
        liger_default.bias.copy_(randn((24,)))
    want = F.layer_norm(x.double(), (24,), liger_default.weight.double(), liger_default.bias.double(), 1e-6)
    assert_close(liger_default(x), want)


def test_layer_norm_errors_name_the_public_class():
    with pytest.raises(TypeError, match=r"LayerNorm\(normalized_shape, eps=1e-05"):
        LayerNorm()
    with pytest.raises(TypeError, match="once"):
        LayerNorm(8, hidden_size=8)
    with pytest.raises(ValueError, match="init_fn"):
        LayerNorm(8, init_fn="ones", elementwise_affine=False)
    with pytest.raises(ValueError, match="init_fn must be"):
        LayerNorm(hidden_size=8, init_fn="random")


# ---- gated MLPs -------------------------------------------------------------------------------------------


def _configs():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4,
                                     num_key_value_heads=2)
    gemma = transformers.GemmaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=4)
    return transformers, llama, gemma


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_gated_mlp_from_a_config_is_hf_s_mlp(kind):
    """Liger's LigerSwiGLUMLP(config) / LigerGEGLUMLP(config): the sizes from the config, Hugging Face's MLP
    (LlamaMLP / GemmaMLP) computed; our module built from sizes is the same module."""
    transformers, llama, gemma = _configs()
    from transformers.models.gemma.modeling_gemma import GemmaMLP
    from transformers.models.llama.modeling_llama import LlamaMLP

    cls, hf_cls, config = (SwiGLUMLP, LlamaMLP, llama) if kind == "swiglu" else (GEGLUMLP, GemmaMLP, gemma)
    torch.manual_seed(0)
    hf = hf_cls(config).to(DEVICE)
    for mlp in (cls(config), cls(config=config)):
        assert mlp.config is config and (mlp.hidden_size, mlp.intermediate_size) == (16, 40)
        mlp.to(DEVICE).load_state_dict(hf.state_dict())
        ours = cls(16, 40).to(DEVICE)
        ours.load_state_dict(hf.state_dict())
        x = randn((3, 16))
        assert torch.equal(mlp(x), ours(x))
        with torch.no_grad():
            want = hf.double()(x.double())
            hf.float()
        assert_close(mlp(x), want)


def test_gated_mlp_config_details():
    transformers, llama, gemma = _configs()
    assert SwiGLUMLP(llama, 8).up_proj.out_features == 8  # LigerQwen3MoeSwiGLUMLP(config, intermediate_size)
    assert SwiGLUMLP(llama).gate_proj.bias is None
    biased = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4,
                                      num_key_value_heads=2, mlp_bias=True)
    assert SwiGLUMLP(biased).down_proj.bias is not None  # as LlamaMLP reads config.mlp_bias
    assert SwiGLUMLP(biased, bias=False).down_proj.bias is None
    assert SwiGLUMLP(llama, dtype=torch.float64).up_proj.weight.dtype == torch.float64
    swish = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4,
                                     num_key_value_heads=2, hidden_act="swish")
    SwiGLUMLP(swish)
    gemma2 = transformers.Gemma2Config(hidden_size=16, intermediate_size=40, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=4)
    GEGLUMLP(gemma2)  # hidden_activation


@pytest.mark.parametrize("call,error,match", [
    (lambda c: SwiGLUMLP(c[2]), ValueError, r"SwiGLUMLP computes swiglu .* hidden_act is 'gelu_pytorch_tanh'"),
    (lambda c: GEGLUMLP(c[1]), ValueError, r"GEGLUMLP computes geglu .* hidden_act is 'silu'"),
    (lambda c: SwiGLUMLP(), TypeError, r"SwiGLUMLP\(hidden_size, intermediate_size, bias=False.* or SwiGLUMLP"
                                       r"\(config\).*hidden_size must be"),
    (lambda c: GEGLUMLP(16), TypeError, r"GEGLUMLP\(hidden_size.*intermediate_size must be"),
    (lambda c: SwiGLUMLP(object()), TypeError, r"hidden_size must be a non-negative int \(the config has none\)"),
    (lambda c: SwiGLUMLP(16, config=c[1]), TypeError, "got both a config and hidden_size=16"),
    (lambda c: SwiGLUMLP(c[1], foo=1), TypeError, r"SwiGLUMLP.__init__\(\) got an unexpected keyword"),
])
def test_gated_mlp_errors_name_the_public_class(call, error, match):
    configs = _configs()
    with pytest.raises(error, match=match) as info:
        call(configs)
    assert "GatedMLP" not in str(info.value)


# ---- apply_liger_kernel_to_<family> ------------------------------------------------------------------------


@pytest.fixture
def nlt():
    pytest.importorskip("transformers")
    import npu_liger.transformers as nlt

    nlt.revert()
    yield nlt
    nlt.revert()


@pytest.fixture
def calls(monkeypatch, nlt):
    """Records what the aliases call instead of patching."""
    from npu_liger.transformers import liger_compat

    seen = []
    monkeypatch.setattr(liger_compat, "apply_to_family", lambda name, **kw: seen.append(("family", name, kw)))
    monkeypatch.setattr(liger_compat, "apply_to_model", lambda model, **kw: seen.append(("model", model, kw)))
    return seen


LIGER_KEYWORDS = ["rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "layer_norm", "swiglu", "geglu",
                  "model"]


def test_every_family_has_liger_s_function_name(nlt):
    for family in nlt.FAMILIES:
        fn = getattr(nlt, f"apply_liger_kernel_to_{family}")
        assert list(inspect.signature(fn).parameters) == LIGER_KEYWORDS
        assert nlt.liger_compat.MODEL_TYPE_TO_APPLY_LIGER_FN[family] is fn
    assert "apply_liger_kernel_to_gemma3_text" in nlt.liger_compat.__all__


def test_aliases_come_from_the_family_table(monkeypatch, nlt):
    from npu_liger.transformers import liger_compat

    monkeypatch.setitem(liger_compat.FAMILIES, "newfamily", liger_compat.FAMILIES["llama"])
    assert "apply_liger_kernel_to_newfamily" in liger_compat._aliases()


@pytest.mark.parametrize("kwargs,want", [
    ({}, dict(rope=True, mlp=True, norm=True, loss=True)),
    ({"rope": False, "swiglu": False}, dict(rope=False, mlp=False, norm=True, loss=True)),
    ({"geglu": False, "rms_norm": False}, dict(rope=True, mlp=False, norm=False, loss=True)),
    ({"fused_linear_cross_entropy": False}, dict(rope=True, mlp=True, norm=True, loss=False)),
    ({"layer_norm": False, "rms_norm": False}, dict(rope=True, mlp=True, norm=False, loss=True)),
])
def test_keywords_map_to_ours(calls, nlt, kwargs, want):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nlt.apply_liger_kernel_to_qwen2(**kwargs)
    assert calls == [("family", "qwen2", want)]


def test_norm_keywords_that_disagree_patch_neither(calls, nlt):
    with pytest.warns(UserWarning, match="together, so neither is patched"):
        nlt.apply_liger_kernel_to_qwen2_vl(rms_norm=True, layer_norm=False)
    assert calls[-1][2]["norm"] is False


def test_cross_entropy_keywords(calls, nlt):
    with pytest.warns(UserWarning, match="no npu_liger equivalent"):
        nlt.apply_liger_kernel_to_gemma3_text(cross_entropy=True, fused_linear_cross_entropy=False)
    assert calls == [("family", "gemma3", dict(rope=True, mlp=True, norm=True, loss=False))]
    with pytest.raises(ValueError, match="cannot both be True"):
        nlt.apply_liger_kernel_to_llama(cross_entropy=True)
    with pytest.raises(TypeError, match=r"apply_liger_kernel_to_llama\(\) got an unexpected keyword"):
        nlt.apply_liger_kernel_to_llama(fused_linear_jsd=True)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(DEVICE)


def test_model_keyword_patches_the_built_model_like_apply_to_model(nlt):
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 5), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits
    assert nlt.apply_liger_kernel_to_llama(model=model) is None
    summary = nlt.patch_summary(model)
    assert summary["mlp"] == {"swiglu": 1} and summary["norm"] == {"rms_norm": 3} and summary["loss"] == 1
    assert summary["rope"] == ["llama.apply_rotary_pos_emb"]
    with torch.no_grad():
        assert_close(model(ids).logits, want.double())
    other = nlt.apply_to_model(_tiny_llama())
    assert nlt.patch_summary(other) == summary
    transformers = pytest.importorskip("transformers")
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2))
    with pytest.raises(ValueError, match="no module of the llama family"):
        nlt.apply_liger_kernel_to_llama(model=qwen)


def test_without_model_patches_models_built_afterwards(nlt):
    nlt.apply_liger_kernel_to_llama(rope=False, fused_linear_cross_entropy=False)
    summary = nlt.patch_summary(_tiny_llama())
    assert summary["mlp"] == {"swiglu": 1} and summary["norm"] == {"rms_norm": 3}
    assert summary["rope"] == [] and summary["loss"] == 0
    nlt.revert("llama")
    assert nlt.patch_summary(_tiny_llama())["mlp"] == {}


def test_npu_liger_top_level_is_untouched():
    assert not any(name.startswith("apply_liger") for name in npu_liger.__all__)


def test_chunked_loss_names_switch_by_import():
    """``from npu_liger.chunked_loss import LigerFusedLinearDPOLoss`` (was liger_kernel.chunked_loss): the names
    are our modules, built with Liger's keywords, called with Liger's forward order, returning (loss, metrics)."""
    from npu_liger import chunked_loss as ck
    from npu_liger import nn as nl
    assert ck.LigerFusedLinearDPOLoss is nl.FusedLinearDPOLoss and ck.LigerFusedLinearKTOLoss is nl.FusedLinearKTOLoss
    assert ck.LigerFusedLinearGRPOLoss is nl.FusedLinearGRPOLoss
    assert sorted(ck.__all__) == sorted(f"Liger{n}" for n in ("FusedLinearCPOLoss", "FusedLinearDPOLoss",
                                                              "FusedLinearGRPOLoss", "FusedLinearKTOLoss",
                                                              "FusedLinearORPOLoss", "FusedLinearSimPOLoss"))
    x, w, y = torch.randn(4, 5, 8), torch.randn(16, 8) * 0.3, torch.randint(0, 16, (4, 5))
    loss, metrics = ck.LigerFusedLinearDPOLoss(ignore_index=-100, beta=0.1, compute_nll_loss=True, compiled=True,
                                               use_ref_model=False, chunk_size=1)(w, x, y)
    assert loss.dim() == 0 and len(metrics) == 7
    loss, metrics = ck.LigerFusedLinearORPOLoss(beta=0.1, compiled=False)(w, x, y)
    assert len(metrics) == 9
    loss, metrics = ck.LigerFusedLinearKTOLoss(beta=0.1)(x, w, y, None, torch.tensor([True, False, True, False]))
    assert len(metrics) == 6
