"""fused_linear_dpo, _orpo, _simpo, _cpo, _kto against float64 references written from the papers' formulas (with
Liger's conventions: masking by ignore_index, sum or mean log-probabilities, the NLL of the chosen sequences, the
metrics' definitions), chunks shrunk so every loop turns, gradients of input, weight and bias, opcheck, compile."""

from typing import NamedTuple
from unittest import mock

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops._preference as core
from checklist import (DEVICE, RecordedEmptyShapes, assert_close, assert_rounded_grad_close, chunked_rounding_size,
                       randn, rounded_logit_grads_sizes, run_opcheck)
from op_cases import kto_reference, pair_reference
from op_cases import preference_sequence_logps as seq_logps
from op_cases import preference_token_logps as token_logps

N_PAIRS, T, H, V = 3, 5, 8, 13


def make(n_pairs=N_PAIRS, dtype=torch.float32, seq=T, hidden=H, vocab=V):
    x = randn((2 * n_pairs, seq, hidden), dtype)
    w = randn((vocab, hidden), dtype, scale=0.4)
    b = randn((vocab,), dtype)
    target = torch.randint(0, vocab, (2 * n_pairs, seq), device=DEVICE)
    target[torch.rand(target.shape, device=DEVICE) < 0.3] = -100
    return x, w, target, b


def chunks_of(rows):
    return mock.patch.object(core, "chunk_rows", lambda n_rows, hidden, vocab: rows)


ORPO_BETA = 0.2
FP32_UNIT = 2.0**-24  # fp32's unit roundoff, what the floors below count in
CALLS = {  # name -> (our call, reference call) of (x, w, target, b, extra)
    "dpo": (lambda x, w, t, b, e: npu_liger.fused_linear_dpo(x, w, t, b, *e["ref_model"], None, None, -100, 0.2,
                                                             0.1, True, 0.5, False),
            lambda x, w, t, b, e: pair_reference("dpo", x, w, t, b, e["ref64"], 0.2, 0.1, True, 0.5, False)),
    "dpo_precomputed_ref_avg": (
        lambda x, w, t, b, e: npu_liger.fused_linear_dpo(x, w, t, b, None, None, None, *e["ref_logps"], -100, 0.3,
                                                         0.0, False, 1.0, True),
        lambda x, w, t, b, e: pair_reference("dpo", x, w, t, b, [r.double() for r in e["ref_logps"]], 0.3, 0.0,
                                             False, 1.0, True)),
    "orpo": (lambda x, w, t, b, e: npu_liger.fused_linear_orpo(x, w, t, b, -100, ORPO_BETA, True),
             lambda x, w, t, b, e: pair_reference("orpo", x, w, t, b, None, ORPO_BETA, nll=True, average=True)),
    "simpo": (lambda x, w, t, b, e: npu_liger.fused_linear_simpo(x, w, t, b, -100, 2.0, 0.7, 0.1, True, 0.5),
              lambda x, w, t, b, e: pair_reference("simpo", x, w, t, b, None, 2.0, 0.1, True, 0.7, True, 0.5)),
    "cpo": (lambda x, w, t, b, e: npu_liger.fused_linear_cpo(x, w, t, b, -100, 0.1, 1.0, 0.0, True, False),
            lambda x, w, t, b, e: pair_reference("cpo", x, w, t, b, None, 0.1, 0.0, True, 1.0, False)),
    "kto": (lambda x, w, t, b, e: npu_liger.fused_linear_kto(x, w, t, e["labels"], b, *e["ref_model"], None,
                                                             e["kl"], -100, 0.3, False),
            lambda x, w, t, b, e: kto_reference(x, w, t, e["labels"], b, e["ref64_seq"], e["kl"].double(), 0.3)),
}


def extras(x, target, vocab=V):
    rx, rw = randn((x.shape[0], x.shape[1], 6)), randn((vocab, 6), scale=0.4)
    lp, valid, _ = token_logps(rx.double(), rw.double(), None, target)
    s = seq_logps(lp, valid, False)
    n = x.shape[0] // 2
    return {"ref_model": (rx, rw, None), "ref64": (s[:n], s[n:]), "ref64_seq": s,
            "ref_logps": (randn((n,)) - 5.0, randn((n,)) - 5.0),
            "labels": torch.rand(x.shape[0], device=DEVICE) < 0.5, "kl": randn(()).abs()}


