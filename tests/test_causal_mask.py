"""npu_liger.transformers' causal-mask patch: while torch.compile traces a training batch without padding or
explicit positions, SDPA gets ``attn_mask=None, is_causal=True`` (as in eager mode), the compiled model gives the
eager model's loss and gradients, and torch.export, padding masks, packed positions and sliding windows keep
transformers' own answer.

The SDPA call's arguments are read from the graph Dynamo hands its backend, so the check does not depend on which
kernel a device picks. fp32 throughout: the masked and the causal formula are the same sums, so the compiled and
eager results agree to fp32 rounding (FP32_RTOL).

Whether the installed transformers refuses the skip while compiling depends on its version and torch's (5.17
always; 5.24 on torch < 2.14). So every test runs twice: on the installed function, and on a stand-in with 5.17's
behaviour (no skip while Dynamo traces), which the patch must override: that second run fails without the patch
on any version.
"""

from __future__ import annotations

import functools

import pytest
import torch

from checklist import DEVICE, FP32_RTOL, rel_error

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")
import npu_liger.transformers as nlt  # noqa: E402
from npu_liger.transformers import causal_mask  # noqa: E402


pytestmark = pytest.mark.filterwarnings("ignore:npu_liger.*nothing was patched")  # only this patch is asked for


@pytest.fixture(params=["installed", "refuses_while_compiling"])
def transformers_mask_function(request, monkeypatch):
    """transformers' ``_ignore_causal_mask_sdpa`` as installed, or with transformers 5.17's refusal to skip the
    mask whenever Dynamo traces."""
    installed = masking_utils._ignore_causal_mask_sdpa
    if request.param == "refuses_while_compiling":
        @functools.wraps(installed)  # the same signature, which the patch reads
        def refuses(*args, **kwargs):
            return False if torch.compiler.is_compiling() else installed(*args, **kwargs)

        monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", refuses)
    return masking_utils._ignore_causal_mask_sdpa


@pytest.fixture
def patched(transformers_mask_function):
    assert causal_mask.patch_causal_mask(), "transformers' masking_utils is not of the form the patch knows"
    yield
    causal_mask.restore_causal_mask()


def _skip_decision(*args, **kwargs):
    """Compiled (fullgraph) answer of transformers' ``_ignore_causal_mask_sdpa``: looked up at call time, as
    ``sdpa_mask`` does, and returned through the graph's output."""
    def decide(x):
        return x + 1 if masking_utils._ignore_causal_mask_sdpa(*args, **kwargs) else x - 1

    torch._dynamo.reset()
    out = torch.compile(decide, backend="eager", fullgraph=True)(torch.zeros(()))
    return bool(out > 0)


def test_compiled_answer_is_the_eager_answer(patched):
    for q_length, kv_length in ((7, 7), (1, 9)):
        eager = masking_utils._ignore_causal_mask_sdpa(None, q_length, kv_length, 0, 0)
        assert eager is True
        assert _skip_decision(None, q_length, kv_length, 0, 0) is True


def test_padding_masks_and_sliding_windows_keep_transformers_answer(patched):
    original = masking_utils._ignore_causal_mask_sdpa._npu_liger_wraps
    padding = torch.ones(2, 8, dtype=torch.bool)
    padding[0, 0] = False
    # a real padding mask: transformers' function decides (eagerly: it reads the values; no skip)
    assert masking_utils._ignore_causal_mask_sdpa(padding, 8, 8, 0, 0) is original(padding, 8, 8, 0, 0) is False
    # a sliding window shorter than the sequence needs its mask, compiled or not
    assert _skip_decision(None, 8, 8, 0, 0, local_attention_size=4) is False
    assert _skip_decision(None, 8, 8, 0, 0, local_attention_size=16) is True


def test_export_keeps_the_mask(patched):
    """An exported graph would keep is_causal for every later input: under torch.export the patch defers to
    transformers, whose answer there is no."""
    class Decide(torch.nn.Module):
        def forward(self, x):
            return x + 1 if masking_utils._ignore_causal_mask_sdpa(None, 8, 8, 0, 0) else x - 1

    program = torch.export.export(Decide(), (torch.zeros(2),))
    assert torch.equal(program.module()(torch.zeros(2)), torch.full((2,), -1.0))


