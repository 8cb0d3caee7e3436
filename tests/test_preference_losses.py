"""fused_linear_dpo, _orpo, _simpo, _cpo, _kto against float64 references written from the papers' formulas (with
Liger's conventions: masking by ignore_index, sum or mean log-probabilities, the NLL of the chosen sequences, the
metrics' definitions), chunks shrunk so every loop turns, gradients of input, weight and bias, opcheck, compile."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import npu_liger
import npu_liger.npu_ops._preference as core
from checklist import (DEVICE, assert_close, assert_rounded_grad_close, chunked_rounding_size, randn,
                       rounded_logit_grads_sizes, run_opcheck)

N_PAIRS, T, H, V = 3, 5, 8, 13
CAPTURED_LOGITS = []  # token_logps appends its logits here while a test clears and reads it


def token_logps(x, w, b, target):
    logits = x @ w.T + (0 if b is None else b)
    if logits.requires_grad and logits.dtype == torch.float64:
        logits.retain_grad()
        CAPTURED_LOGITS.append(logits)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # half-precision logits, fp32 loss
    valid = target != -100
    lp = logits.log_softmax(-1).gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lp, 0.0), valid, logits


def seq_logps(lp, valid, average):
    return lp.sum(-1) / valid.sum(-1).clamp_min(1) if average else lp.sum(-1)


def pair_reference(kind, x, w, target, b, ref=None, beta=0.1, eps=0.0, nll=False, alpha=1.0, average=False,
                   gamma=0.5):
    lp, valid, logits = token_logps(x, w, b, target)
    s = seq_logps(lp, valid, average)
    n = x.shape[0] // 2
    c, r = s[:n], s[n:]
    rc, rr = (torch.zeros_like(c), torch.zeros_like(r)) if ref is None else ref
    extra = ()
    if kind == "dpo":
        z = beta * ((c - rc) - (r - rr))
    elif kind in ("simpo", "cpo"):
        z = beta * (c - r) - (gamma if kind == "simpo" else 0.0)
    if kind == "orpo":
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        loss = -beta * F.logsigmoid(log_odds).mean()
        extra = (F.logsigmoid(log_odds).mean().detach(), log_odds.mean().detach())
    else:
        loss = (-(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)).mean()
    nll_loss = -lp[:n].sum() / valid[:n].sum().clamp_min(1)
    if nll:
        loss = loss + alpha * nll_loss
    means = logits.detach().reshape(2, -1).sum(-1) / (n * x.shape[1] * w.shape[0])
    return (loss, c.detach(), r.detach(), means[0], means[1], nll_loss.detach(), (beta * (c - rc)).detach(),
            (beta * (r - rr)).detach(), *extra)


def kto_reference(x, w, target, labels, b, ref=None, kl=None, beta=0.1, average=False):
    lp, valid, logits = token_logps(x, w, b, target)
    s = seq_logps(lp, valid, average)
    ratio = s - (0 if ref is None else ref)
    sign = torch.where(labels, 1.0, -1.0).to(s.dtype)
    loss = (1 - torch.sigmoid(beta * (ratio - (0 if kl is None else kl)) * sign)).mean()
    ls = logits.detach().sum((1, 2))

    def split(v):
        v = v.detach()
        return torch.where(labels, v, 0).sum(), torch.where(labels, 0, v).sum()

    return (loss, *split(s), *split(ls), *split(beta * ratio))


def make(n_pairs=N_PAIRS, dtype=torch.float32, seq=T):
    x = randn((2 * n_pairs, seq, H), dtype)
    w = randn((V, H), dtype, scale=0.4)
    b = randn((V,), dtype)
    target = torch.randint(0, V, (2 * n_pairs, seq), device=DEVICE)
    target[torch.rand(target.shape, device=DEVICE) < 0.3] = -100
    return x, w, target, b


def chunks_of(rows):
    return mock.patch.object(core, "chunk_rows", lambda n_rows, hidden, vocab: rows)


CALLS = {  # name -> (our call, reference call) of (x, w, target, b, extra)
    "dpo": (lambda x, w, t, b, e: npu_liger.fused_linear_dpo(x, w, t, b, *e["ref_model"], None, None, -100, 0.2,
                                                             0.1, True, 0.5, False),
            lambda x, w, t, b, e: pair_reference("dpo", x, w, t, b, e["ref64"], 0.2, 0.1, True, 0.5, False)),
    "dpo_precomputed_ref_avg": (
        lambda x, w, t, b, e: npu_liger.fused_linear_dpo(x, w, t, b, None, None, None, *e["ref_logps"], -100, 0.3,
                                                         0.0, False, 1.0, True),
        lambda x, w, t, b, e: pair_reference("dpo", x, w, t, b, [r.double() for r in e["ref_logps"]], 0.3, 0.0,
                                             False, 1.0, True)),
    "orpo": (lambda x, w, t, b, e: npu_liger.fused_linear_orpo(x, w, t, b, -100, 0.2, True),
             lambda x, w, t, b, e: pair_reference("orpo", x, w, t, b, None, 0.2, nll=True, average=True)),
    "simpo": (lambda x, w, t, b, e: npu_liger.fused_linear_simpo(x, w, t, b, -100, 2.0, 0.7, 0.1, True, 0.5),
              lambda x, w, t, b, e: pair_reference("simpo", x, w, t, b, None, 2.0, 0.1, True, 0.7, True, 0.5)),
    "cpo": (lambda x, w, t, b, e: npu_liger.fused_linear_cpo(x, w, t, b, -100, 0.1, 1.0, 0.0, True, False),
            lambda x, w, t, b, e: pair_reference("cpo", x, w, t, b, None, 0.1, 0.0, True, 1.0, False)),
    "kto": (lambda x, w, t, b, e: npu_liger.fused_linear_kto(x, w, t, e["labels"], b, *e["ref_model"], None,
                                                             e["kl"], -100, 0.3, False),
            lambda x, w, t, b, e: kto_reference(x, w, t, e["labels"], b, e["ref64_seq"], e["kl"].double(), 0.3)),
}


def extras(x, target):
    rx, rw = randn((x.shape[0], x.shape[1], 6)), randn((V, 6), scale=0.4)
    lp, valid, _ = token_logps(rx.double(), rw.double(), None, target)
    s = seq_logps(lp, valid, False)
    n = x.shape[0] // 2
    return {"ref_model": (rx, rw, None), "ref64": (s[:n], s[n:]), "ref64_seq": s,
            "ref_logps": (randn((n,)) - 5.0, randn((n,)) - 5.0),
            "labels": torch.rand(x.shape[0], device=DEVICE) < 0.5, "kl": randn(()).abs()}


@pytest.mark.parametrize("rows", [None, 5, 11])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_matches_float64_reference(name, rows):
    x, w, target, b = make()
    e = extras(x, target)
    ours, ref = CALLS[name]
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    with chunks_of(rows) if rows else mock.patch.object(core, "chunk_rows", core.chunk_rows):
        out = ours(leaves[0], leaves[1], target, leaves[2], e)
    (out[0] * 1.3).backward()
    leaves64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    want = ref(leaves64[0], leaves64[1], target, leaves64[2], e)
    (want[0] * 1.3).backward()
    assert len(out) == len(want)
    for i, (o, r) in enumerate(zip(out, want)):
        assert o.dtype == torch.float32
        assert_close(o, r, what=f"{name} output {i}")
    for what, got, r in zip(("input", "weight", "bias"), leaves, leaves64):
        assert_close(got.grad, r.grad, what=f"{name} grad {what}")


@pytest.mark.parametrize("name", ["dpo", "simpo", "kto"])
def test_bfloat16_against_the_eager_bfloat16_reference(name):
    x, w, target, b = make(dtype=torch.bfloat16)
    e = extras(x, target)
    e["ref_model"] = tuple(None if t is None else t.bfloat16() for t in e["ref_model"])
    ours, ref = CALLS[name]
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    with chunks_of(5):
        out = ours(*leaves[:2], target, leaves[2], e)
    out[0].backward()
    lp = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]  # the unfused formula on bf16 logits
    want_lp = ref(lp[0], lp[1], target, lp[2], {**e, "ref64": tuple(r.float() for r in e["ref64"]),
                                                "ref64_seq": e["ref64_seq"].float()})
    want_lp[0].backward()
    l64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    CAPTURED_LOGITS.clear()
    want = ref(l64[0], l64[1], target, l64[2], e)
    want[0].backward()
    assert_close(out[0].bfloat16(), want[0], want_lp[0].bfloat16(), what=f"{name} loss")
    # Our d loss / d logits are stored in bf16 before the matmuls and grad_weight accumulates chunk by chunk in
    # bf16: more roundings than the unfused eager run's, sized from the float64 logits' gradient as in
    # test_fused_linear_cross_entropy. A chunk holds one unit (a pair: chosen i then rejected n + i; one
    # sequence for kto), so the rows are taken in the chunks' order for the running sums.
    (logits64,) = CAPTURED_LOGITS
    n = x.shape[0] // 2
    order = [i for p in range(n) for i in (p, n + p)] if name != "kto" else list(range(x.shape[0]))
    g64 = logits64.grad[order].reshape(-1, V)
    x_rows = x[order].reshape(-1, H)
    sizes = dict(rounded_logit_grads_sizes(logits64.grad.reshape(-1, V), w),
                 weight=chunked_rounding_size(g64, x_rows, (2 if name != "kto" else 1) * T))
    for what, got, eager, r in zip(("x", "weight", "bias"), leaves, lp, l64):
        assert got.grad.dtype == torch.bfloat16
        assert_rounded_grad_close(got.grad, r.grad, eager.grad, sizes[what], f"{name} gradient {what}", 0.0)


def test_opcheck_and_compile_without_recompiles():
    x, w, target, b = make(2)
    with chunks_of(5):
        run_opcheck(torch.ops.npu_liger.fused_linear_dpo.default,
                    (x.requires_grad_(True), w.requires_grad_(True), target, b.requires_grad_(True)))
        run_opcheck(torch.ops.npu_liger.fused_linear_kto.default,
                    (x, w, target, torch.tensor([True, False, True, False], device=DEVICE), b))
        run_opcheck(torch.ops.npu_liger.fused_linear_orpo_with_grad.default,
                    (x.detach(), w.detach(), target, b.detach(), -100, 0.1, True, True, True, False))
    compiled = torch.compile(lambda *a: npu_liger.fused_linear_simpo(*a)[0] * 2.0, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=False):
        torch._dynamo.reset()
    for i, n_pairs in enumerate((3, 4, 6)):
        x, w, target, b = make(n_pairs, seq=7)
        leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
        ctx = torch._dynamo.config.patch(error_on_recompile=i > 0)
        with ctx:
            out = compiled(leaves[0], leaves[1], target, leaves[2])
        out.backward()
        l64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
        want = pair_reference("simpo", l64[0], l64[1], target, l64[2], None, 0.1, 0.0, True, 1.0, True)[0] * 2.0
        want.backward()
        assert_close(out, want, what="compiled loss")
        for got, r in zip(leaves, l64):
            assert_close(got.grad, r.grad, what="compiled gradient")


def test_chunk_memory_and_no_reference_gradient(monkeypatch):
    x, w, target, b = make()
    e = extras(x, target)
    rx, rw, _ = e["ref_model"]
    rx.requires_grad_(True)
    shapes = []
    real_empty = torch.empty

    def recording_empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(core.torch, "empty", recording_empty)
    with chunks_of(10):
        out = npu_liger.fused_linear_dpo(x.requires_grad_(True), w, target, None, rx, rw)
    monkeypatch.undo()
    assert (10, V) in shapes and (2 * N_PAIRS * T, V) not in shapes  # one pair (2 x 5 rows) per chunk
    out[0].backward()
    assert x.grad is not None and rx.grad is None


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, t, b: npu_liger.fused_linear_dpo(x[:5], w, t[:5]), ValueError, "even N"),
    (lambda x, w, t, b: npu_liger.fused_linear_dpo(x[0], w, t), ValueError, "input must be 3-D"),
    (lambda x, w, t, b: npu_liger.fused_linear_dpo(x, w.double(), t), TypeError, "weight must be float32"),
    (lambda x, w, t, b: npu_liger.fused_linear_dpo(x, w, t[:, :2]), ValueError, "target must have shape"),
    (lambda x, w, t, b: npu_liger.fused_linear_dpo(x, w, t, None, x), ValueError, "ref_input and ref_weight"),
    (lambda x, w, t, b: npu_liger.fused_linear_simpo(x, w, t, None, -100, 0.1, 1.0, 2.0), ValueError,
     "label_smoothing"),
    (lambda x, w, t, b: npu_liger.fused_linear_kto(x, w, t, torch.ones(2, dtype=torch.bool)), ValueError,
     "preference_labels must have shape"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call(*make())
