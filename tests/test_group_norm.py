"""group_norm: ``F.group_norm`` against float64 (half precision against torch's own half-precision group norm),
every affine variant, fp32 parameters with half x, groups that fit one tile and groups looped in chunks of
channels and positions, large means, opcheck, compile, determinism, empty and bad input, the nn module (torch's
state dicts, ``from_torch``) and the per-instance patch of ``torch.nn.GroupNorm`` (a tiny module tree, and
transformers' Wav2Vec2 feature encoder)."""

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import npu_liger
from checklist import DEVICE, FLOAT_DTYPES, assert_close, randn, run_opcheck
from norm_checks import assert_compiled_matches_eager, check_op
from npu_liger.npu_ops import group_norm as gn_kernels
from npu_liger.transformers.norms import norm_summary, patch_norms

# (num_groups, channels per group) and spatial shapes: 1 channel per group (instance norm), 1 group (layer norm
# over C x HW), odd sizes; groups of fewer than 3 elements are left out (their normalised values are fixed, so the
# x gradient is all cancellation).
GROUPS = st.sampled_from([(1, 1), (1, 6), (3, 2), (4, 1), (2, 5), (8, 4)])
SPATIAL = st.sampled_from([(), (1,), (5,), (3, 7), (2, 3, 4), (17,)])


def _sum_terms(x, weight, bias, num_groups, eps, dy):
    """sum(|term|) of the parameter gradients per channel (``norm_checks``): sums over N and the positions."""
    xhat = F.group_norm(x, num_groups, eps=eps)

    def per_channel(v):
        return v.abs().transpose(0, 1).reshape(x.shape[1], -1).sum(1)

    return {"weight": per_channel(dy * xhat), "bias": per_channel(dy)}


def _reference(x, weight, bias, num_groups, eps=1e-5):
    if any(p is not None and p.dtype != x.dtype for p in (weight, bias)):
        # half x with float32 parameters: torch's CPU kernel computes in float32 and rounds once; its CUDA kernel
        # refuses the mix ("expected scalar type Half but found Float"), so spell out the CPU kernel's math
        return _reference(x.float(), *(None if p is None else p.float() for p in (weight, bias)), num_groups,
                          eps).to(x.dtype)
    if weight is None and bias is not None:  # torch's backward raises "tensor does not have a device" for this pair
        return (F.group_norm(x, num_groups, None, None, eps) + bias.view(-1, *[1] * (x.dim() - 2))).to(x.dtype)
    return F.group_norm(x, num_groups, weight, bias, eps)


def _check(x, weight, bias, num_groups, eps=1e-5):
    names = tuple(n for n, t in (("x", x), ("weight", weight), ("bias", bias)) if t is not None)
    return check_op(npu_liger.group_norm, _reference, (x, weight, bias, num_groups, eps), names, _sum_terms)


def _params(channels, dtype, affine="wb"):
    weight = randn((channels,), dtype) * 0.5 + 1.0 if "w" in affine else None
    bias = randn((channels,), dtype) if "b" in affine else None
    return weight, bias


@given(n=st.sampled_from([1, 2, 3]), groups=GROUPS, spatial=SPATIAL, dtype=st.sampled_from(FLOAT_DTYPES),
       affine=st.sampled_from(["wb", "w", "b", "-"]), param_dtype=st.sampled_from([None, torch.float32]),
       shift=st.sampled_from([0.0, 30.0]), noncontiguous=st.booleans())
def test_group_norm_matches_reference(n, groups, spatial, dtype, affine, param_dtype, shift, noncontiguous):
    num_groups, per_group = groups
    channels = num_groups * per_group
    if per_group * math.prod(spatial) < 3:
        spatial = (3,)
    x = randn((n, channels, *spatial), dtype, noncontiguous=noncontiguous) + shift
    _check(x, *_params(channels, param_dtype or dtype, affine), num_groups)


