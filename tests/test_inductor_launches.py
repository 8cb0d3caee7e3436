"""Compiled graphs that launch our kernels from Inductor's own code (``registrations/_op.py``, "Compiled graphs and
our kernels"): with static sizes on CUDA, every op not listed in ``OPAQUE_IN_GRAPHS`` is decomposed into its
launcher and its Triton kernels appear in the generated code, with the results of the eager op (same kernels,
same tile plan); with symbolic sizes the op stays opaque and nothing recompiles; CUDA graphs capture both. By
default this happens in graphs compiled with CUDA graphs only (``inductor_launches_in_this_graph``); the tests
of the launches themselves switch it on for every graph, as NPU_LIGER_INDUCTOR_LAUNCHES=1 does.

CUDA only: the interpreter's kernels cannot run on a tracer's tensors, so on CPU every op stays opaque (the
table test checks that the table says so); the rule that decides when is checked on every device."""

from __future__ import annotations

import pytest
import torch

import npu_liger
from checklist import DEVICE, inductor_launches
from npu_liger.npu_ops._triton import interpreter_enabled
from npu_liger.registrations import _op
from npu_liger.registrations._op import INDUCTOR_LAUNCHES, OPAQUE_IN_GRAPHS, inductor_launches_in_this_graph
from op_cases import CASES, public_name

on_cuda = pytest.mark.skipif(DEVICE != "cuda" or interpreter_enabled() or INDUCTOR_LAUNCHES == "0",
                             reason="Inductor launches need CUDA Triton (and NPU_LIGER_INDUCTOR_LAUNCHES not 0)")


@pytest.fixture
def launches_in_every_graph():
    """As NPU_LIGER_INDUCTOR_LAUNCHES=1: static-size graphs launch the kernels whether or not they use CUDA graphs."""
    with inductor_launches("1"):
        yield


def _public_op_name(op) -> str:
    """``npu_liger::rms_norm_backward`` -> ``rms_norm``: the public function an op serves."""
    name = op._schema.name.split("::")[-1]
    for suffix in ("_backward", "_with_grad", "_with_saved"):
        name = name.removesuffix(suffix)
    return name


OPAQUE = {_public_op_name(op) for op in OPAQUE_IN_GRAPHS}
TRACED = [name for name in CASES if public_name(name) not in OPAQUE]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _step(fn, args, positions):
    """Outputs and the gradients of ``args`` at ``positions`` (incoming gradients: ones), fresh leaves each call."""
    leaves = tuple(a.detach().requires_grad_(True) if i in positions else a for i, a in enumerate(args))
    outs = _flat(fn(*leaves))
    pairs = [(o, torch.ones_like(o)) for o in outs if o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [o.detach() for o in outs], [leaves[i].grad for i in positions]


@pytest.mark.parametrize("setting", ["auto", "1", "0"])
def test_the_setting_decides_which_graphs_launch_the_kernels(setting):
    from torch._inductor import config as inductor_config

    for cudagraphs in (False, True):
        with inductor_launches(setting), inductor_config.patch({"triton.cudagraphs": cudagraphs}):
            want = {"1": True, "0": False, "auto": cudagraphs}[setting]
            assert inductor_launches_in_this_graph() is want, (setting, cudagraphs)


@pytest.mark.parametrize("value, want", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("1", "1"), (" 0 ", "0")])
def test_the_setting_is_read_from_the_environment(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(_op.INDUCTOR_LAUNCHES_ENV, raising=False)
    else:
        monkeypatch.setenv(_op.INDUCTOR_LAUNCHES_ENV, value)
    assert _op.inductor_launches_setting() == want


def test_an_unknown_setting_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(_op.INDUCTOR_LAUNCHES_ENV, "true")
    with pytest.raises(ValueError, match="NPU_LIGER_INDUCTOR_LAUNCHES must be 1, 0 or auto.*'true'"):
        _op.inductor_launches_setting()


def test_reduce_overhead_mode_turns_on_the_option_the_rule_reads():
    """The default rule reads Inductor's ``triton.cudagraphs``, which torch.compile(mode="reduce-overhead") sets."""
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead").get("triton.cudagraphs") is True
    assert not list_mode_options("default").get("triton.cudagraphs", False)


@on_cuda
@pytest.mark.parametrize("name", TRACED)
def test_static_graph_launches_the_kernels_itself(name, launches_in_every_graph):
    from torch._inductor.utils import run_and_get_code

    case = CASES[name]
    args = case.make()
    function = getattr(npu_liger, public_name(name))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: function(*a), fullgraph=True, dynamic=False)
    (outs, grads), code = run_and_get_code(_step, compiled, args, case.grads)
    code = "\n".join(code)
    assert "torch.ops.npu_liger" not in code, f"{name}: the compiled graph still calls the opaque op"
    want_outs, want_grads = _step(function, args, case.grads)
    for what, got, want in (("output", outs, want_outs), ("gradient", grads, want_grads)):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, equal_nan=True,
                                       msg=lambda m: f"{name} {what} {i}: {m}")


