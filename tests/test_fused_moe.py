"""fused_moe against Hugging Face's own experts (``MixtralExperts.forward``, run in float64 and in the input dtype),
gradients for x, both expert weights and the routing weights; routing edge cases; compile, opcheck, the backward's
recomputation switch, the grouped-matmul switch, and bad input.

The CPU backend runs the Triton interpreter: shapes stay tiny, and the grouped-matmul tiles shrink to 16 (``tiny_mm``)
so that every matmul loop (rows, columns, depth) turns more than once."""

import inspect

import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st

import npu_liger
from checklist import (DEVICE, UNIT_ROUNDOFF, assert_close, assert_compiled_forward_backward, assert_no_alias,
                       assert_unchanged, in_layout, randn, rel_error, run_opcheck, snapshot, to_float64)
from npu_liger.npu_ops import _grouped_mm
from npu_liger.npu_ops import fused_moe as moe_ops
from npu_liger.registrations.fused_moe import backward_down_op, backward_gate_up_op, fused_moe_op, with_saved_op
from op_cases import fused_moe_reference

transformers = pytest.importorskip("transformers")
from transformers.models.mixtral.modeling_mixtral import MixtralConfig, MixtralExperts  # noqa: E402


@pytest.fixture(autouse=True)
def tiny_mm(monkeypatch):
    """16x16x16 matmul tiles on CPU (the emulated NPU's are 64x128x64): the loops over row tiles, column blocks
    and depth all iterate at test sizes."""
    if DEVICE == "cpu":
        monkeypatch.setitem(_grouped_mm.MM_TILES, "cpu", _grouped_mm.MMTiles(16, 16, 16))


