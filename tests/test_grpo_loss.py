"""grpo_loss: every loss type against TRL's _compute_loss in float64 (loss, gradient w.r.t. logits, per-token kl,
is_clipped, clip_ratio), logits with and without the extra last position, masks of every dtype, with and without
old/ref log-probabilities, clipping on both sides, temperature, num_items_in_batch, Liger's module arguments,
opcheck, compile without recompiles, tiling loops, no mutation, empty and bad input."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.grpo_loss as grpo_kernels
from npu_liger.npu_ops._triton import flat_plan
from checklist import (DEVICE, FLOAT_DTYPES, assert_close, assert_compiled_forward_backward, assert_no_alias,
                       assert_unchanged, randn, run_opcheck, snapshot)
from op_cases import grpo_loss_reference as reference
from test_jsd import assert_grad_close

grpo_op = torch.ops.npu_liger.grpo_loss.default
with_grad_op = torch.ops.npu_liger.grpo_loss_with_grad.default
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def make_inputs(n_seq, seq_len, vocab, dtype=torch.float32, extra=1, mask_dtype=torch.int64, old=True, ref=True,
                spread=0.3):
    """Logits, ids, advantages, a mask with padded tails, and old/ref log-probabilities near the policy's own (so
    ratios fall on both sides of the clip range: spread is their distance in log space)."""
    logits = randn((n_seq, seq_len + extra, vocab), dtype, scale=2.0)
    ids = torch.randint(0, vocab, (n_seq, seq_len), device=DEVICE)
    advantages = randn((n_seq,))
    lengths = torch.randint(0, seq_len + 1, (n_seq,), device=DEVICE)
    mask = (torch.arange(seq_len, device=DEVICE)[None, :] < lengths[:, None]).to(mask_dtype)
    with torch.no_grad():
        logp = (logits[:, :seq_len].float()).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    old_logp = (logp + randn(logp.shape, scale=spread)) if old else None
    ref_logp = (logp + randn(logp.shape, scale=spread)) if ref else None
    return logits, ids, advantages, mask, old_logp, ref_logp


def _token_logps64(logits64, ids, temperature):
    """The completion tokens' float64 log-probabilities (the logits' extra last position left out)."""
    return (logits64[:, :ids.shape[1]] / temperature).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)


def _ratio_near(logits64, inputs, temperature, bounds):
    """Tokens whose float64 importance ratio lies within 1e-5 of a clip bound."""
    old = inputs[4]
    logp = _token_logps64(logits64, inputs[1], temperature)
    ratio = torch.ones_like(logp) if old is None else torch.exp(logp - old.double())
    return torch.stack([(ratio - b).abs() < 1e-5 for b in bounds]).any(0)


def _coefficient_cancellation_floor(logits64, inputs, temperature, beta, eps_low, eps_high):
    """The relative error fp32 allows the logits' gradient. A token's gradient row is c * (onehot - softmax) with
    c = d loss / d logp = -adv * ratio (unclipped) + beta * (1 - e^(ref - logp)), whose two terms can cancel (a
    drawn token: c 1e-3 of its terms, the gradient off by 2.7e-5 against the fixed 1e-5). fp32's logp is off by a
    few roundings of max|logit / T| + |logp| (and ref - logp, logp - old of their terms), which each term carries
    in proportion: 8 unit roundoffs of (|adv| ratio + |beta| (e^(ref - logp) + 1)) times (1 + those sizes), over
    |c|. onehot - softmax cancels where the target's probability nears 1 (a drawn case: 1.5e-5): 16 roundings of
    the sizes over its norm. Per row, norm-wise over the rows, weighted by their size."""
    ids, adv, mask, old, ref = inputs[1], inputs[2], inputs[3], inputs[4], inputs[5]
    seq_len = ids.shape[1]
    grad = logits64.grad[:, :seq_len]
    z = logits64.detach()[:, :seq_len] / temperature
    logp = _token_logps64(logits64.detach(), ids, temperature)
    old = logp if old is None else old.double()
    ratio = torch.exp(logp - old)
    adv = adv.double()[:, None]
    unclipped = ratio * adv <= ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    coef, terms = -adv * ratio * unclipped, adv.abs() * ratio
    sizes = 1.0 + z.abs().amax(-1) + logp.abs() + old.abs()
    if ref is not None and beta != 0.0:
        back = torch.exp(ref.double() - logp)
        coef, terms = coef + beta * (1.0 - back), terms + abs(beta) * (back + 1.0)
        sizes = sizes + ref.double().abs()
    # and onehot - softmax cancels at a confident target (p_t near 1): few roundings of sizes, over its norm
    softmax_part = torch.nn.functional.one_hot(ids, z.shape[-1]).double() - z.softmax(-1)
    bound = 8 * 2.0**-24 * sizes * (terms / coef.abs() + 2.0 / softmax_part.norm(dim=-1))
    row_error = torch.where((mask != 0) & (coef != 0), bound * grad.norm(dim=-1), 0.0)
    return float(row_error.norm() / logits64.grad.norm().clamp_min(1e-300))


def check(inputs, temperature=1.0, beta=0.04, eps_low=0.2, eps_high=0.28, loss_type="dapo", max_len=None,
          num_items=None, grad_scale=1.0):
    logits = inputs[0].detach().requires_grad_(True)
    args = (logits, *inputs[1:], temperature, beta, eps_low, eps_high, loss_type, max_len, num_items)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = snapshot(tensors)
    loss, kl, clipped, clip_ratio = npu_liger.grpo_loss(*args)
    (loss * grad_scale).backward()
    assert_unchanged(before, tensors, [f"argument {i}" for i in range(len(tensors))])
    assert_no_alias((loss, kl, clipped, clip_ratio, logits.grad), tensors)
    logits64 = logits.detach().double().requires_grad_(True)
    to64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args[1:6]]
    ref64 = reference(logits64, *to64, *args[6:])
    (ref64[0] * grad_scale).backward()
    logits_lp = logits.detach().clone().requires_grad_(True)
    ref_lp = reference(logits_lp, *args[1:])
    (ref_lp[0] * grad_scale).backward()
    assert loss.dtype == kl.dtype == clipped.dtype == clip_ratio.dtype == torch.float32
    assert kl.shape == clipped.shape == inputs[1].shape and logits.grad.dtype == logits.dtype
    assert not (kl.requires_grad or clipped.requires_grad or clip_ratio.requires_grad)
    what = f"{loss_type}, T={temperature}, beta={beta}"
    # the loss sums per-token terms of both signs (advantages of either sign): fp32 rounding of the terms bounds
    # its absolute error, not its (possibly tiny) value, so the allowance is 2**-20 of the terms' size (~1e-6)
    scale = (inputs[2].abs().max().item() * (1 + eps_high) + abs(beta) * ref64[1].abs().max().item()
             if inputs[2].numel() else 0.0)
    torch.testing.assert_close(loss.double(), ref64[0].detach(), rtol=1e-5, atol=2.0**-20 * scale * abs(grad_scale),
                               msg=lambda m: f"loss ({what}): {m}")
    if inputs[5] is not None:
        torch.testing.assert_close(kl.double(), ref64[1], rtol=1e-5, atol=1e-6, msg=lambda m: f"kl ({what}): {m}")
    # is_clipped compares a ratio with a bound: a ratio within rounding of one may fall either way
    near_bound = _ratio_near(logits64.detach(), inputs, temperature, (1 - eps_low, 1 + eps_high))
    assert torch.equal(clipped[~near_bound], ref64[2][~near_bound].float()), what
    assert_close(clip_ratio, ref64[3], what=f"clip_ratio ({what})")
    assert_grad_close(logits.grad, logits64.grad, logits_lp.grad, f"grad logits ({what})", float(grad_scale != 1.0),
                      floor=_coefficient_cancellation_floor(logits64, inputs, temperature, beta, eps_low, eps_high))
    if logits.shape[1] > inputs[1].shape[1]:
        assert (logits.grad[:, -1] == 0).all()
    return loss, clipped


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@given(n_seq=st.sampled_from([1, 2, 5]), seq_len=st.sampled_from([1, 3, 8]), vocab=st.sampled_from([1, 7, 130, 1001]),
       dtype=st.sampled_from(FLOAT_DTYPES), extra=st.sampled_from([0, 1]), old=st.booleans(), ref=st.booleans(),
       temperature=st.sampled_from([1.0, 0.7]), mask_dtype=st.sampled_from([torch.int64, torch.bool, torch.float32]))
def test_matches_trl_in_float64(loss_type, n_seq, seq_len, vocab, dtype, extra, old, ref, temperature, mask_dtype):
    beta = 0.04 if ref else 0.0
    check(make_inputs(n_seq, seq_len, vocab, dtype, extra, mask_dtype, old, ref), temperature, beta,
          loss_type=loss_type, grad_scale=1.3)


def test_clipping_on_both_sides_is_reported_and_stops_the_gradient():
    """Ratios far from 1 (spread 1.0) and advantages of both signs: clipped tokens on both sides (check compares
the gradient, which is 0 for a clipped token's policy term)."""
    logits, ids, _, mask, old, ref = make_inputs(6, 8, 50, spread=1.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], device=DEVICE)
    _, clipped = check((logits, ids, adv, torch.ones_like(mask), old, ref), beta=0.0, loss_type="bnpo")
    adv = adv[:, None].expand(clipped.shape)
    assert (clipped.bool() & (adv < 0)).any() and (clipped.bool() & (adv > 0)).any()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_options(loss_type):
    inputs = make_inputs(3, 6, 40)
    check(inputs, beta=0.1, eps_low=0.1, eps_high=0.5, loss_type=loss_type, max_len=10)
    check(inputs, loss_type=loss_type, num_items=torch.tensor(7.0, device=DEVICE))
    check(inputs, loss_type=loss_type, num_items=5)  # a number is made a device tensor by the public function


