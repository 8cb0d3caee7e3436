"""The loss patch (npu_liger/transformers/loss.py) with an lm_head that is not a plain, unobserved nn.Linear:
a forward hook or pre-hook (module or global), an nn.Linear subclass with its own forward, an nn.Sequential, or
PEFT's LoRA wrapper installed after patching. The patched forward must then run ``lm_head`` itself: the loss,
the logits and every gradient (the adapter's included) equal the unpatched model's. And ``return_dict``: the
patched forward returns what transformers' ``can_return_tuple`` makes of its output.

Tiny random Llama models as in test_transformers_integration.py; fp32, relative error <= FP32_RTOL.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from checklist import CountOps, DEVICE, FP32_RTOL, rel_error

transformers = pytest.importorskip("transformers")
import npu_liger.transformers as nlt  # noqa: E402

VOCAB, BATCH, SEQ = 64, 2, 5
CONFIG = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=8, max_position_embeddings=32, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)




@pytest.fixture(autouse=True)
def _clean_patches():
    nlt.revert()
    yield
    nlt.revert()


def _llama(**config):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, **config)).to(DEVICE).train()


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g).to(DEVICE)
    labels = ids.clone()
    labels[0, :2] = -100
    return ids, labels


def _step(model, **kwargs):
    """Loss, logits and every trainable parameter's gradient of one forward/backward."""
    ids, labels = _inputs()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return out, grads


def _assert_same_step(model, ref_model, **kwargs):
    """``model`` (patched) and ``ref_model`` (unpatched) give the same loss, logits and gradients, and the patched
    one ran lm_head itself (npu_liger's cross entropy on its logits, not the fused loss)."""
    ref, ref_grads = _step(ref_model, **kwargs)
    with CountOps() as counter:
        out, grads = _step(model, **kwargs)
    assert "fused_linear_cross_entropy_with_grad" not in counter.counts, counter.counts
    assert counter.counts.get("cross_entropy_with_grad") == 1, counter.counts
    assert type(out) is type(ref)
    assert rel_error(out.loss, ref.loss) <= FP32_RTOL, (out.loss, ref.loss)
    assert out.logits is not None and rel_error(out.logits, ref.logits) <= FP32_RTOL
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        err = rel_error(grads[name], grad)
        assert err <= FP32_RTOL, f"{name}: relative error {err:.2e}"
    return out, grads


def _patched_and_reference(change_lm_head):
    """A loss-patched model and an unpatched copy, both with ``change_lm_head(model)`` applied after patching."""
    model = _llama()
    ref_model = copy.deepcopy(model)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    assert nlt.patch_summary(model)["loss"] == 1
    for m in (model, ref_model):
        change_lm_head(m)
    return model, ref_model


def _scale_output(module, args, output):
    return output * 1.5


def _shift_input(module, args):
    return (args[0] + 0.25,)


@pytest.mark.parametrize("hook", ["forward_hook", "forward_pre_hook"])
def test_loss_patch_runs_a_hooked_lm_head(hook):
    def add_hook(model):
        if hook == "forward_hook":
            model.lm_head.register_forward_hook(_scale_output)
        else:
            model.lm_head.register_forward_pre_hook(_shift_input)

    model, ref_model = _patched_and_reference(add_hook)
    _assert_same_step(model, ref_model)


def test_loss_patch_runs_lm_head_under_a_global_forward_hook():
    """A global module hook (torch.nn.modules.module.register_module_forward_hook) sees every module call: the
    fused loss would hide lm_head's from it."""
    model, ref_model = _patched_and_reference(lambda m: None)
    seen = []

    def observe(module, args, output):
        if isinstance(module, nn.Linear) and output.shape[-1] == VOCAB:
            seen.append(module)

    handle = torch.nn.modules.module.register_module_forward_hook(observe)
    try:
        _assert_same_step(model, ref_model)
    finally:
        handle.remove()
    assert model.lm_head in seen and ref_model.lm_head in seen


class _ScaledLinear(nn.Linear):
    """An nn.Linear subclass whose forward is not F.linear (as quantised or scaled heads are)."""

    def forward(self, x):
        return super().forward(x) * 0.5 + 0.1


def _replace_with_subclass(model):
    old = model.lm_head
    new = _ScaledLinear(old.in_features, old.out_features, bias=False).to(DEVICE)
    with torch.no_grad():
        new.weight.copy_(old.weight)
    model.lm_head = new


def test_loss_patch_runs_an_nn_linear_subclass_lm_head():
    model, ref_model = _patched_and_reference(_replace_with_subclass)
    _assert_same_step(model, ref_model)


def test_loss_patch_runs_a_sequential_lm_head():
    """An lm_head with no ``weight`` (an nn.Sequential): it used to raise AttributeError."""

    def sequential(model):
        torch.manual_seed(2)
        model.lm_head = nn.Sequential(nn.Linear(CONFIG["hidden_size"], 12), nn.Tanh(),
                                      nn.Linear(12, VOCAB)).to(DEVICE)

    model, ref_model = _patched_and_reference(sequential)
    _assert_same_step(model, ref_model)