def hf_experts(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    """transformers' MixtralExperts.forward on these tensors (its own code, in their dtype). A slot served
    elsewhere (index E) goes to expert 0 with its weight masked to 0: the same output and gradients, and
    transformers releases before the index-E convention (5.17 one-hot encodes E classes) can run it too."""
    experts, two_inter, hidden = gate_up_proj.shape
    elsewhere = top_k_index == experts
    top_k_index = torch.where(elsewhere, torch.zeros_like(top_k_index), top_k_index)
    top_k_weights = top_k_weights * (~elsewhere).to(top_k_weights.dtype)
    config = MixtralConfig(hidden_size=hidden, intermediate_size=two_inter // 2, num_local_experts=experts,
                           hidden_act="silu")
    module = MixtralExperts(config)
    del module.gate_up_proj, module.down_proj  # plain tensors instead: the graph reaches the test's leaves
    module.gate_up_proj, module.down_proj = gate_up_proj, down_proj
    return inspect.unwrap(MixtralExperts.forward)(module, x, top_k_index, top_k_weights)


def make(T, H, E, inter, K, dtype=torch.float32, *, sentinel=True, noncontiguous=False, index=None):
    x = randn((T, H), dtype, noncontiguous=noncontiguous)
    gate_up = randn((E, 2 * inter, H), dtype, scale=H ** -0.5, noncontiguous=noncontiguous)
    down = randn((E, H, inter), dtype, scale=inter ** -0.5, noncontiguous=noncontiguous)
    if index is None:
        index = torch.randint(0, E + 1 if sentinel else E, (T, K), device=DEVICE)
    weights = torch.rand((T, K), device=DEVICE).to(dtype)
    return x, gate_up, down, index, weights


def routing_weight_grad_rounding(x, gate_up, down, index, grad_out):
    """In float64: the first-order relative error of the routing weights' gradient ``grad_out[t] . y`` when every
    term on its way rounds once by one unit: the terms of the gate and up dots over H, act, the terms of y's dot
    over I and those of the final dot over H. Each term z gets a mark (1 + d); |dg/dd| at d = 0 is that
    rounding's contribution. Returns ||sum |dg/dd| || / ||g|| over the slots: large where a dot's terms cancel,
    and there twice the eager error alone fails at random (docs/DESIGN.md section 6; the CI's fp32 draw at
    T=2, H=40, E=1, I=8 erred 3.6 times eager's error)."""
    x, gate_up, down, grad_out = (t.detach().double() for t in (x, gate_up, down, grad_out))
    sizes, values = [], []
    for t in range(x.shape[0]):
        for e in index[t].tolist():
            if e >= gate_up.shape[0]:
                continue  # served elsewhere: the gradient is exactly 0
            gate_w, up_w = gate_up[e].chunk(2)
            marks = [torch.zeros_like(m, requires_grad=True) for m in (gate_w, up_w, gate_w[:, 0], down[e], x[t])]
            gate = (gate_w * x[t] * (1 + marks[0])).sum(1)
            up = (up_w * x[t] * (1 + marks[1])).sum(1)
            act = torch.nn.functional.silu(gate) * up * (1 + marks[2])
            y = (down[e] * act * (1 + marks[3])).sum(1)
            value = (grad_out[t] * y * (1 + marks[4])).sum()
            sizes.append(sum(g.abs().sum() for g in torch.autograd.grad(value, marks)))
            values.append(value.detach())
    if not values:
        return 1.0
    return (torch.stack(sizes).norm() / torch.stack(values).norm().clamp_min(1e-300)).item()


def gradient_rounding_bounds(x, gate_up, down, index, weights, grad_out):
    """In float64: first-order bounds on the relative errors of grad_x, grad_gate_up_proj and grad_down_proj from
    the half-precision roundings on their way, each by one unit: the stored gate/up projection h, the stored grad_h
    (which carries the routing weight) and weighted act, each slot's product grad_h @ gate_up, the combined sum and
    each stored result (the backward's grad_act and every dot and weight product accumulate in fp32). Absolute
    values are propagated (|dg/dz| |z| per rounding z), so a bound is large where its sum cancels: over 2I for
    grad_x, over the slots for the weight gradients. With H = 1 nothing averages out, and the CI drew 2.4 u for
    bf16 grad_x at T=6, H=1, E=1, I=8, K=1 while eager's error was small by luck. Returns {name: ||bound|| /
    ||gradient||}."""
    x, gate_up, down, weights, grad_out = (t.detach().double() for t in (x, gate_up, down, weights, grad_out))
    grads = {"grad_x": torch.zeros_like(x), "grad_gate_up_proj": torch.zeros_like(gate_up),
             "grad_down_proj": torch.zeros_like(down)}
    bounds = {name: torch.zeros_like(g) for name, g in grads.items()}
    for t in range(x.shape[0]):
        for k, e in enumerate(index[t].tolist()):
            if e >= gate_up.shape[0]:
                continue  # served elsewhere: contributes nothing
            gate_w, up_w = gate_up[e].chunk(2)
            gate, up = gate_w @ x[t], up_w @ x[t]
            sig = torch.sigmoid(gate)
            silu, dsilu = gate * sig, sig * (1 + gate * (1 - sig))
            d2silu = sig * (1 - sig) * (2 + gate * (1 - 2 * sig))
            w = weights[t, k]
            grad_act = w * (down[e].t() @ grad_out[t])  # the weight folded in, as grad_h carries it
            grad_h = torch.cat((grad_act * up * dsilu, grad_act * silu))
            # rounding of h (gate, up), then of grad_h and of the weighted act themselves
            act_size, up_size, gate_size = grad_act.abs(), up.abs(), gate.abs()
            err_h = torch.cat((act_size * (dsilu.abs() * up_size + up_size * d2silu.abs() * gate_size),
                               act_size * dsilu.abs() * gate_size)) + grad_h.abs()
            weighted_act = w * silu * up
            err_act = w.abs() * (dsilu.abs() * up_size * gate_size + silu.abs() * up_size) + weighted_act.abs()
            slot = gate_up[e].t() @ grad_h
            grads["grad_x"][t] += slot
            bounds["grad_x"][t] += gate_up[e].t().abs() @ err_h + slot.abs()  # + the slot's rounding
            grads["grad_gate_up_proj"][e] += torch.outer(grad_h, x[t])
            bounds["grad_gate_up_proj"][e] += torch.outer(err_h, x[t].abs())
            grads["grad_down_proj"][e] += torch.outer(grad_out[t], weighted_act)
            bounds["grad_down_proj"][e] += torch.outer(grad_out[t].abs(), err_act)
    ratios = {}
    for name, grad in grads.items():
        bound = bounds[name] + grad.abs()  # the stored result's rounding
        norm = grad.norm()
        ratios[name] = (bound.norm() / norm).item() if norm > 0 else 1.0
    return ratios


def check(args, grads=(0, 1, 2, 4)):
    """Output and every gradient against HF in float64 (half precision: against HF in the input dtype's error);
    inputs unchanged, outputs new."""
    leaves = [a.detach().requires_grad_(i in grads) if a.is_floating_point() else a for i, a in enumerate(args)]
    before = snapshot(leaves)
    out = npu_liger.fused_moe(*leaves)
    grad_out = randn(out.shape, out.dtype)
    if any(leaves[i].requires_grad for i in grads) and out.numel():
        out.backward(grad_out)
    assert_unchanged(before, leaves, ["x", "gate_up_proj", "down_proj", "top_k_index", "top_k_weights"])
    assert_no_alias([out, *[leaves[i].grad for i in grads]], leaves)
    ref_in = [to_float64(t) for t in leaves]
    low_in = [t.detach().clone().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in leaves]
    long_index = [t.long() if i == 3 else t for i, t in enumerate(ref_in)]  # HF's one_hot takes int64 only
    ref = hf_experts(*long_index)
    low = hf_experts(*[t.long() if i == 3 else t for i, t in enumerate(low_in)])
    if out.numel() and ref.requires_grad:  # HF's output is a constant when no slot reaches an expert
        ref.backward(grad_out.double())
        low.backward(grad_out)
    assert out.dtype == args[0].dtype and out.shape == args[0].shape
    # The output passes four roundings to x's dtype (h, act, y, then the combined sum): on tiny shapes (H = I = 1,
    # nothing averages out) it can sit above one unit roundoff where eager's own error is small by luck (the H200
    # drew 1.26 u for fp16 at T=2, H=1, E=2, I=1, K=3).
    assert_close(out, ref, low, what="out", roundings=4)
    for i, name in zip(grads, ("grad_x", "grad_gate_up_proj", "grad_down_proj", "grad_top_k_weights")):
        if out.numel() == 0:
            assert leaves[i].grad is None or not leaves[i].grad.any()
            continue
        got = leaves[i].grad
        assert got.dtype == args[i].dtype, name
        # HF gives experts no token None gradients only where nothing was hit at all; compare against zeros there
        want = ref_in[i].grad if ref_in[i].grad is not None else torch.zeros_like(ref_in[i])
        want_low = low_in[i].grad if low_in[i].grad is not None else torch.zeros_like(low_in[i])
        if got.dtype != torch.float32:
            # Each gradient passes two roundings to the input dtype (an intermediate: w * act, grad_h or the
            # output; then the result), so its floor is two unit roundoffs where eager's error is small by luck
            # (tiny shapes); the routing weights' gradient, a dot over I, adds its rounding's amplification.
            u = UNIT_ROUNDOFF[got.dtype]
            tol = max(2.0 * rel_error(want_low, want), 2.0 * u)
            if i == 4:
                tol += u * routing_weight_grad_rounding(*args[:4], grad_out)
            if i < 3:  # a first-order bound, not an estimate: it may replace the rule where a sum cancels
                tol = max(tol, u * gradient_rounding_bounds(*args, grad_out)[name])
            assert rel_error(got, want) <= tol, f"{name} ({got.dtype}): {rel_error(got, want):.3e} > {tol:.3e}"
            continue
        # fp32: the fixed 1e-5 unless the routing weights' dots cancel; the kernel's blocked fp32 sums round
        # about as often as the marked terms (1600 CPU draws: at most 0.77 of one u per mark), hence twice that.
        floor = 2.0 * 2.0**-24 * routing_weight_grad_rounding(*args[:4], grad_out) if i == 4 else 0.0
        assert_close(got, want, want_low, what=name, floor=floor)
    return out


@settings(phases=(Phase.explicit, Phase.reuse, Phase.generate))  # no shrinking: each example costs seconds
@given(T=st.integers(1, 9), H=st.sampled_from([1, 16, 23, 40]), E=st.integers(1, 5), inter=st.sampled_from([1, 8, 19]),
       K=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       noncontiguous=st.booleans())
def test_matches_transformers(T, H, E, inter, K, dtype, noncontiguous):
    check(make(T, H, E, inter, K, dtype, noncontiguous=noncontiguous))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_ub_tiles_loop(small_ub, dtype):
    small_ub(4096)  # row kernels: a handful of columns per tile, several column and row blocks
    check(make(37, 48, 3, 40, 2, dtype))


def test_routing_edge_cases():
    T, H, E, inter = 11, 24, 6, 12
    base = make(T, H, E, inter, 2)
    cases = {
        "all slots on one expert": torch.full((T, 2), 4, device=DEVICE),
        "empty experts": torch.randint(0, 2, (T, 2), device=DEVICE),
        "every slot served elsewhere (E)": torch.full((T, 2), E, device=DEVICE),
        "int32 index": torch.randint(0, E + 1, (T, 2), device=DEVICE, dtype=torch.int32),
        "one token on the same expert twice": torch.tensor([[1, 1]] * T, device=DEVICE),
    }
    for name, index in cases.items():
        out = check(base[:3] + (index, base[4]))
        if name.startswith("every slot"):
            assert not out.any(), name


def test_top_k_one_and_empty_tokens():
    check(make(9, 16, 4, 8, 1))
    x, gate_up, down, index, weights = make(0, 16, 4, 8, 2)
    out = npu_liger.fused_moe(x.requires_grad_(), gate_up.requires_grad_(), down, index, weights)
    assert out.shape == (0, 16)
    out.sum().backward()
    assert not gate_up.grad.any() and x.grad.shape == (0, 16)
    x, gate_up, down, index, weights = make(4, 16, 4, 8, 0)  # no routing slot at all: zeros
    assert not npu_liger.fused_moe(x, gate_up, down, index, weights).any()


@pytest.mark.parametrize("layout", ["strided", "transposed", "expanded"])
def test_weight_layouts(layout):
    x, gate_up, down, index, weights = make(10, 32, 3, 16, 2)
    check((in_layout(x, "strided"), in_layout(gate_up, layout), in_layout(down, layout), index,
           in_layout(weights, "transposed")))


def test_deterministic():
    args = make(23, 32, 3, 16, 3)
    runs = []
    for _ in range(2):
        leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
        out = npu_liger.fused_moe(*leaves)
        out.backward(torch.ones_like(out))
        runs.append([out, *[leaves[i].grad for i in (0, 1, 2, 4)]])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_recomputed_gate_up_gives_the_same_gradients(monkeypatch):
    args = make(13, 32, 4, 16, 2)

    def grads():
        leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
        npu_liger.fused_moe(*leaves).backward(torch.ones(13, 32, device=DEVICE))
        return [leaves[i].grad for i in (0, 1, 2, 4)]

    kept = grads()
    monkeypatch.setenv(moe_ops.RECOMPUTE_ENV, "1")
    for a, b in zip(kept, grads()):
        assert torch.equal(a, b)


def test_only_the_needed_gradients():
    x, gate_up, down, index, weights = make(8, 16, 3, 8, 2)
    out = npu_liger.fused_moe(x.requires_grad_(), gate_up, down, index, weights)  # frozen experts
    out.sum().backward()
    assert x.grad is not None and gate_up.grad is None
    h = with_saved_op(x.detach(), gate_up, down, index, weights)[1]
    grad_h, gd, gw = backward_down_op(torch.ones_like(out), x.detach(), gate_up, down, index, weights, h, False)
    gx, ggu = backward_gate_up_op(grad_h, x.detach(), gate_up, index, True, False)
    assert ggu.shape == (0,) and gd.shape == (0,) and torch.allclose(gx, x.grad)


def test_retained_graph_second_backward_recomputes_the_freed_projections():
    """The eager backward lets the saved gate/up projections go halfway; a second backward over a retained graph
    recomputes them and gives the same gradients."""
    leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in make(11, 32, 4, 16, 2)]
    out = npu_liger.fused_moe(*leaves)
    grad = randn(out.shape)
    first = torch.autograd.grad(out, [leaves[i] for i in (0, 1, 2, 4)], grad, retain_graph=True)
    second = torch.autograd.grad(out, [leaves[i] for i in (0, 1, 2, 4)], grad)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_eager_backward_frees_the_projections_before_its_second_step(monkeypatch):
    """h (the (T*K, 2I) gate/up projections) is not alive while the second step builds its buffers: the step
    that reads it last is followed by its release, not by the end of the backward."""
    import weakref

    from npu_liger.registrations import _op

    seen = {}
    down_step, gate_up_step = _op._KERNELS[backward_down_op], _op._KERNELS[backward_gate_up_op]

    def down(*args):
        seen["h"] = weakref.ref(args[6])
        return down_step(*args)

    def gate_up(*args):
        seen["alive in step two"] = seen["h"]() is not None
        return gate_up_step(*args)

    monkeypatch.setitem(_op._KERNELS, backward_down_op, down)
    monkeypatch.setitem(_op._KERNELS, backward_gate_up_op, gate_up)
    leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in make(9, 16, 3, 8, 2)]
    npu_liger.fused_moe(*leaves).sum().backward()
    assert seen["alive in step two"] is False and leaves[1].grad is not None