def check_against_float64(name, x, w, target, b, e, rows):
    """One loss of CALLS in fp32, chunks of ``rows`` rows (None: the package's policy), against its float64
    reference: every output and the gradients of input, weight and bias."""
    ours, ref = CALLS[name]
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    with chunks_of(rows) if rows else mock.patch.object(core, "chunk_rows", core.chunk_rows):
        out = ours(leaves[0], leaves[1], target, leaves[2], e)
    (out[0] * 1.3).backward()
    leaves64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    want = ref(leaves64[0], leaves64[1], target, leaves64[2], e)
    (want[0] * 1.3).backward()
    assert len(out) == len(want)
    output_floors = {**_logits_sum_floors(name, x, w, b, e), **_log_prob_floors(name, x, w, b, target, e)}
    for i, (o, r) in enumerate(zip(out, want)):
        assert o.dtype == torch.float32
        assert_close(o, r, what=f"{name} output {i}", floor=output_floors.get(i, 0.0))
    sequence_rel = (_orpo_conditioning(*_sequence_bounds(x, w, b, target, True)).coefficient if name == "orpo"
                    else None)
    floors = _gradient_cancellation_floors(ref, x, w, b, target, e, sequence_rel)
    for what, got, r, floor in zip(("input", "weight", "bias"), leaves, leaves64, floors):
        assert_close(got.grad, r.grad, what=f"{name} grad {what}", floor=floor)


def _logits_sum_floors(name, x, w, b, e):
    """{output index: floor} for the metrics that sum logits (outputs 3 and 4: the chosen and rejected logits'
    means, KTO's sums over its desirable and undesirable sequences): random logits of both signs cancel in the
    sum, so fp32's error is relative to the sum of |x[r, h] * w[v, h]| + |b[v]| (8 unit roundoffs per term: the
    dot products and the sum), not to the sum itself (a drawn dpo case: 4.9e-4 against the fixed 1e-5)."""
    abs_logits = (x.detach().double().abs() @ w.detach().double().abs().T + b.detach().double().abs()).sum((1, 2))
    logits = (x.detach().double() @ w.detach().double().T + b.detach().double()).sum((1, 2))
    n = x.shape[0] // 2
    chosen = e["labels"] if name == "kto" else torch.arange(x.shape[0], device=x.device) < n

    def floor(rows):
        return _ratio(8 * FP32_UNIT * abs_logits[rows].sum(), logits[rows].sum())
    return {3: floor(chosen), 4: floor(~chosen)}


def _ratio(bound, value):
    """A floor: |bound| over |value|, norm-wise (the error bound of a value, per element, over the value)."""
    return float(bound.norm() / value.norm().clamp_min(1e-300))


AVERAGED = ("dpo_precomputed_ref_avg", "orpo", "simpo")  # CALLS that average log-probabilities over valid tokens


def _sequence_bounds(x, w, b, target, average):
    """Per sequence, in float64: (a bound on fp32's error in its log-probability, the log-probability), summed or
    averaged over its valid tokens as the call does. A token's log-probability is a logit minus a logsumexp of
    about its size, so near 0 (a confident token) fp32's error is relative to the logits, not to it: 8 unit
    roundoffs of the largest |logit| bound (sum of |x[h] * w[v, h]| + |b[v]|) and of the token's own value."""
    x64, w64 = x.detach().double(), w.detach().double()
    b64 = None if b is None else b.detach().double()
    lp, valid, _ = token_logps(x64, w64, b64, target)
    mag = x64.abs() @ w64.abs().T + (0.0 if b64 is None else b64.abs())
    valid = valid.to(lp.dtype)
    err, logps = 8 * FP32_UNIT * ((mag.amax(-1) + lp.abs()) * valid).sum(-1), (lp * valid).sum(-1)
    if average:
        count = valid.sum(-1).clamp_min(1)
        err, logps = err / count, logps / count
    return err, logps