def test_loss_patch_softcaps_the_logits_of_a_hooked_lm_head():
    """Gemma-2 (final logit softcapping): the fallback applies the softcap to lm_head's logits as HF does."""
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**CONFIG, sliding_window=4, final_logit_softcapping=3.0)
    model = transformers.Gemma2ForCausalLM(config).to(DEVICE).train()
    ref_model = copy.deepcopy(model)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    for m in (model, ref_model):
        m.lm_head.register_forward_hook(_scale_output)
    _assert_same_step(model, ref_model)
    _assert_same_step(model, ref_model, num_items_in_batch=torch.tensor(7, device=DEVICE))


def test_loss_patch_fallback_keeps_num_items_in_batch_and_shift_labels():
    model, ref_model = _patched_and_reference(lambda m: m.lm_head.register_forward_hook(_scale_output))
    _assert_same_step(model, ref_model, num_items_in_batch=torch.tensor(7, device=DEVICE))
    ids, _ = _inputs()
    shift = torch.full_like(ids, -100)
    shift[:, :-2] = ids[:, 2:]  # two tokens ahead: only shift_labels as given gives this loss
    _assert_same_step(model, ref_model, shift_labels=shift)


def test_loss_patch_fuses_again_once_the_hook_is_removed():
    model, ref_model = _patched_and_reference(lambda m: None)
    handle = model.lm_head.register_forward_hook(_scale_output)
    handle.remove()
    ref, _ = _step(ref_model)
    with CountOps() as counter:
        out, _ = _step(model)
    assert counter.counts.get("fused_linear_cross_entropy_with_grad") == 1, counter.counts
    assert out.logits is None and rel_error(out.loss, ref.loss) <= FP32_RTOL


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's call
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_loss_patch_with_peft_lora_on_lm_head(bias):
    """PEFT's LoRA wrapper on lm_head, installed after patching (a module exposing the base layer's ``weight``
    and ``bias`` plus a low-rank branch): the loss includes the branch and the adapter gets its gradients."""
    peft = pytest.importorskip("peft")
    model = _llama()
    if bias:
        base = model.lm_head
        model.lm_head = nn.Linear(base.in_features, base.out_features, bias=True).to(DEVICE)
    ref_model = copy.deepcopy(model)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    lora = dict(r=4, lora_alpha=8, target_modules=["lm_head", "q_proj"], init_lora_weights=False, lora_dropout=0.0)
    model = peft.get_peft_model(model, peft.LoraConfig(**lora))
    ref_model = peft.get_peft_model(ref_model, peft.LoraConfig(**lora))
    assert type(model.base_model.model.lm_head).__name__ == "Linear" and \
        type(model.base_model.model.lm_head) is not nn.Linear  # peft.tuners.lora.Linear
    torch.manual_seed(3)  # the same adapter weights in both
    with torch.no_grad():
        for (name, p), (ref_name, ref_p) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
            assert name == ref_name
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
                ref_p.copy_(p)
    model.train()
    ref_model.train()
    _, grads = _assert_same_step(model, ref_model)
    adapter = [n for n in grads if "lm_head.lora_" in n]
    assert len(adapter) == 2 and all(grads[n].abs().sum() > 0 for n in adapter), adapter


# ---------------------------------------------------------------------------------------------------------------
# return_dict: can_return_tuple's rule (the call's return_dict, else config.return_dict); a tuple is HF's own

def _tuple_like(got, ref):
    assert type(got) is tuple and type(ref) is tuple
    assert len(got) == len(ref), (got, ref)
    for a, b in zip(got, ref, strict=True):
        assert type(a) is type(b)
        if torch.is_tensor(b):
            assert rel_error(a, b) <= FP32_RTOL


def test_loss_patch_honours_return_dict():
    model = _llama()
    ref_model = copy.deepcopy(model)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False)
    ids, labels = _inputs()
    # a tuple keeps HF's positions (loss, logits, cache, ...): the patched forward runs the original for it
    _tuple_like(model(input_ids=ids, labels=labels, return_dict=False),
                ref_model(input_ids=ids, labels=labels, return_dict=False))
    as_dict = model(input_ids=ids, labels=labels, return_dict=True)
    assert as_dict.logits is None and as_dict.past_key_values is not None  # the fused loss: no logits
    model.config.return_dict = False  # tuples unless the call says otherwise
    assert isinstance(model(input_ids=ids, labels=labels, return_dict=True),
                      transformers.modeling_outputs.CausalLMOutputWithPast)
    model.config.return_dict = True

    # the fallback (a hooked lm_head) has logits: exactly HF's tuple
    for m in (model, ref_model):
        m.lm_head.register_forward_hook(_scale_output)
    _tuple_like(model(input_ids=ids, labels=labels, return_dict=False),
                ref_model(input_ids=ids, labels=labels, return_dict=False))