def test_persistent_grid_strides_over_tokens_and_vocab_tiles(small_ub):
    """A 4 KiB UB: 128-wide tiles for the loss with its gradient (multiplier 8), so a 520-wide row takes 5 tiles;
    5 x 17 = 85 tokens over 40 programs take up to 3 iterations per program."""
    small_ub(4096)
    plan = flat_plan("cpu", 520, grpo_kernels.GRAD_MEMORY_MULTIPLIER)
    assert plan.block == 64 and plan.grid(85) == 40
    for loss_type in LOSS_TYPES:
        check(make_inputs(5, 17, 520), loss_type=loss_type, grad_scale=0.5)
    check(make_inputs(5, 17, 333, torch.bfloat16, extra=0, old=False), beta=0.0, temperature=0.8)


def test_cuda_prefetch_and_reversed_gradient_pass(small_ub, monkeypatch):
    """The CUDA-only prefetch (``CUDA_PREFETCH``) with the reversed gradient pass, forced on under the interpreter,
    which CI never runs otherwise: 64-wide blocks over rows of 520 and 333 columns (a partial last block read first
    by the reversed pass; the prefetch past either end of the row masked off), masked tokens (no load, zeros
    stored), both loss shapes and a temperature."""
    small_ub(4096)
    forced = []

    def everything_on(device_type):
        forced.append(device_type)
        return dict(PREFETCH=True, REVERSE=True)

    monkeypatch.setattr(grpo_kernels, "_switches", everything_on)
    for loss_type in ("grpo", "dapo"):
        check(make_inputs(5, 17, 520), loss_type=loss_type, grad_scale=0.5)
    check(make_inputs(5, 17, 333, torch.bfloat16, extra=0, old=False), beta=0.0, temperature=0.8)
    check(make_inputs(3, 5, 7), beta=0.04)  # a single partial block
    assert forced