def _log_prob_floors(name, x, w, b, target, e):
    """{output index: floor} for the sequences' log-probabilities (pairs: outputs 1 and 2, and the chosen ones' NLL,
    5; KTO: their sums over the desirable and undesirable sequences, 1 and 2) and the rewards (pairs: 6 and 7;
    KTO: 5 and 6), from ``_sequence_bounds`` (a drawn simpo case: 9.0e-5 against the fixed 1e-5 for a
    log-probability of -6e-4).
    Rewards subtract the reference log-probabilities: the reference model's bound where ours computes it (its fp32
    inputs), and the two cancel where they are close (a drawn case with precomputed ones near -5: 1.6e-5)."""
    average = name in AVERAGED
    err, logps = _sequence_bounds(x, w, b, target, average)
    if name in ("dpo", "kto"):
        ref_err, ref_logps = _sequence_bounds(*e["ref_model"], target, average)
    elif name == "dpo_precomputed_ref_avg":
        ref_logps = torch.cat(e["ref_logps"]).double()
        ref_err = torch.zeros_like(ref_logps)
    else:
        ref_logps = ref_err = torch.zeros_like(logps)
    reward_err = err + ref_err + 4 * FP32_UNIT * (logps.abs() + ref_logps.abs())  # + the subtraction's rounding
    if name == "kto":
        labels = e["labels"]

        def split_floor(bound, value):
            return (_ratio(bound[labels].sum(), value[labels].sum()),
                    _ratio(bound[~labels].sum(), value[~labels].sum()))

        return dict(zip((1, 2, 5, 6), (*split_floor(err, logps), *split_floor(reward_err, logps - ref_logps))))
    n = x.shape[0] // 2
    halves = (slice(0, n), slice(n, None))
    floors = {1 + i: _ratio(err[h], logps[h]) for i, h in enumerate(halves)}
    floors.update({6 + i: _ratio(reward_err[h], (logps - ref_logps)[h]) for i, h in enumerate(halves)})
    # output 5, the chosen sequences' NLL: their tokens' log-probabilities summed (a drawn single token: 1.9e-5)
    sum_err, sums = _sequence_bounds(x, w, b, target, False) if average else (err, logps)
    floors[5] = _ratio(sum_err[:n].sum(), sums[:n].sum())
    if name == "orpo":  # in AVERAGED: err and logps are ORPO's averages
        floors.update(_orpo_floors(_orpo_conditioning(err, logps)))
    return floors


class OrpoConditioning(NamedTuple):
    coefficient: torch.Tensor  # per sequence: relative error bound of its gradient coefficient
    log_odds: torch.Tensor  # per pair: log_odds, and the error bound of it
    log_odds_error: torch.Tensor


def _orpo_conditioning(err, logps):
    """How fp32's errors ``err`` in ORPO's average log-probabilities ``logps`` (``_sequence_bounds``: c chosen, r
    rejected) grow: log_odds = (c - r) - (log(1 - e^c) - log(1 - e^r)) moves by d / (1 - e^c) for an error d in c,
    which is large where c nears 0 (a confident sequence), and so does the gradient coefficient
    -beta * sigmoid(-log_odds) / (1 - e^c) (relative: d e^c / (1 - e^c) from the denominator, sigmoid(log_odds)
    times log_odds' error from the numerator). Drawn cases: a log_odds mean off by 1.4e-5 and an input gradient
    by 3.3e-5, against the fixed 1e-5. Per sequence: its bound plus 8 unit roundoffs of |log(1 - e^c)|, over
    1 - e^c."""
    log_rest = torch.log1p(-torch.exp(logps))
    per_seq = (err + 8 * FP32_UNIT * log_rest.abs()) / (1.0 - torch.exp(logps))
    n = logps.shape[0] // 2
    log_odds_error = per_seq[:n] + per_seq[n:]
    log_odds = (logps[:n] - logps[n:]) - (log_rest[:n] - log_rest[n:])
    coefficient = per_seq + (torch.sigmoid(log_odds) * log_odds_error).repeat(2)
    return OrpoConditioning(coefficient, log_odds, log_odds_error)