@pytest.mark.parametrize("shape,num_groups,whole", [
    ((3, 8, 10, 20), 4, False),  # 2 channels x 200 positions: chunks of channels and of positions
    ((2, 64, 3), 2, None),  # 32 channels x 3 positions: whole forward, the backward loops over channels
    ((5, 12, 7), 3, True),  # 4 x 7: one tile per group
])
def test_tiled_and_looped_groups(small_ub, shape, num_groups, whole):
    """A 4 KiB UB: every path of both kernels, with a large mean (a one-pass E[x^2] - E[x]^2 would cancel)."""
    small_ub(4096)
    per_group, positions = shape[1] // num_groups, math.prod(shape[2:])
    fwd = gn_kernels.plan_groups("cpu", shape[0] * num_groups, per_group, positions,
                                 gn_kernels.FORWARD_MEMORY_MULTIPLIER)
    bwd = gn_kernels.plan_groups("cpu", shape[0] * num_groups, per_group, positions,
                                 gn_kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert (fwd.whole, bwd.whole) == ((whole, whole) if whole is not None else (True, False))
    x = randn(shape) + 1000.0
    _check(x, *_params(shape[1], torch.float32), num_groups)
    _check(randn(shape, torch.bfloat16, noncontiguous=True), *_params(shape[1], torch.bfloat16, "w"), num_groups)


def test_cuda_looped_groups_with_prefetch_on_a_persistent_grid(monkeypatch, small_ub):
    """The CUDA plan of groups too large for one tile (``_plan_groups_cuda``): a persistent grid of fewer programs
    than group rows, each walk loading its next chunk before computing this one (``PREFETCH``), which the CPU plan
    never turns on, so CI's interpreter never ran it. Forced here on the CPU plan's tiles (a 4 KiB UB: groups of 2
    channels x 200 positions in chunks of both, the prefetch past a group's last chunk all masked), 12 group rows
    over 3 programs, forward and backward, with a large mean (the merged statistics of the chunks)."""
    plan = gn_kernels.plan_groups

    def cuda_like(device_type, n_groups, channels, positions, multiplier):
        return plan(device_type, n_groups, channels, positions, multiplier)._replace(prefetch=True, grid=3)

    monkeypatch.setattr(gn_kernels, "plan_groups", cuda_like)
    small_ub(4096)
    shape, num_groups = (3, 8, 10, 20), 4
    for multiplier, chunks in ((gn_kernels.FORWARD_MEMORY_MULTIPLIER, 4), (gn_kernels.BACKWARD_MEMORY_MULTIPLIER, 8)):
        tiles = cuda_like("cpu", 3 * num_groups, 2, 200, multiplier)
        assert not tiles.whole and tiles.prefetch and tiles.grid < 3 * num_groups and tiles.block_c < 2
        assert math.ceil(2 / tiles.block_c) * math.ceil(200 / tiles.block_hw) == chunks
    _check(randn(shape) + 1000.0, *_params(shape[1], torch.float32), num_groups)
    _check(randn(shape, torch.bfloat16, noncontiguous=True), *_params(shape[1], torch.bfloat16, "w"), num_groups)
    _check(randn(shape), None, None, num_groups)


def test_every_program_takes_several_groups(small_ub):
    small_ub(4096)
    plan = gn_kernels.plan_groups("cpu", 7 * 12, 1, 30, gn_kernels.BACKWARD_MEMORY_MULTIPLIER)
    assert plan.grid == 40 < 7 * 12
    _check(randn((7, 12, 30)), *_params(12, torch.float32), 12)


def test_parameter_gradients_are_deterministic(small_ub):
    small_ub(8192)
    x, dy = randn((6, 8, 40)), randn((6, 8, 40))
    weight, bias = _params(8, torch.float32)
    first = torch.ops.npu_liger.group_norm_backward(dy, x, weight, bias, 2, 1e-5)
    second = torch.ops.npu_liger.group_norm_backward(dy, x, weight, bias, 2, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[1].untyped_storage().data_ptr() != first[2].untyped_storage().data_ptr()


@pytest.mark.parametrize("shape,num_groups", [((0, 6, 5), 3), ((2, 0, 5), 1), ((2, 6, 0), 3), ((2, 6, 3, 0), 2)])
def test_empty_inputs(shape, num_groups):
    x = randn(shape, requires_grad=True)
    weight, bias = (t.requires_grad_(True) for t in _params(shape[1], torch.float32))
    out = npu_liger.group_norm(x, weight, bias, num_groups)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and torch.equal(bias.grad, torch.zeros_like(bias))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x, dy = randn((3, 6, 7), dtype, requires_grad=True), randn((3, 6, 7), dtype)
    weight, bias = (t.requires_grad_(True) for t in _params(6, dtype))
    for w, b in ((weight, bias), (weight, None), (None, None)):
        run_opcheck(torch.ops.npu_liger.group_norm.default, (x, w, b, 3, 1e-5))
        run_opcheck(torch.ops.npu_liger.group_norm_backward.default,
                    (dy, x.detach(), None if w is None else w.detach(), None if b is None else b.detach(), 3, 1e-5))
    run_opcheck(torch.ops.npu_liger.group_norm.default, (randn((2, 4, 3, 5), dtype, noncontiguous=True), None,
                                                         None, 2))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x, weight, bias):
        return npu_liger.group_norm(x * 2.0, weight, bias, 3).sin()

    def make(n):
        weight, bias = _params(6, torch.float32)
        return randn((n, 6, 4, 3), requires_grad=True), weight.requires_grad_(True), bias.requires_grad_(True)

    assert_compiled_matches_eager(fn, make, [5, 9, 17])


def test_double_backward_raises_clear_error():
    x = randn((2, 6, 5), requires_grad=True)
    (gx,) = torch.autograd.grad(npu_liger.group_norm(x, None, None, 3).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.group_norm(randn((2, 6, 5)), None, None, 4), ValueError, "divisible by num_groups=4"),
    (lambda: npu_liger.group_norm(randn((6,)), None, None, 3), ValueError, "at least 2 dimensions"),
    (lambda: npu_liger.group_norm(randn((2, 6)), None, None, 0), ValueError, "num_groups must be >= 1"),
    (lambda: npu_liger.group_norm(randn((2, 6)), None, None, 1.5), TypeError, "num_groups must be an int"),
    (lambda: npu_liger.group_norm(randn((2, 6, 5)), randn((5,)), None, 3), ValueError,
     r"weight must have shape \(6,\)"),
    (lambda: npu_liger.group_norm(randn((2, 6, 5)), None, randn((6,)).int(), 3), TypeError, "bias must be float32"),
    (lambda: npu_liger.group_norm(randn((2, 6, 5)).double(), None, None, 3), TypeError, "x must be float32"),
    (lambda: npu_liger.group_norm(randn((2, 6, 5)), None, None, 3, -1.0), ValueError, "eps must be >= 0"),
    (lambda: torch.ops.npu_liger.group_norm_backward(randn((2, 6, 4)), randn((2, 6, 5)), None, None, 3, 1e-5),
     ValueError, r"grad_out must have shape \(2, 6, 5\)"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- nn module and the transformers patch ------------------------------------------------------------------


def _torch_group_norm(num_groups, channels, affine=True):
    module = torch.nn.GroupNorm(num_groups, channels, eps=1e-6, affine=affine).to(DEVICE)
    if affine:
        with torch.no_grad():
            module.weight.copy_(randn((channels,)))
            module.bias.copy_(randn((channels,)))
    return module


def test_module_is_torchs_drop_in():
    reference = _torch_group_norm(3, 6)
    ours = npu_liger.nn.GroupNorm(3, 6, eps=1e-6).to(DEVICE)
    assert isinstance(ours, torch.nn.GroupNorm) and set(ours.state_dict()) == {"weight", "bias"}
    ours.load_state_dict(reference.state_dict())
    x = randn((4, 6, 5, 3))
    assert_close(ours(x), F.group_norm(x.double(), 3, reference.weight.double(), reference.bias.double(), 1e-6))
    shared = npu_liger.nn.GroupNorm.from_torch(reference)
    assert shared.weight is reference.weight and shared.bias is reference.bias and shared.eps == 1e-6
    assert torch.equal(shared(x), ours(x)) and "GroupNorm(3, 6" in repr(shared)
    plain = npu_liger.nn.GroupNorm.from_torch(_torch_group_norm(2, 6, affine=False))
    assert plain.weight is None and plain.state_dict() == {}
    assert torch.equal(plain(x), npu_liger.group_norm(x, None, None, 2, 1e-6))
    with pytest.raises(TypeError, match="torch.nn.GroupNorm"):
        npu_liger.nn.GroupNorm.from_torch(torch.nn.LayerNorm(6))


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "npu_liger":
            name = func._schema.name.split("::")[-1]
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _run(model, x, input_grad):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(input_grad)
    out = model(x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * weights).sum().backward()
    return {"out": out.detach(), **({"x": x.grad} if input_grad else {}),
            **{n: p.grad for n, p in model.named_parameters()}}


def _assert_patched_matches(model, x, n_patched, n_ops, input_grad=True):
    """Patching ``model`` patches ``n_patched`` modules; then ``n_ops`` group norms run, with the same results."""
    reference = _run(model, x, input_grad)
    assert patch_norms(model) == n_patched and norm_summary(model) == {"group_norm": n_patched}
    with _CountOps() as counter:
        got = _run(model, x, input_grad)
    assert counter.counts == {"group_norm": n_ops, "group_norm_backward": n_ops}, counter.counts
    for name, want in reference.items():
        assert_close(got[name], want.double(), what=name)
    return got


def test_patch_reaches_every_plain_group_norm_of_a_module_tree():
    """Per instance: torch.nn.GroupNorm (affine or not) runs group_norm; subclasses (npu_liger's own included) and
    other modules are left alone; the patched tree pickles and deepcopies; unpatching restores torch's forward."""
    import npu_liger.transformers as nlt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 6, 3), _torch_group_norm(3, 6), torch.nn.SiLU(),
                                torch.nn.Conv1d(6, 8, 1), _torch_group_norm(2, 8, affine=False),
                                npu_liger.nn.GroupNorm(4, 8)).to(DEVICE)
    other = _torch_group_norm(3, 6)
    x = randn((2, 4, 9))
    _assert_patched_matches(model, x, 2, 3)  # the two patched, and npu_liger.nn.GroupNorm
    assert "forward" not in other.__dict__ and "forward" not in model[5].__dict__
    x = x.to(DEVICE)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert norm_summary(clone) == {"group_norm": 2}
        assert torch.equal(clone(x), model(x))
    nlt.unpatch(model)
    assert norm_summary(model) == {} and "forward" not in model[1].__dict__


def test_patch_of_transformers_wav2vec2_feature_encoder():
    """Wav2Vec2's first feature-extractor conv layer normalises each channel over time with nn.GroupNorm(C, C). (No conv
    bias: the norm removes it, so its gradient is exactly 0 and both results are rounding noise.)"""
    transformers = pytest.importorskip("transformers")
    from transformers.models.wav2vec2 import modeling_wav2vec2

    config = transformers.Wav2Vec2Config(feat_extract_norm="group", conv_dim=(8, 8), conv_kernel=(4, 3),
                                         conv_stride=(2, 2), conv_bias=False)
    torch.manual_seed(0)
    encoder = modeling_wav2vec2.Wav2Vec2FeatureEncoder(config).to(DEVICE)
    with torch.no_grad():
        norm = encoder.conv_layers[0].layer_norm
        norm.weight.copy_(randn((8,)))
        norm.bias.copy_(randn((8,)))
    _assert_patched_matches(encoder, randn((2, 40)), 1, 1, input_grad=False)  # audio samples need no gradient
