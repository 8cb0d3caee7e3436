"""The preference-loss modules (npu_liger.nn.FusedLinear{DPO,ORPO,SimPO,CPO,KTO,GRPO}Loss): Liger's constructor
arguments and forward signatures mapped onto the ops, no parameters, clear errors, and (when liger_kernel is
installed) the same numbers as Liger's modules."""

import inspect

import pytest
import torch

import npu_liger
from npu_liger import nn as nl

N, T, H, V = 4, 6, 8, 16


def _inputs(device, dtype=torch.float32, ref=False):
    x = torch.randn(N, T, H, dtype=dtype, device=device)
    w = torch.randn(V, H, dtype=dtype, device=device) * 0.3
    b = torch.randn(V, dtype=dtype, device=device) * 0.1
    y = torch.randint(0, V, (N, T), device=device)
    y[:, 0] = -100
    extra = (torch.randn(N, T, H, dtype=dtype, device=device), torch.randn(V, H, dtype=dtype, device=device) * 0.3,
             None) if ref else ()
    return x, w, y, b, extra


def _same(a, b):
    # The module is a thin wrapper over the op on the same inputs: the results must be identical.
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    assert len(a[1]) == len(b) - 1
    for got, want in zip(a[1], b[1:]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dpo_module_equals_op(device):
    x, w, y, b, (rx, rw, _) = _inputs(device, ref=True)
    m = nl.FusedLinearDPOLoss(beta=0.2, alpha=0.5, compute_nll_loss=True, label_smoothing=0.1, average_log_prob=True)
    _same(m(w, x, y, b, rx, rw), npu_liger.fused_linear_dpo(x, w, y, b, rx, rw, None, None, None, -100, 0.2, 0.1,
                                                            True, 0.5, True))
    off = nl.FusedLinearDPOLoss(use_ref_model=False)
    _same(off(w, x, y, b, rx, rw), npu_liger.fused_linear_dpo(x, w, y, b))


def test_orpo_simpo_cpo_modules_equal_ops(device):
    x, w, y, b, _ = _inputs(device)
    _same(nl.FusedLinearORPOLoss(beta=0.3, compute_nll_loss=False)(w, x, y, b),
          npu_liger.fused_linear_orpo(x, w, y, b, -100, 0.3, False))
    _same(nl.FusedLinearSimPOLoss(beta=0.3, alpha=0.7, label_smoothing=0.1, gamma=0.2)(w, x, y, b),
          npu_liger.fused_linear_simpo(x, w, y, b, -100, 0.3, 0.7, 0.1, True, 0.2))
    _same(nl.FusedLinearCPOLoss(beta=0.3, alpha=0.7, average_log_prob=True)(w, x, y, b),
          npu_liger.fused_linear_cpo(x, w, y, b, -100, 0.3, 0.7, 0.0, True, True))


def test_kto_module_equals_op(device):
    x, w, y, b, (rx, rw, _) = _inputs(device, ref=True)
    labels = torch.tensor([True, False, True, False], device=device)
    kl = torch.tensor(0.05, device=device)
    m = nl.FusedLinearKTOLoss(beta=0.2, use_ref_model=True)
    _same(m(x, w, y, b, labels, rx, rw, None, kl),
          npu_liger.fused_linear_kto(x, w, y, labels, b, rx, rw, None, None, kl, -100, 0.2))
    _same(nl.FusedLinearKTOLoss()(x, w, y, b, labels, rx, rw),
          npu_liger.fused_linear_kto(x, w, y, labels, b))


def test_gradient_flows_through_module(device):
    x, w, y, b, _ = _inputs(device)
    x.requires_grad_()
    w.requires_grad_()
    nl.FusedLinearSimPOLoss()(w, x, y, b)[0].backward()
    assert x.grad is not None and w.grad is not None and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("cls", [nl.FusedLinearDPOLoss, nl.FusedLinearORPOLoss, nl.FusedLinearSimPOLoss,
                                 nl.FusedLinearCPOLoss, nl.FusedLinearKTOLoss, nl.FusedLinearGRPOLoss])
def test_no_parameters_and_ignored_arguments(cls):
    m = cls(chunk_size=7, compiled=False)
    assert list(m.parameters()) == [] and list(m.buffers()) == []
    assert m.chunk_size == 7 and m.compiled is False
    assert "beta" in repr(m)
    with pytest.raises(ValueError, match="chunk_size"):
        cls(chunk_size=0)


def test_clear_errors(device):
    with pytest.raises(ValueError, match="loss_type"):
        nl.FusedLinearDPOLoss(loss_type="hinge")
    with pytest.raises(TypeError, match="use_ref_model"):
        nl.FusedLinearDPOLoss(use_ref_model="yes")
    x, w, y, b, (rx, rw, _) = _inputs(device, ref=True)
    with pytest.raises(ValueError, match="ref_weight"):
        nl.FusedLinearDPOLoss()(w, x, y, b, rx)
    with pytest.raises(ValueError, match="nll_target"):
        nl.FusedLinearORPOLoss()(w, x, y, b, y)
    with pytest.raises(ValueError, match="preference_labels"):
        nl.FusedLinearKTOLoss()(x, w, y, b)


def _liger_pairs():
    ck = pytest.importorskip("liger_kernel.chunked_loss")
    return [(nl.FusedLinearDPOLoss(beta=0.2, compute_nll_loss=True), ck.LigerFusedLinearDPOLoss(
                beta=0.2, compute_nll_loss=True, compiled=False), True),
            (nl.FusedLinearORPOLoss(), ck.LigerFusedLinearORPOLoss(compiled=False), False),
            (nl.FusedLinearSimPOLoss(), ck.LigerFusedLinearSimPOLoss(compiled=False), False),
            (nl.FusedLinearCPOLoss(), ck.LigerFusedLinearCPOLoss(compiled=False), False)]


def _assert_same_as_liger(ours, theirs, x, w, b):
    """``ours(x, w, b)`` and ``theirs(x, w, b)`` (each ``(loss, metrics)``) on copies of the same leaves: loss,
    metrics and the gradients of input, weight and bias."""
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    a, b_ = ours(xs, ws, bs), theirs(xl, wl, bl)
    assert len(a[1]) == len(b_[1])
    # fp32 both sides, the same formulas summed in a different chunk order: a few ulps of fp32.
    torch.testing.assert_close(a[0], b_[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(a[1], b_[1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    a[0].backward()
    b_[0].backward()
    # Gradients: the same fp32 formulas, chunk sums in another order; a few ulps, relative to their size.
    for got, want in ((xs.grad, xl.grad), (ws.grad, wl.grad), (bs.grad, bl.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_equal_to_liger_paired(device):
    for ours, theirs, ref in _liger_pairs():
        x, w, y, b, extra = _inputs(device, ref=ref)
        _assert_same_as_liger(lambda xi, wi, bi, m=ours: m(wi, xi, y, bi, *extra),
                              lambda xi, wi, bi, m=theirs: m(wi, xi, y, bi, *extra), x, w, b)


def test_equal_to_liger_kto(device):
    ck = pytest.importorskip("liger_kernel.chunked_loss")
    x, w, y, b, (rx, rw, _) = _inputs(device, ref=True)
    labels = torch.tensor([True, False, True, False], device=device)
    kl = torch.tensor(0.05, device=device)
    ours = nl.FusedLinearKTOLoss(use_ref_model=True)
    theirs = ck.LigerFusedLinearKTOLoss(use_ref_model=True, compiled=False)
    _assert_same_as_liger(lambda xi, wi, bi: ours(xi, wi, y, bi, labels, rx, rw, None, kl),
                          lambda xi, wi, bi: theirs(xi, wi, y, bi, labels, rx, rw, None, kl), x, w, b)


# GRPO: (B, T, H) completions, a 0/1 completion mask (a sequence without tokens), one advantage per sequence.


def _grpo_inputs(device):
    x, w, _, b, (rx, rw, _) = _inputs(device, ref=True)
    ids = torch.randint(0, V, (N, T), device=device)
    mask = (torch.rand(N, T, device=device) > 0.3).long()
    mask[1] = 0
    adv = torch.randn(N, device=device)
    logps = (x @ w.T + b).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ref = (logps + 0.2 * torch.randn(N, T, device=device)).detach()
    old = (logps + 0.3 * torch.randn(N, T, device=device)).detach()  # ratios far enough from 1 to clip
    return x, w, b, ids, mask, adv, ref, old, rx, rw


# (constructor keywords, forward keywords by name: "ref", "old", "model" (ref_input, ref_weight), and the op's
# beta, epsilon_high, temperature, loss_type, max_completion_length)
_GRPO_SETTINGS = [
    (dict(), ("ref", "old"), dict(beta=0.04)),
    (dict(beta=0.1, loss_type="grpo", temperature=0.7), ("model", "old"),
     dict(beta=0.1, loss_type="grpo", temperature=0.7)),
    (dict(beta=0.0, loss_type="bnpo", use_ref_model=False), ("old",), dict(beta=0.0, loss_type="bnpo")),
    (dict(loss_type="dr_grpo", max_completion_length=8, epsilon_high=0.28), ("ref",),
     dict(beta=0.04, loss_type="dr_grpo", max_completion_length=8, epsilon_high=0.28)),
    (dict(use_ref_model=False), ("old",), dict(beta=0.0)),  # Liger's KL is then 0: the op without the penalty
]


def _grpo_forward_kwargs(names, ref, old, rx, rw):
    kwargs = {}
    if "ref" in names:
        kwargs["ref_per_token_logps"] = ref
    if "old" in names:
        kwargs["old_per_token_logps"] = old
    if "model" in names:
        kwargs.update(ref_input=rx, ref_weight=rw)
    return kwargs


@pytest.mark.parametrize("options, inputs, op_options", _GRPO_SETTINGS)
def test_grpo_module_equals_op(device, options, inputs, op_options):
    x, w, b, ids, mask, adv, ref, old, rx, rw = _grpo_inputs(device)
    kwargs = _grpo_forward_kwargs(inputs, ref, old, rx, rw)
    m = nl.FusedLinearGRPOLoss(**options)
    loss, metrics = m(x, w, ids, mask, adv, b, **kwargs)
    op_kwargs = {k: v for k, v in kwargs.items() if m.use_ref_model or k == "old_per_token_logps"}
    want = npu_liger.fused_linear_grpo(x, w, ids, mask, adv, b, **op_kwargs, **op_options)
    # Liger's metrics: the KL mean only when beta != 0, then the clip ratio
    _same((loss, metrics), (want[0], *want[1:]) if m.beta != 0.0 else (want[0], want[2]))
    assert len(metrics) == (2 if m.beta != 0.0 else 1)


def test_grpo_module_dapo_normaliser(device):
    """dapo divides by num_items_in_batch / world_size when given (Liger's, TRL's global count): the op's loss
    (over the batch's own count) times count / normaliser; the other loss types ignore it, as Liger's."""
    x, w, b, ids, mask, adv, ref, old, _, _ = _grpo_inputs(device)
    loss, metrics = nl.FusedLinearGRPOLoss()(x, w, ids, mask, adv, b, ref, old, num_items_in_batch=30)
    want = npu_liger.fused_linear_grpo(x, w, ids, mask, adv, b, ref_per_token_logps=ref, old_per_token_logps=old)
    count = (mask != 0).sum().clamp_min(1).to(torch.float32)
    _same((loss, metrics), (want[0] * (count / torch.tensor(30.0, device=device)), *want[1:]))
    tensor_count = torch.tensor(30, device=device)
    _same(nl.FusedLinearGRPOLoss()(x, w, ids, mask, adv, b, ref, old, num_items_in_batch=tensor_count),
          (loss, *metrics))
    grpo = nl.FusedLinearGRPOLoss(loss_type="grpo")(x, w, ids, mask, adv, b, ref, old, num_items_in_batch=30)
    _same(grpo, npu_liger.fused_linear_grpo(x, w, ids, mask, adv, b, ref_per_token_logps=ref,
                                            old_per_token_logps=old, loss_type="grpo"))


def test_grpo_gradient_flows_through_module(device):
    x, w, b, ids, mask, adv, ref, old, _, _ = _grpo_inputs(device)
    for t in (x, w, b):
        t.requires_grad_()
    loss, metrics = nl.FusedLinearGRPOLoss(beta=0.1)(x, w, ids, mask, adv, b, ref, old)
    assert loss.requires_grad and not any(t.requires_grad for t in metrics)
    loss.backward()
    for t in (x, w, b):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
    assert (x.grad[1] == 0).all()  # the sequence without completion tokens


_LIGER_GRPO_INIT = ["beta", "compiled", "use_ref_model", "chunk_size", "epsilon_low", "epsilon_high", "loss_type",
                    "max_completion_length", "importance_sampling_level", "sapo_temperature_pos",
                    "sapo_temperature_neg", "temperature", "delta", "use_bias_correction_kl", "vespo_k_pos",
                    "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"]
_LIGER_GRPO_FORWARD = ["_input", "lin_weight", "selected_token_ids", "attention_mask", "advantages", "bias",
                       "ref_per_token_logps", "old_per_token_logps", "ref_input", "ref_weight", "ref_bias",
                       "vllm_is_ratio", "num_items_in_batch"]


def test_grpo_module_arguments_and_errors(device):
    assert list(inspect.signature(nl.FusedLinearGRPOLoss).parameters) == _LIGER_GRPO_INIT
    assert list(inspect.signature(nl.FusedLinearGRPOLoss.forward).parameters)[1:] == _LIGER_GRPO_FORWARD
    m = nl.FusedLinearGRPOLoss(sapo_temperature_pos=2.0, vespo_k_pos=1.5)  # only for rejected loss types: kept
    assert m.sapo_temperature_pos == 2.0 and m.vespo_k_pos == 1.5 and m.delta is None
    for options, match in [(dict(loss_type="cispo"), "loss_type"), (dict(loss_type="sapo"), "loss_type"),
                           (dict(loss_type="luspo"), "loss_type"), (dict(loss_type="vespo"), "loss_type"),
                           (dict(importance_sampling_level="sequence"), "importance_sampling_level"),
                           (dict(delta=1.5), "delta"), (dict(use_bias_correction_kl=True), "use_bias_correction_kl"),
                           (dict(loss_type="dr_grpo"), "max_completion_length"),
                           (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg"),
                           (dict(temperature=0.0), "temperature"), (dict(chunk_size=0), "chunk_size")]:
        with pytest.raises(ValueError, match=match):
            nl.FusedLinearGRPOLoss(**options)
    with pytest.raises(TypeError, match="use_ref_model"):
        nl.FusedLinearGRPOLoss(use_ref_model=1)
    nl.FusedLinearGRPOLoss(beta=0.0, use_bias_correction_kl=True)  # no KL term: nothing to correct
    x, w, b, ids, mask, adv, ref, old, rx, rw = _grpo_inputs(device)
    with pytest.raises(ValueError, match="vllm_is_ratio"):
        m(x, w, ids, mask, adv, b, ref, old, vllm_is_ratio=torch.ones(N, T, device=device))
    with pytest.raises(ValueError, match="ref_per_token_logps or ref_input"):
        m(x, w, ids, mask, adv, b)
    with pytest.raises(ValueError, match="ref_weight"):
        m(x, w, ids, mask, adv, b, ref_input=rx)
    with pytest.warns(UserWarning, match="Using ref_per_token_logps"):  # Liger's choice when given both
        both = m(x, w, ids, mask, adv, b, ref, old, rx, rw)
    _same(both, (m(x, w, ids, mask, adv, b, ref, old)[0], *m(x, w, ids, mask, adv, b, ref, old)[1]))


def _liger_grpo_case(device, ck, options, inputs, num_items_in_batch=None):
    x, w, b, ids, mask, adv, ref, old, rx, rw = _grpo_inputs(device)
    kwargs = dict(_grpo_forward_kwargs(inputs, ref, old, rx, rw), num_items_in_batch=num_items_in_batch)
    ours, theirs = nl.FusedLinearGRPOLoss(**options), ck.LigerFusedLinearGRPOLoss(**options, compiled=False)
    _assert_same_as_liger(lambda xi, wi, bi: ours(xi, wi, ids, mask, adv, bi, **kwargs),
                          lambda xi, wi, bi: theirs(xi, wi, ids, mask, adv, bi, **kwargs), x, w, b)


@pytest.mark.parametrize("options, inputs, op_options", _GRPO_SETTINGS)
def test_equal_to_liger_grpo(device, options, inputs, op_options):
    ck = pytest.importorskip("liger_kernel.chunked_loss")
    assert list(inspect.signature(ck.LigerFusedLinearGRPOLoss).parameters) == _LIGER_GRPO_INIT
    assert list(inspect.signature(ck.LigerFusedLinearGRPOLoss.forward).parameters)[1:] == _LIGER_GRPO_FORWARD
    for name, p in inspect.signature(ck.LigerFusedLinearGRPOLoss).parameters.items():
        assert inspect.signature(nl.FusedLinearGRPOLoss).parameters[name].default == p.default, name
    _liger_grpo_case(device, ck, options, inputs)


def test_equal_to_liger_grpo_dapo_normaliser(device, monkeypatch):
    """num_items_in_batch, and torch.distributed's world size and summed token count (faked: two processes, the
    all-reduce tripling the local count), reach the dapo normaliser as in Liger's."""
    ck = pytest.importorskip("liger_kernel.chunked_loss")
    _liger_grpo_case(device, ck, dict(), ("ref", "old"), num_items_in_batch=30)
    _liger_grpo_case(device, ck, dict(), ("ref", "old"), num_items_in_batch=torch.tensor(30, device=device))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op=None, group=None, async_op=False: t.mul_(3))
    _liger_grpo_case(device, ck, dict(), ("ref", "old"))
    _liger_grpo_case(device, ck, dict(), ("ref", "old"), num_items_in_batch=30)