@on_cuda
def test_symbolic_sizes_keep_the_op_opaque_without_recompiles(launches_in_every_graph):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: npu_liger.swiglu(a, b) * 2, fullgraph=True, dynamic=True)
    for step, n in enumerate((37, 64, 1000)):
        a, b = (torch.randn(3, n, device="cuda") for _ in range(2))
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got, code = run_and_get_code(compiled, a, b)
        if step == 0:
            assert "torch.ops.npu_liger.swiglu" in "\n".join(code)
        torch.testing.assert_close(got, npu_liger.swiglu(a, b) * 2, rtol=0, atol=0)


@on_cuda
def test_plain_compile_keeps_the_ops_opaque_by_default(set_inductor_launches):
    from torch._inductor.utils import run_and_get_code

    set_inductor_launches("auto")
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: npu_liger.swiglu(a, b) * 2, fullgraph=True, dynamic=False)
    a, b = (torch.randn(3, 64, device="cuda") for _ in range(2))
    got, code = run_and_get_code(compiled, a, b)
    assert "torch.ops.npu_liger.swiglu" in "\n".join(code)
    torch.testing.assert_close(got, npu_liger.swiglu(a, b) * 2, rtol=0, atol=0)


@on_cuda
@pytest.mark.parametrize("setting", ["auto", "1"])
def test_cuda_graphs_capture_the_launched_kernels(set_inductor_launches, setting):
    """Under mode="reduce-overhead" the kernels are launched from the generated code (by default too) and the
    CUDA graphs capture them."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    set_inductor_launches(setting)

    torch._dynamo.reset()
    counters.clear()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(64, 128)
            self.weight = torch.nn.Parameter(torch.randn(64))

        def forward(self, x):
            a, b = self.up(x).view(*x.shape[:-1], 2, 64).unbind(-2)
            return npu_liger.rms_norm(npu_liger.swiglu(a, b), self.weight).sum()

    # compiled as a training loop compiles its model (its parameters are the graphs' static inputs); the loop
    # clears the gradients as an optimizer step would: accumulating into a .grad that lives in the backward
    # graph's memory fails with torch's own ops too (measured on an H200)
    model = Block().cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(8, 64, device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(x)
        loss.backward()
        return loss

    _, code = run_and_get_code(step)
    assert "torch.ops.npu_liger" not in "\n".join(code), "a CUDA-graph compile still calls an opaque op"
    for _ in range(2):
        loss = step()
    assert counters["inductor"].get("cudagraph_skips", 0) == 0
    torch.testing.assert_close(loss, model(x), rtol=1e-5, atol=1e-5)


def test_the_table_names_why_an_op_stays_opaque():
    for op, why in OPAQUE_IN_GRAPHS.items():
        assert isinstance(why, str) and why, op
    if interpreter_enabled() or INDUCTOR_LAUNCHES == "0":
        assert not TRACED, "under the interpreter, or with NPU_LIGER_INDUCTOR_LAUNCHES=0, every op must stay opaque"
    else:
        assert "swiglu" in TRACED and "rms_norm" in TRACED


def test_compile_cache_tag_follows_the_setting_and_the_sources(tmp_path):
    """The tag that keeps a cached graph from outliving a change of NPU_LIGER_INDUCTOR_LAUNCHES or of our kernels:
    one per setting, the user's own tag kept in front, our earlier part replaced, and a new one when any source a
    launched graph bakes in changes."""
    import shutil

    tags = {setting: _op.compile_cache_tag(setting) for setting in ("auto", "1", "0")}
    assert len(set(tags.values())) == 3 and all(t.startswith("npu_liger:") for t in tags.values()), tags
    assert _op.compile_cache_tag("1", "mine") == "mine;" + tags["1"]
    assert _op.compile_cache_tag("0", "mine;" + tags["1"]) == "mine;" + tags["0"]
    for folder in _op.COMPILED_SOURCES:
        shutil.copytree(_op.PACKAGE_ROOT / folder, tmp_path / folder)
    assert _op.compile_cache_tag("auto", root=tmp_path) == tags["auto"]
    kernel = next((tmp_path / "npu_ops").glob("*.py"))
    kernel.write_text(kernel.read_text() + "\n# a kernel fix\n")
    assert _op.compile_cache_tag("auto", root=tmp_path) != tags["auto"]


@on_cuda
def test_import_tags_the_compile_caches():
    from torch.compiler import config

    assert config.cache_key_tag.split(";")[-1] == _op.compile_cache_tag(INDUCTOR_LAUNCHES), config.cache_key_tag


@on_cuda
def test_a_new_setting_compiles_anew(set_inductor_launches):
    """A graph compiled with the launches, then the same function under NPU_LIGER_INDUCTOR_LAUNCHES=0: the second
    compile calls the opaque op (a cache keyed without the setting would hand back the first graph)."""
    from torch._inductor.utils import run_and_get_code

    a, b = (torch.randn(5, 96, device="cuda") for _ in range(2))
    calls = []
    for setting in ("1", "0"):
        set_inductor_launches(setting)
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b: npu_liger.swiglu(a, b) + 1, fullgraph=True, dynamic=False)
        got, code = run_and_get_code(compiled, a, b)
        calls.append("torch.ops.npu_liger.swiglu" in "\n".join(code))
        torch.testing.assert_close(got, npu_liger.swiglu(a, b) + 1, rtol=0, atol=0)
    assert calls == [False, True], calls
