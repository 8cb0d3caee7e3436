"""fused_linear_grpo against a float64 reference written from the GRPO formula (per-token ratio, clipped surrogate,
k3 KL, the loss types' normalisations), with and without a reference and old log-probabilities, temperature,
chunks shrunk so every loop turns, bf16, opcheck, compile, bad input."""

from unittest import mock

import pytest
import torch

import npu_liger
import npu_liger.npu_ops._preference as core
from checklist import DEVICE, assert_close, randn, run_opcheck

B, T, H, V = 3, 5, 8, 13


def reference(x, w, ids, mask, adv, b=None, ref_lp=None, old=None, beta=0.0, lo=0.2, hi=0.2, temp=1.0,
              loss_type="dapo", max_len=None):
    logits = (x @ w.T + (0 if b is None else b)) / temp
    logits = logits if logits.dtype == torch.float64 else logits.float()
    lp = logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    m = (mask != 0).to(lp.dtype)
    ratio = torch.exp(lp - (lp.detach() if old is None else old.to(lp.dtype)))
    a = adv.to(lp.dtype).unsqueeze(-1)
    loss_t = -torch.min(ratio * a, ratio.clamp(1 - lo, 1 + hi) * a)
    kl = torch.zeros_like(lp)
    if beta != 0.0:
        d = ref_lp.to(lp.dtype) - lp
        kl = torch.exp(d) - d - 1
        loss_t = loss_t + beta * kl
    def reduce(v):
        if loss_type == "grpo":
            return ((v * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()
        if loss_type == "dr_grpo":
            return (v * m).sum() / (x.shape[0] * (max_len or x.shape[1]))
        return (v * m).sum() / m.sum().clamp_min(1)

    loss = reduce(loss_t)
    clipped = ((ratio < 1 - lo) & (a < 0)) | ((ratio > 1 + hi) & (a > 0))
    n = m.sum().clamp_min(1)
    # last: the loss's size before cancellation (advantages of both signs), for fp32's relative floor
    return loss, ((kl * m).sum() / n).detach(), ((clipped * m).sum() / n).detach(), reduce(loss_t.abs()).detach()


def ref_logps64(rx, rw, ids, temp):
    return ((rx.double() @ rw.double().T) / temp).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def make(b=B, dtype=torch.float32, t=T):
    x = randn((b, t, H), dtype)
    w = randn((V, H), dtype, scale=0.4)
    bias = randn((V,), dtype)
    ids = torch.randint(0, V, (b, t), device=DEVICE)
    mask = (torch.rand((b, t), device=DEVICE) > 0.3).long()
    mask[0] = 0  # one sequence with no token
    adv = randn((b,))
    return x, w, ids, mask, adv, bias


def chunks_of(rows):
    return mock.patch.object(core, "chunk_rows", lambda n_rows, hidden, vocab: rows)


@pytest.mark.parametrize("rows", [None, 4])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("ref_kind", ["none", "model", "logps"])
@pytest.mark.parametrize("with_old, temp", [(False, 1.0), (True, 0.7)])
def test_matches_float64_reference(rows, loss_type, ref_kind, with_old, temp):
    x, w, ids, mask, adv, bias = make()
    rx, rw = randn((B, T, 6)), randn((V, 6), scale=0.4)
    ref64 = ref_logps64(rx, rw, ids, temp)
    old = ref64.float() + 0.3 * randn((B, T)) if with_old else None
    beta = 0.0 if ref_kind == "none" else 0.2
    kwargs = dict(beta=beta, epsilon_low=0.2, epsilon_high=0.28, temperature=temp, loss_type=loss_type,
                  max_completion_length=7 if loss_type == "dr_grpo" else None)
    model = dict(ref_input=rx, ref_weight=rw) if ref_kind == "model" else \
        dict(ref_per_token_logps=ref64.float()) if ref_kind == "logps" else {}
    leaves = [t.detach().requires_grad_(True) for t in (x, w, bias)]
    with chunks_of(rows) if rows else mock.patch.object(core, "chunk_rows", core.chunk_rows):
        out = npu_liger.fused_linear_grpo(leaves[0], leaves[1], ids, mask, adv, leaves[2],
                                          old_per_token_logps=old, **model, **kwargs)
    (out[0] * 1.3).backward()
    l64 = [t.detach().double().requires_grad_(True) for t in (x, w, bias)]
    want = reference(l64[0], l64[1], ids, mask, adv, l64[2], ref64, None if old is None else old.double(), beta,
                     0.2, 0.28, temp, loss_type, kwargs["max_completion_length"])
    (want[0] * 1.3).backward()
    cancellation = 1e-5 * want[3].item() / max(abs(want[0].item()), 1e-30)  # fp32 roundings of |terms|
    for i, (o, r) in enumerate(zip(out, want)):
        assert o.dtype == torch.float32 and o.shape == ()
        assert_close(o, r, what=f"output {i}", floor=cancellation if i == 0 else 0.0)
    for what, got, r in zip(("input", "weight", "bias"), leaves, l64):
        assert_close(got.grad, r.grad, what=f"grad {what}")


def test_bfloat16_against_the_eager_bfloat16_reference():
    x, w, ids, mask, adv, bias = make(dtype=torch.bfloat16)
    leaves = [t.detach().requires_grad_(True) for t in (x, w, bias)]
    with chunks_of(5):
        out = npu_liger.fused_linear_grpo(leaves[0], leaves[1], ids, mask, adv, leaves[2], beta=0.0)
    out[0].backward()
    lp = [t.detach().clone().requires_grad_(True) for t in (x, w, bias)]
    want_lp = reference(lp[0], lp[1], ids, mask, adv, lp[2])
    want_lp[0].backward()
    l64 = [t.detach().double().requires_grad_(True) for t in (x, w, bias)]
    want = reference(l64[0], l64[1], ids, mask, adv, l64[2])
    want[0].backward()
    assert_close(out[0].bfloat16(), want[0], want_lp[0].bfloat16(), what="loss")
    for got, r in zip(leaves, l64):  # loose: dlogits in bf16 and grad_weight accumulated in bf16 (see the
        assert got.grad.dtype == torch.bfloat16  # preference test's rounding-size bound); structure via fp32
        err = (got.grad.double() - r.grad).norm() / r.grad.norm().clamp_min(1e-30)
        assert err < 8 * 2.0**-8, f"bf16 gradient relative error {err:.3e}"


def test_opcheck_and_compile_without_recompiles():
    x, w, ids, mask, adv, bias = make(2)
    ref = randn((2, T)) - 3.0
    with chunks_of(5):
        run_opcheck(torch.ops.npu_liger.fused_linear_grpo.default,
                    (x.requires_grad_(True), w.requires_grad_(True), ids, mask, adv, bias.requires_grad_(True),
                     None, None, None, ref))
    compiled = torch.compile(lambda *a: npu_liger.fused_linear_grpo(*a, beta=0.0, loss_type="grpo")[0] * 2.0,
                             fullgraph=True, dynamic=True)
    torch._dynamo.reset()
    for i, b in enumerate((3, 4, 6)):
        x, w, ids, mask, adv, bias = make(b, t=7)
        leaves = [t.detach().requires_grad_(True) for t in (x, w, bias)]
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(leaves[0], leaves[1], ids, mask, adv, leaves[2])
        out.backward()
        l64 = [t.detach().double().requires_grad_(True) for t in (x, w, bias)]
        want = reference(l64[0], l64[1], ids, mask, adv, l64[2], loss_type="grpo")[0] * 2.0
        want.backward()
        assert_close(out, want, what="compiled loss")
        for got, r in zip(leaves, l64):
            assert_close(got.grad, r.grad, what="compiled gradient")


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m, a), ValueError, "beta != 0"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m, a[:2], beta=0.0), ValueError,
     "advantages must have shape"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m[:, :2], a, beta=0.0), ValueError,
     "attention_mask must have shape"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m, a, beta=0.0, loss_type="x"), ValueError,
     "loss_type"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m, a, beta=0.0, temperature=0.0), ValueError,
     "temperature"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w, i, m, a, old_per_token_logps=a, beta=0.0),
     ValueError, "old_per_token_logps must have shape"),
    (lambda x, w, i, m, a, b: npu_liger.fused_linear_grpo(x, w.double(), i, m, a, beta=0.0), TypeError,
     "weight must be"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call(*make())