def _orpo_floors(cond: "OrpoConditioning"):
    """{output index: floor} for ORPO's loss (0; its NLL part, not ill-conditioned, left out of the size, so the
    floor is larger than needed) and its metrics, the means over pairs of logsigmoid(log_odds) (8) and of log_odds
    (9), where log_odds of both signs cancel: ``_orpo_conditioning``'s bounds summed like the means, over them."""
    slope_weighted = (torch.sigmoid(-cond.log_odds) * cond.log_odds_error).sum()  # logsigmoid's slope <= 1
    log_sigmoid = torch.nn.functional.logsigmoid(cond.log_odds).sum()
    return {0: _ratio(slope_weighted, log_sigmoid), 8: _ratio(slope_weighted, log_sigmoid),
            9: _ratio(cond.log_odds_error.sum(), cond.log_odds.sum())}


def _gradient_cancellation_floors(ref, x, w, b, target, e, sequence_rel=None):
    """The relative errors that summing fp32 terms allows for the gradients of input, weight and bias (each a sum
    over logits' gradients g: of g[r, v] * w[v, :] over v, of g[r, v] * x[r, :] over r, of g[r, v] over r): 8 fp32
    unit roundoffs per term (g itself comes out of softmax, the loss's coefficient and a product) times the sum of
    |terms| over |sum|, norm-wise. Chosen and rejected rows pull the other way, so with a vocabulary of two the
    bias gradient can cancel to a small fraction of its terms (a drawn case: 1.5e-5 against the fixed 1e-5).
    ``sequence_rel``: per sequence, a relative error its rows' g carry on top (ORPO's ill-conditioned coefficient,
    ``_orpo_conditioning``)."""
    g = _logit_grads64(ref, x, w, b, target, e)
    x2 = x.detach().double().reshape(-1, x.shape[-1])
    w64 = w.detach().double()
    rel = torch.full((g.shape[0], 1), 8 * FP32_UNIT, dtype=g.dtype, device=g.device)
    if sequence_rel is not None:
        rel = rel + sequence_rel.repeat_interleave(x.shape[1])[:, None]
    g_err = rel * g.abs()
    return (_ratio(g_err @ w64.abs(), g @ w64), _ratio(g_err.T @ x2.abs(), g.T @ x2),
            _ratio(g_err.sum(0), g.sum(0)))


@pytest.mark.parametrize("rows", [None, 5, 11])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_matches_float64_reference(name, rows):
    x, w, target, b = make()
    give_orpo_a_valid_token(name, target, V)
    check_against_float64(name, x, w, target, b, extras(x, target), rows)


def give_orpo_a_valid_token(name, target, vocab):
    """ORPO's odds p / (1 - p) of a sequence of probability 1 are infinite (its loss is NaN or inf, as Liger's and
    the formula's): a sequence with no valid token (log-probability 0) is left out for it, by making every
    sequence's first token valid. (``make`` ignores each token with probability 0.3: all of a sequence's 5 in
    0.24% of sequences.)"""
    if name == "orpo":
        target[:, 0] = torch.randint(0, vocab, (target.shape[0],), device=DEVICE)


@given(name=st.sampled_from(sorted(CALLS)), n_pairs=st.integers(1, 4), seq=st.integers(1, 9),
       hidden=st.sampled_from([1, 3, 16, 33]), vocab=st.sampled_from([1, 2, 7, 130]),
       rows=st.sampled_from([None, 1, 4, 9]))
def test_shapes_match_float64_reference(name, n_pairs, seq, hidden, vocab, rows):
    """Every loss over drawn shapes (one token, one vocabulary entry, a hidden size of 1, chunks of one row or of
    a part of a pair), fresh inputs each draw. ORPO leaves out a vocabulary of one and a sequence with no valid
    token (a sequence probability of 1 either way: ``give_orpo_a_valid_token``)."""
    assume(name != "orpo" or vocab > 1)
    x, w, target, b = make(n_pairs, seq=seq, hidden=hidden, vocab=vocab)
    give_orpo_a_valid_token(name, target, vocab)
    check_against_float64(name, x, w, target, b, extras(x, target, vocab), rows)


def _logit_grads64(ref, x, w, b, target, e):
    """d loss / d logits (N * T, V) in float64: the reference run on the logits themselves (input = the float64
    logits, weight = the identity, no bias), which the rounding sizes of the gradients are computed from."""
    logits = (x.double() @ w.double().T + b.double()).detach().requires_grad_(True)
    eye = torch.eye(w.shape[0], dtype=torch.float64, device=DEVICE)
    (grad,) = torch.autograd.grad(ref(logits, eye, target, None, e)[0], logits)
    return grad.reshape(-1, w.shape[0])