def test_masked_tokens_count_for_nothing():
    """A masked token's logits, log-probabilities and ids are never read: garbage there changes nothing."""
    logits, ids, adv, mask, old, ref = make_inputs(3, 6, 20)
    mask[0, 2:] = 0
    out = npu_liger.grpo_loss(logits, ids, adv, mask, old, ref)
    logits2, ids2, old2, ref2 = logits.clone(), ids.clone(), old.clone(), ref.clone()
    logits2[0, 2:6], ids2[0, 2:], old2[0, 2:], ref2[0, 2:] = float("nan"), 10**6, float("nan"), float("inf")
    out2 = npu_liger.grpo_loss(logits2, ids2, adv, mask, old2, ref2)
    for a, b in zip(out, out2):
        assert torch.equal(a, b)


def test_no_valid_token_gives_zero():
    logits, ids, adv, mask, old, ref = make_inputs(2, 4, 9)
    logits.requires_grad_(True)
    for loss_type in LOSS_TYPES:
        loss, kl, clipped, ratio = npu_liger.grpo_loss(logits, ids, adv, torch.zeros_like(mask), old, ref,
                                                       loss_type=loss_type)
        assert loss.item() == 0.0 and ratio.item() == 0.0 and (kl == 0).all() and (clipped == 0).all()
        loss.backward()
        assert (logits.grad == 0).all()
        logits.grad = None


