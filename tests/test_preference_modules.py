"""The preference-loss modules (npu_liger.nn.FusedLinear{DPO,ORPO,SimPO,CPO,KTO}Loss): Liger's constructor
arguments and forward signatures mapped onto the ops, no parameters, clear errors, and (when liger_kernel is
installed) the same numbers as Liger's modules."""

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
                                 nl.FusedLinearCPOLoss, nl.FusedLinearKTOLoss])
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