def _layout(shape, order, step):
    """A bf16 tensor of ``shape`` whose dims are laid out in ``order`` (outermost first), every ``step``-th element
    of its last dim kept: contiguous, transposed and strided layouts from one description."""
    stored = [shape[d] for d in order]
    stored[-1] *= step
    t = torch.randn(stored, dtype=torch.bfloat16, device=DEVICE)[..., ::step]
    return t.permute([order.index(d) for d in range(len(shape))])


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), k=st.sampled_from([1, 4, 8, 12, 16]), n=st.sampled_from([1, 8, 12, 16]),
       a_order=st.sampled_from([(0, 1), (1, 0)]), w_order=st.permutations([0, 1, 2]), step=st.sampled_from([1, 2]))
def test_grouped_mm_guard_matches_torch_layout_check(rows, k, n, a_order, w_order, step):
    """``_aligned`` answers torch's own check (CPU torch runs the same check as CUDA): where the guard says yes,
    torch._grouped_mm accepts the operands and computes each expert's product; where torch accepts, the guard says
    yes unless an expert stride is off 16 bytes (our stricter addition). H = 1 ((rows, 1) of strides (1, 1)) is
    the layout the old guard let through. On CUDA torch is called only where the package would call it
    (``torch_grouped_mm_applies``): some layouts that pass torch's check fault there (misaligned address, seen
    on an H200 with this test), which poisons the CUDA context of every later test."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch without _grouped_mm")
    a, w = _layout((rows, k), a_order, 1), _layout((2, k, n), tuple(w_order), step)
    offs = torch.tensor([rows // 2, rows], dtype=torch.int32, device=DEVICE)
    guard = _grouped_mm._aligned(a) and _grouped_mm._aligned(w)
    if DEVICE == "cuda" and not _grouped_mm.torch_grouped_mm_applies(a, w):
        return
    try:
        out = torch._grouped_mm(a, w, offs=offs)
    except RuntimeError as error:
        assert not guard, f"guard accepted what torch refused: {error}"
        return
    a64, w64 = to_float64(a), to_float64(w)
    expected = torch.cat([a64[: rows // 2] @ w64[0], a64[rows // 2:] @ w64[1]])
    eager = torch.cat([a[: rows // 2] @ w[0], a[rows // 2:] @ w[1]])
    assert_close(out, expected, eager, what="torch._grouped_mm")
    assert guard or w.stride(0) % 8, (a.stride(), w.stride())


def test_grouped_mm_switch_and_torch_kernel(monkeypatch):
    """The torch._grouped_mm path (CUDA only in the package) computes the same products: forced on here for bf16
    CPU tensors, where torch 2.13 has the kernel too."""
    if not hasattr(torch, "_grouped_mm") or DEVICE != "cpu":
        pytest.skip("forcing torch._grouped_mm onto CPU tensors is a CPU-run check")
    args = make(12, 32, 3, 16, 2, torch.bfloat16)

    def run():
        leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
        out = npu_liger.fused_moe(*leaves)
        out.backward(torch.ones_like(out))
        return [out, *[leaves[i].grad for i in (0, 1, 2, 4)]]

    triton_results = run()
    original = _grouped_mm.torch_grouped_mm_applies
    calls = []

    def applies_on_cpu(*operands):
        calls.append(1)
        return all(t.dtype == torch.bfloat16 for t in operands) and all(map(_grouped_mm._aligned, operands))

    monkeypatch.setattr(_grouped_mm, "torch_grouped_mm_applies", applies_on_cpu)
    torch_results = run()
    assert calls
    for a, b in zip(torch_results, triton_results):
        # two bf16 pipelines (each rounds the gated intermediate to bf16 at its own point): judged norm-wise, as
        # one element can land a few bf16 steps apart (CI drew 0.041 on a value of 0.29, 1 of 3072)
        assert rel_error(a, b) <= 2e-2, rel_error(a, b)
    monkeypatch.setattr(_grouped_mm, "torch_grouped_mm_applies", original)
    monkeypatch.setenv(_grouped_mm.GROUPED_MM_ENV, "cuBLAS")
    with pytest.raises(ValueError, match=_grouped_mm.GROUPED_MM_ENV):
        _grouped_mm.choice()


def _check_zero_experts_without_rows(device):
    experts, n_a, n_b = 6, 33, 129
    index = torch.tensor([[0, 2], [2, 4], [0, 0], [6, 2]], device=device)  # experts 1, 3, 5 without rows; 6 = E
    routing = moe_ops.Routing(index, experts, _grouped_mm.tiles_for(torch.device(device).type))
    c = torch.randn(experts, n_a, n_b, device=device)
    c[1, 3, 5] = float("nan")  # what an unwritten product may hold
    before = c.clone()
    assert _grouped_mm.zero_experts_without_rows(c, routing) is c
    empty = torch.tensor([False, True, False, True, False, True], device=device)
    assert (c[empty] == 0).all()
    assert torch.equal(c[~empty], before[~empty])


def test_zero_experts_without_rows(device):
    """The zero fill after torch's grouped weight-gradient matmul: exactly the slabs of experts without rows become
    zeros (NaN included), every other slab is left bit for bit."""
    _check_zero_experts_without_rows(device)


def test_zero_experts_without_rows_small_tiles(small_ub):
    small_ub(4096)  # a few hundred elements per tile: every chunk loops over several tiles
    _check_zero_experts_without_rows("cpu")


def test_compiled_without_recompiles():
    E, H, inter, K = 3, 16, 8, 2
    gate_up, down = randn((E, 2 * inter, H), scale=0.3), randn((E, H, inter), scale=0.3)

    def fn(x, gate_up, down, index, weights):
        return npu_liger.fused_moe(x * 1.5, gate_up, down, index, weights.softmax(-1)) + 1.0

    def reference(x, gate_up, down, index, weights):
        return fused_moe_reference(x * 1.5, gate_up, down, index, weights.softmax(-1)) + 1.0

    def inputs(T):
        return (randn((T, H), requires_grad=True), gate_up.detach().requires_grad_(), down.detach().requires_grad_(),
                torch.randint(0, E + 1, (T, K), device=DEVICE), randn((T, K), requires_grad=True))

    assert_compiled_forward_backward(fn, reference, inputs, sizes=[7, 11, 5])


def test_opcheck():
    args = make(6, 16, 3, 8, 2)
    out, h = with_saved_op(*args)
    run_opcheck(with_saved_op, args)
    run_opcheck(fused_moe_op, args)
    run_opcheck(backward_down_op, (randn(out.shape), *args, h, True))
    grad_h = backward_down_op(randn(out.shape), *args, h, True)[0]
    run_opcheck(backward_gate_up_op, (grad_h, args[0], args[1], args[3], True, True))


def test_bad_inputs():
    x, gate_up, down, index, weights = make(4, 16, 3, 8, 2)
    cases = [
        ((x[0], gate_up, down, index, weights), ValueError, "x must be 2-D"),
        ((x, gate_up[:, :15], down, index, weights), ValueError, "gate_up_proj must have shape"),
        ((x, gate_up, down[:, :, :7], index, weights), ValueError, "down_proj must have shape"),
        ((x, gate_up.double(), down, index, weights), TypeError, "gate_up_proj must be float32"),
        ((x, gate_up.half(), down, index, weights), TypeError, "gate_up_proj must have the dtype of x"),
        ((x, gate_up, down, index.float(), weights), TypeError, "top_k_index must be int32 or int64"),
        ((x, gate_up, down, index[:3], weights), ValueError, "top_k_index must have shape"),
        ((x, gate_up, down, index, weights[:, :1]), ValueError, "top_k_weights must have the shape"),
        ((x, gate_up[:0], down[:0], index, weights), ValueError, "at least one expert"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            npu_liger.fused_moe(*args)
        with pytest.raises(error, match=message):
            npu_liger.fused_moe(*[a.to("meta") for a in args])  # the fake checks the same
    if DEVICE == "cpu":
        with pytest.raises(IndexError, match="outside"):
            npu_liger.fused_moe(x, gate_up, down, torch.full_like(index, 4), weights)


def test_nn_module_loads_transformers_state_dict():
    config = MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=3, hidden_act="silu")
    hf = MixtralExperts(config).to(DEVICE)
    torch.nn.init.normal_(hf.gate_up_proj, std=0.2)
    torch.nn.init.normal_(hf.down_proj, std=0.2)
    ours = npu_liger.nn.Experts(config).to(DEVICE)
    ours.load_state_dict(hf.state_dict())
    # no slot served elsewhere: transformers 5.17's forward one-hot encodes E classes (a device assert on CUDA)
    x, _, _, index, weights = make(6, 16, 3, 8, 2, sentinel=False)
    want = inspect.unwrap(MixtralExperts.forward)(hf, x, index, weights)
    torch.testing.assert_close(ours(x, index, weights), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs")
def test_cuda_graph_capture():
    args = make(64, 64, 8, 32, 2)
    npu_liger.fused_moe(*args)  # compile the kernels first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = npu_liger.fused_moe(*args)
    graph.replay()
    torch.testing.assert_close(out, npu_liger.fused_moe(*args))