def _pair_chunk_order(rows, n_seq, seq_len):
    """The flattened rows in the order the chunk loop visits them: pair i's chosen rows, then its rejected rows."""
    n_pairs = n_seq // 2
    order = torch.cat([torch.arange(s * seq_len, (s + 1) * seq_len) for i in range(n_pairs) for s in (i, n_pairs + i)])
    return rows[order.to(rows.device)]


@pytest.mark.parametrize("name", ["dpo", "simpo", "kto"])
def test_bfloat16_against_the_eager_bfloat16_reference(name):
    """bf16 against the unfused formula run in bf16 (logits and their gradient in bf16, the loss in fp32), both
    against float64. The loss: our fp32 loss is stored to bf16 for the comparison, on top of the bf16 logits'
    rounding, so two roundings. The gradients round more than the unfused run's where the chunks accumulate
    grad_weight in bf16 (one rounding of the running sum per chunk, ``chunked_rounding_size``) and where the
    bf16 dlogits feed grad_input and grad_bias (``rounded_logit_grads_sizes``); before, twice the eager run's
    error failed about 1 draw in 40 (dpo's loss at 4.5e-3 against 3.9e-3, simpo's gradient at 7.05e-3 against
    6.98e-3)."""
    x, w, target, b = make(dtype=torch.bfloat16)
    e = extras(x, target)
    e["ref_model"] = tuple(None if t is None else t.bfloat16() for t in e["ref_model"])
    ours, ref = CALLS[name]
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    chunk = 5 if name == "kto" else 2 * T  # chunks_of(5): one sequence per chunk, or one pair of sequences
    with chunks_of(5):
        out = ours(*leaves[:2], target, leaves[2], e)
    out[0].backward()
    lp = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]  # the unfused formula on bf16 logits
    want_lp = ref(lp[0], lp[1], target, lp[2], {**e, "ref64": tuple(r.float() for r in e["ref64"]),
                                                "ref64_seq": e["ref64_seq"].float()})
    want_lp[0].backward()
    l64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    want = ref(l64[0], l64[1], target, l64[2], e)
    want[0].backward()
    assert_close(out[0].bfloat16(), want[0], want_lp[0].bfloat16(), what=f"{name} loss", roundings=2)
    g64 = _logit_grads64(ref, x, w, b, target, e)
    x_rows = x.reshape(-1, H)
    if name != "kto":
        g64, x_rows = _pair_chunk_order(g64, *target.shape), _pair_chunk_order(x_rows, *target.shape)
    sizes = dict(rounded_logit_grads_sizes(g64, w), weight=chunked_rounding_size(g64, x_rows, chunk))
    for what, got, eager, r in zip(("x", "weight", "bias"), leaves, lp, l64):
        assert got.grad.dtype == torch.bfloat16
        assert_rounded_grad_close(got.grad, r.grad, eager.grad, sizes[what], f"{name} grad {what}", 0.0)


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


def test_chunk_memory_and_no_reference_gradient():
    x, w, target, b = make()
    e = extras(x, target)
    rx, rw, _ = e["ref_model"]
    rx.requires_grad_(True)
    with chunks_of(10), RecordedEmptyShapes(core) as shapes:
        out = npu_liger.fused_linear_dpo(x.requires_grad_(True), w, target, None, rx, rw)
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


def test_orpo_log1mexp_keeps_full_precision_near_zero():
    """ORPO's log(1 - e^c) for c from -1e-7 to -80 (a confident sequence has c near 0, where log1p(-exp(c)) of a
    rounded e^c keeps few digits: 3e-4 relative at c = -1e-6, 1e-2 at -1e-7) within 4 fp32 unit roundoffs of float64."""
    from npu_liger.npu_ops.fused_linear_orpo import _log1mexp
    c = -torch.logspace(-7, 1.9, 400, device=DEVICE)
    want = torch.log1p(-torch.exp(c.double()))
    assert float(((_log1mexp(c).double() - want) / want).abs().max()) <= 4 * FP32_UNIT