def test_unpatch_and_revert_restore_transformers_function(transformers_mask_function):
    original = transformers_mask_function
    model = _llama()
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False)
    assert causal_mask.causal_mask_patched()
    assert "attention" in str(nlt.patch_report(model))
    nlt.unpatch(model)
    assert masking_utils._ignore_causal_mask_sdpa is original
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False)
    nlt.revert()
    assert masking_utils._ignore_causal_mask_sdpa is original
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False, causal_mask=False)
    assert masking_utils._ignore_causal_mask_sdpa is original
    assert "forward" not in vars(model.model)  # the decoder model's default-positions mark is off too


def test_family_patch_marks_models_built_afterwards(transformers_mask_function):
    nlt.apply_npu_liger_to_llama(rope=False, mlp=False, norm=False, loss=False)
    try:
        model = _llama()
        assert "forward" in vars(model.model) and "forward" not in vars(model)
        assert causal_mask.causal_mask_patched()
    finally:
        nlt.revert()
    assert masking_utils._ignore_causal_mask_sdpa is transformers_mask_function


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, attn_implementation="sdpa",
                                      use_cache=False)  # training: no cache, so transformers looks for packing
    return transformers.LlamaForCausalLM(config).to(DEVICE).train()


class _SdpaCalls:
    """A Dynamo backend that records the attention arguments of every SDPA call in the graph, then runs it."""

    def __init__(self):
        self.calls = []

    def __call__(self, gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
                self.calls.append((node.kwargs.get("attn_mask"), node.kwargs.get("is_causal", False)))
        return gm.forward


def _loss_and_grads(run, model, ids, mask, positions):
    model.zero_grad(set_to_none=True)
    loss = run(input_ids=ids, attention_mask=mask, position_ids=positions, labels=ids).loss
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("batch", ["plain", "padding_mask", "packed_positions", "plain_positions"])
def test_compiled_model_runs_causal_sdpa_and_matches_eager(batch, transformers_mask_function):
    model = _llama()
    ids = torch.randint(3, 64, (2, 8), device=DEVICE)
    mask = positions = None
    if batch == "padding_mask":
        mask = torch.ones(2, 8, dtype=torch.long, device=DEVICE)
        mask[1, :3] = 0  # left padding in the second row
    elif batch == "packed_positions":  # two sequences (5 + 3 tokens) packed in each row
        positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2], device=DEVICE).expand(2, 8)
    elif batch == "plain_positions":  # given explicitly: transformers' packing test decides (compiled: a mask)
        positions = torch.arange(8, device=DEVICE).expand(2, 8)
    expected = _loss_and_grads(model, model, ids, mask, positions)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False)  # only the causal-mask patch
    try:
        backend = _SdpaCalls()
        torch._dynamo.reset()
        got = _loss_and_grads(torch.compile(model, backend=backend, fullgraph=True), model, ids, mask, positions)
    finally:
        nlt.unpatch(model)
    assert len(backend.calls) == 2  # one per layer
    for attn_mask, is_causal in backend.calls:
        if batch == "plain":
            assert attn_mask is None and is_causal is True
        elif batch != "plain_positions":  # padding and packing must reach attention: transformers' mask tensor
            assert attn_mask is not None
    for e, g in zip(expected, got):
        assert rel_error(g, e) <= FP32_RTOL


def test_marked_model_pickles_and_deep_copies():
    """The decoder model's marked forward belongs to its model: a deep copy (or an unpickled model) runs its own
    weights, and gives the loss of the unpatched copy."""
    import copy
    import pickle

    model = _llama()
    ids = torch.randint(3, 64, (2, 8), device=DEVICE)
    nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False)
    try:
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            with torch.no_grad():
                clone.model.embed_tokens.weight.mul_(2.0)  # the clone differs from the original
                expected = model(input_ids=ids, labels=ids).loss
                got = clone(input_ids=ids, labels=ids).loss
            assert "forward" in vars(clone.model)
            assert not torch.equal(got, expected), "the clone's forward ran the original model"
            nlt.unpatch(clone)
            with torch.no_grad():
                assert torch.equal(clone(input_ids=ids, labels=ids).loss, got)
            nlt.apply_to_model(model, rope=False, mlp=False, norm=False, loss=False)  # unpatch(clone) restored it
    finally:
        nlt.unpatch(model)
