"""The public functions (``npu_liger.<op>``) return what their op returns in every context: the eager shortcut
around the dispatcher is taken only for plain dense tensors on a real device with no neg/conj bit while nothing
traces and no mode is active (``registrations/_op.py``). Also: CPU launches from several threads, the import guard
for TRITON_INTERPRET, and patched Hugging Face models that pickle, save/load and deepcopy."""

import copy
import io
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import npu_liger
from checklist import DEVICE, randn
from op_cases import CASES, OPS, public_name, run_op as _run_op


CALLS = {name: case.make for name, case in CASES.items()}


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _assert_same(got, want):
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == w.device
        if g.device.type != "meta":
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_every_public_function_is_listed():
    """Every op module's public function is exported by ``npu_liger`` (its import line in npu_liger/__init__.py)
    and has a case in tests/op_cases.py."""
    for name, fn in npu_liger.registrations.PUBLIC.items():
        assert getattr(npu_liger, name, None) is fn, f"npu_liger.{name} is not exported (npu_liger/__init__.py)"
    assert set(map(public_name, CALLS)) == set(npu_liger.registrations.PUBLIC)


@pytest.mark.parametrize("name", OPS)
def test_meta_tensors_give_the_ops_meta_result(name):
    args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in CALLS[name]())
    got = getattr(npu_liger, public_name(name))(*args)
    _assert_same(got, _run_op(name, args))
    assert all(t.device.type == "meta" for t in _flat(got))


def test_modules_built_under_meta_device():
    with torch.device("meta"):
        mlp = npu_liger.nn.SwiGLUMLP(16, 32)
        emb = npu_liger.nn.Embedding(10, 4)
        out = mlp(torch.empty(2, 16))
        looked_up = emb(torch.zeros(3, dtype=torch.long))
    assert out.device.type == "meta" and out.shape == (2, 16)
    assert looked_up.device.type == "meta" and looked_up.shape == (3, 4)


def _neg_view(t):
    """A view with the lazy negation bit (the values of -imag(t * 1j)^* = t), or a conj view for complex t."""
    if t.is_complex():
        return t.conj().conj_physical().conj()  # conj bit set, values == t
    view = (-t * 1j).conj().imag  # imag of conj: a neg-bit view whose values are -(-t) = t ... (is_neg())
    assert view.is_neg()
    return view


@pytest.mark.parametrize("name", OPS)
def test_neg_and_conj_views_are_read_by_value(name):
    args = CALLS[name]()
    lazy = tuple(_neg_view(a) if isinstance(a, torch.Tensor) and a.is_floating_point() or
                 isinstance(a, torch.Tensor) and a.is_complex() else a for a in args)
    plain = tuple(a.resolve_neg().resolve_conj() if isinstance(a, torch.Tensor) else a for a in lazy)
    for a, p in zip(lazy, plain, strict=True):
        if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()):
            assert (a.is_neg() or a.is_conj()) and torch.equal(a.resolve_neg().resolve_conj(), p)
    _assert_same(getattr(npu_liger, public_name(name))(*lazy), getattr(npu_liger, public_name(name))(*plain))


def _escaped_from_transform(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a functorch wrapper that outlived its torch.func transform (a "dead" wrapper)."""
    leaked = []

    def f(u):
        leaked.append(u * 1)
        return u.sum()

    torch.func.grad(f)(t.detach())
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])
    return leaked[0]


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "swiglu", "rope"])
def test_tensors_escaped_from_a_transform_are_read_by_value(name):
    """A tensor kept from inside torch.func.grad is a functorch wrapper around the data: the public function
    takes the op (not the eager shortcut, whose autograd Function skips torch's unwrapping), forward and with a
    gradient."""
    args = CALLS[name]()
    escaped = tuple(_escaped_from_transform(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args)
    fn = getattr(npu_liger, public_name(name))
    _assert_same(fn(*escaped), fn(*args))
    weights = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
               and a.dim() == 1 else None for a in args]
    if any(w is not None for w in weights):
        mixed = tuple(w if w is not None else e for w, e in zip(weights, escaped, strict=True))
        out = _flat(fn(*mixed))[0]
        grads = torch.autograd.grad(out.float().sum(), [w for w in weights if w is not None])
        plain = tuple(w if w is not None else a for w, a in zip(weights, args, strict=True))
        want = torch.autograd.grad(_flat(fn(*plain))[0].float().sum(), [w for w in weights if w is not None])
        for g, w in zip(grads, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_tvd_of_a_neg_view_matches_torch():
    z = torch.randn(8, 16, dtype=torch.complex64, device=DEVICE)
    p = z.conj().imag  # neg bit
    q = torch.randn(8, 16, device=DEVICE)
    assert p.is_neg()
    want = 0.5 * (p.resolve_neg() - q).abs().sum()
    torch.testing.assert_close(npu_liger.tvd(p, q, reduction="sum"), want, rtol=1e-5, atol=1e-5)


def test_jit_trace_matches_the_op():
    a, b = randn((4, 33)), randn((4, 33))
    traced = torch.jit.trace(npu_liger.swiglu, (a, b))
    a2, b2 = randn((4, 33)), randn((4, 33))
    torch.testing.assert_close(traced(a2, b2), torch.ops.npu_liger.swiglu(a2, b2))
    assert "npu_liger::swiglu" in str(traced.graph)


@pytest.mark.parametrize("name", OPS)
def test_dispatch_mode_sees_the_op(name):
    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func._opname)
            return func(*args, **(kwargs or {}))

    args = CALLS[name]()
    want = _run_op(name, args)
    with Seen() as seen:
        got = getattr(npu_liger, public_name(name))(*args)
    # the losses and fused_moe are composite ops: below autograd they run as their <name>_with_grad (losses) or
    # <name>_with_saved (fused_moe) op
    op = public_name(name)
    assert op in seen.ops or f"{op}_with_grad" in seen.ops or f"{op}_with_saved" in seen.ops, seen.ops
    _assert_same(got, want)


@pytest.mark.skipif(DEVICE != "cpu", reason="the Triton interpreter is what is not thread-safe")
def test_cpu_launches_from_several_threads_are_serialised():
    calls = [(name, CALLS[name]()) for _ in range(7) for name in OPS[:6]]  # 42 mixed calls
    expected = [_run_op(name, args) for name, args in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda call: getattr(npu_liger, public_name(call[0]))(*call[1]), calls))
    for got, want in zip(results, expected, strict=True):
        _assert_same(got, want)


def test_setting_triton_interpret_after_importing_triton_is_refused():
    script = "import os, triton\nos.environ['TRITON_INTERPRET'] = '1'\nimport npu_liger\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "before anything imports triton" in result.stderr, result.stderr


def test_patched_hf_model_pickles_saves_and_deepcopies():
    transformers = pytest.importorskip("transformers")
    import npu_liger.transformers as nlt

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = nlt.apply_to_model(transformers.LlamaForCausalLM(config).to(DEVICE).eval())
    ids = torch.randint(0, 64, (1, 7), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copies = [pickle.loads(pickle.dumps(model)), torch.load(buffer, weights_only=False), copy.deepcopy(model)]
    for clone in copies:
        assert nlt.patch_summary(clone)["mlp"] == {"swiglu": 1}
        mlp = clone.model.layers[0].mlp
        assert mlp.forward.args[0] is mlp  # bound to the clone, not to the original
        with torch.no_grad():
            torch.testing.assert_close(clone(ids).logits, want)
    nlt.unpatch(copies[0])
    assert nlt.patch_summary(copies[0])["mlp"] == {}