@pytest.mark.parametrize("shape", [(0, 3, 5), (2, 0, 5), (2, 1, 5), (2, 3, 0)])
def test_empty_inputs(shape):
    n_seq, n_pos, vocab = shape
    seq_len = max(n_pos - 1, 0)
    logits = randn(shape, requires_grad=True)
    ids = torch.zeros((n_seq, seq_len), dtype=torch.int64, device=DEVICE)
    loss, kl, clipped, ratio = npu_liger.grpo_loss(logits, ids, randn((n_seq,)), beta=0.0)
    assert kl.shape == (n_seq, seq_len) and ratio.item() == 0.0
    assert loss.item() == 0.0 or (vocab == 0 and seq_len > 0 and loss.isnan())
    loss.backward()
    assert logits.grad.shape == shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    logits, ids, adv, mask, old, ref = make_inputs(2, 5, 33, dtype)
    logits.requires_grad_(True)
    for loss_type in LOSS_TYPES:
        run_opcheck(grpo_op, (logits, ids, adv, mask, old, ref, 0.9, 0.04, 0.2, 0.28, loss_type, None, None))
    run_opcheck(grpo_op, (logits, ids, adv))
    run_opcheck(with_grad_op, (logits.detach(), ids, adv, None, None, ref, 1.0, 0.1, 0.2, 0.2, "grpo", 8,
                               torch.tensor(3.0, device=DEVICE), True))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def make(n):
        logits, ids, adv, mask, old, ref = make_inputs(2, n, 3 * n + 1)
        return logits.requires_grad_(True), ids, adv, mask, old, ref

    def fn(logits, ids, adv, mask, old, ref):
        loss, kl, clipped, ratio = npu_liger.grpo_loss(logits * 1.5, ids, adv, mask, old, ref, 0.9, 0.04)
        return loss * 2.0 + kl.mean() + ratio

    def ref_fn(logits, ids, adv, mask, old, ref):
        loss, kl, clipped, ratio = reference(logits * 1.5, ids, adv, mask, old, ref, 0.9, 0.04)
        return loss * 2.0 + kl.mean() + ratio

    assert_compiled_forward_backward(fn, ref_fn, make, [5, 8, 13])


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode detects host synchronisation")
def test_no_host_synchronisation():
    logits, ids, adv, mask, old, ref = make_inputs(4, 64, 1000)
    logits.requires_grad_(True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for loss_type in LOSS_TYPES:
            npu_liger.grpo_loss(logits, ids, adv, mask, old, ref, loss_type=loss_type)[0].backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_eager_entry_matches_the_dispatched_op():
    logits, ids, adv, mask, old, ref = make_inputs(3, 6, 41)
    results = []
    for fn in (npu_liger.grpo_loss, grpo_op):
        leaf = logits.detach().requires_grad_(True)
        out = fn(leaf, ids, adv, mask, old, ref, 0.9, 0.04, 0.2, 0.28, "grpo", None, None)
        (out[0] * 3.0).backward()
        results.append((*out, leaf.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_module_has_liger_argument_names():
    loss = npu_liger.nn.GRPOLoss(beta=0.1, epsilon_low=0.1, epsilon_high=0.3, loss_type="grpo", temperature=0.9)
    assert "epsilon_high=0.3" in repr(loss)
    inputs = make_inputs(3, 5, 30)
    got = loss(*inputs)
    want = reference(*[t.double() if t is not None and t.is_floating_point() else t for t in inputs], 0.9, 0.1, 0.1,
                     0.3, "grpo")
    assert_close(got[0], want[0])
    with pytest.raises(NotImplementedError, match="importance_sampling_level"):
        npu_liger.nn.GRPOLoss(importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="loss_type must be one of"):
        npu_liger.nn.GRPOLoss(loss_type="ppo")


def test_second_backward_and_double_backward_raise_clear_errors():
    logits, ids, adv, mask, old, ref = make_inputs(2, 3, 9)
    logits.requires_grad_(True)
    loss = npu_liger.grpo_loss(logits, ids, adv, mask, old, ref)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time"):
        loss.backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(npu_liger.grpo_loss(logits, ids, adv, mask, old, ref)[0], logits, create_graph=True)


def _args():
    return list(make_inputs(2, 3, 9))


@pytest.mark.parametrize(
    "change, kwargs, error, match",
    [
        (lambda a: [a[0][0]] + a[1:], {}, ValueError, "logits must be 3-D"),
        (lambda a: [a[0][:, :1]] + a[1:], {}, ValueError, "completion_ids must have shape"),
        (lambda a: [a[0], a[1].float()] + a[2:], {}, TypeError, "completion_ids must be an int32 or int64"),
        (lambda a: a[:2] + [a[2][:1]] + a[3:], {}, ValueError, r"advantages must have shape \(B,\)"),
        (lambda a: a[:3] + [a[3][:, :2]] + a[4:], {}, ValueError, "completion_mask must have shape"),
        (lambda a: a[:4] + [a[4].double()] + a[5:], {}, TypeError, "old_logp must be float32"),
        (lambda a: a[:5] + [None], {"beta": 0.04}, ValueError, "ref_logp is required when beta != 0"),
        (lambda a: a, {"loss_type": "sapo"}, ValueError, "loss_type must be one of"),
        (lambda a: a, {"temperature": 0.0}, ValueError, "temperature must be positive"),
        (lambda a: a, {"max_completion_length": 0}, ValueError, "max_completion_length must be None or >= 1"),
        (lambda a: [a[0], a[1] + 100, a[2], None] + a[4:], {}, ValueError, "out of range"),
    ],
)
def test_bad_input_raises_clear_error(change, kwargs, error, match):
    args = change(_args())
    if match == "out of range" and DEVICE != "cpu":
        pytest.skip("a device-side assert on CUDA")
    with pytest.raises(error, match=match):
        npu_liger.grpo_loss(*args, **kwargs)
