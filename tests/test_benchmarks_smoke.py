"""The GPU benchmark harness stays importable and runnable: its CPU smoke mode (Triton interpreter, tiny
shapes, wall-clock timer) for geglu only, in a subprocess so TRITON_INTERPRET is set before triton loads."""

import json
import statistics
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "run.py"

pytestmark = pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu") != "cpu",
                                reason="the smoke run uses community Triton's CPU interpreter")


def _run(cmd, timeout=150):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_smoke_geglu_writes_every_output(tmp_path):
    out = tmp_path / "run"
    stdout = _run([sys.executable, str(RUN), "--device", "cpu", "--smoke", "--ops", "geglu", "--out", str(out)])
    assert "copy bandwidth" in stdout and "MISMATCH" not in stdout
    for name in ("results.csv", "results.json", "results.png", "BENCHMARKS_snippet.md"):
        assert (out / name).is_file(), name
    data = json.loads((out / "results.json").read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"npu_liger", "eager"}
    assert all(r["op"] == "geglu" and r["check"] == "ok" and r["fwd_ms"] > 0 and r["fb_ms"] > 0 for r in rows.values())
    assert rows["npu_liger"]["bytes_fb"] == 8 * rows["npu_liger"]["bytes_fwd"] // 3
    assert rows["npu_liger"]["speedup_fwd"] is not None
    assert data["meta"]["copy_gbps"] > 0
    assert [d["op"] for d in data["dispatch"]] == ["geglu"] and data["dispatch"][0]["launcher_us"] > 0
    # No CUDA graphs on CPU: the section says so; the eager model check behind it still matched.
    cudagraphs = data["cudagraphs"]
    assert cudagraphs["status"] == "not run" and cudagraphs["npu_liger_ops"] == ["geglu"]
    assert cudagraphs["loss_err"] <= 1e-4 and cudagraphs["grad_err"] <= 1e-3
    assert "status: not run" in stdout
    assert "| geglu |" in (out / "BENCHMARKS_snippet.md").read_text()

    merged = tmp_path / "merged"
    _run([sys.executable, str(RUN), "--merge", str(out), str(out), "--out", str(merged)])
    assert len(json.loads((merged / "results.json").read_text())["rows"]) == 2


def test_timing_rounds_report_the_median_of_interleaved_rounds(tmp_path):
    """--rounds N times every variant of a case once per round, in turn; each row keeps its N times and reports
    their median (the smoke run's default is one round)."""
    out = tmp_path / "rounds"
    stdout = _run([sys.executable, str(RUN), "--device", "cpu", "--smoke", "--ops", "swiglu", "--rounds", "3",
                   "--skip", "dispatch,cudagraphs", "--out", str(out)])
    assert "median of 3 round(s) per row" in stdout
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["timing_rounds"] == 3 and {r["variant"] for r in data["rows"]} == {"npu_liger", "eager"}
    for row in data["rows"]:
        for mode in ("fwd", "fb"):
            times = row[f"{mode}_ms_rounds"]
            assert len(times) == 3 and all(t > 0 for t in times)
            assert row[f"{mode}_ms"] == statistics.median(times)


def test_outputs_go_to_an_untracked_folder_unless_published():
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks.run import PUBLISHED_OUT, parse_args
    finally:
        sys.path.remove(str(REPO))
    default = Path(parse_args(["--device", "cpu", "--smoke"]).out)
    assert default == REPO / "benchmarks" / "output"
    assert Path(parse_args(["--publish"]).out) == Path(PUBLISHED_OUT) == REPO / "benchmarks" / "results"
    with pytest.raises(SystemExit):  # a smoke run is never published
        parse_args(["--device", "cpu", "--smoke", "--publish"])
    with pytest.raises(SystemExit):  # one place or the other
        parse_args(["--publish", "--out", "/tmp/x"])
    if (REPO / ".git").exists() and shutil.which("git"):  # in a checkout, git ignores what the default run writes
        probe = default / "results.json"
        proc = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=REPO, capture_output=True)
        assert proc.returncode == 0, f"{probe} is not ignored by git: add benchmarks/output/ to .gitignore"


def test_host_overhead_with_faked_launches_measures_the_package_alone(tmp_path):
    """``host_overhead --fake-launch`` (CPU): every row has positive per-call times for npu_liger and eager, and
    the ops whose host code reads a kernel's output are left out."""
    out = tmp_path / "host.json"
    _run([sys.executable, "-m", "benchmarks.host_overhead", "--device", "cpu", "--fake-launch", "--ops",
          "swiglu,cross_entropy", "--iters", "20", "--repeats", "1", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert [row["op"] for row in rows] == ["swiglu"]
    assert all(rows[0][f"{v}_{k}_us"] > 0 for v in ("npu_liger", "eager") for k in ("fwd", "fb"))


def test_smoke_fused_linear_dpo_matches_the_unfused_formula(tmp_path):
    """The DPO spec (policy and reference model, chosen then rejected) at its tiny smoke size: ours agrees with
    the unfused torch formula."""
    out = tmp_path / "dpo"
    stdout = _run([sys.executable, str(RUN), "--device", "cpu", "--smoke", "--ops", "fused_linear_dpo", "--out",
                   str(out)])
    assert "MISMATCH" not in stdout
    rows = {r["variant"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert {"npu_liger", "eager"} <= set(rows)
    assert all(r["op"] == "fused_linear_dpo" and r["check"] == "ok" and r["fb_ms"] > 0 for r in rows.values())


def test_memory_peak_replay_finds_the_allocations_alive_at_the_peak():
    """benchmarks/memory_peak.py runs on CUDA only; its replay of the allocator's trace is plain Python."""
    sys.path.insert(0, str(REPO))
    from benchmarks.memory_peak import by_site, peak_allocations

    def frame(path, line):
        return [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
                {"filename": f"/site/{path}", "line": line, "name": "f"}]

    events = [
        {"action": "free_completed", "addr": 99, "size": 7, "frames": []},  # held before the trace
        {"action": "alloc", "addr": 1, "size": 100, "frames": frame("npu_liger/npu_ops/a.py", 10)},
        {"action": "alloc", "addr": 2, "size": 50, "frames": frame("transformers/models/b.py", 20)},
        {"action": "free_requested", "addr": 1, "size": 100, "frames": []},  # not yet freed
        {"action": "alloc", "addr": 3, "size": 30, "frames": frame("npu_liger/npu_ops/a.py", 10)},
        {"action": "free_completed", "addr": 1, "size": 100, "frames": []},
        {"action": "alloc", "addr": 4, "size": 60, "frames": frame("npu_liger/npu_ops/a.py", 11)},
    ]
    peak, alive = peak_allocations(events)
    assert peak == 100 + 50 + 30 - 7
    assert sorted(a["addr"] for a in alive) == [1, 2, 3]
    assert by_site(alive) == [("npu_liger/npu_ops/a.py:10 f", 130, 2), ("transformers/models/b.py:20 f", 50, 1)]


def test_loss_grad_reaches_every_scalar_loss_row(monkeypatch):
    """``run.py --loss-grad G``: every row whose output is a scalar loss gets G as its incoming gradient (a scaled
    loss), so the harness can time the losses that scale a kept gradient in the backward."""
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import run, specs

    assert run.parse_args(["--loss-grad", "0.25"]).loss_grad == 0.25
    monkeypatch.setattr(specs, "LOSS_GRAD", 0.25)
    scalar_losses = []
    for name, spec in specs.SPECS.items():
        case = spec.cases("tiny")[0]
        inputs = spec.make(case.params, case.dtype, "cpu", torch.Generator().manual_seed(0))
        grads = [g for g in inputs.grads_out if g is not None and g.dim() == 0]
        if grads:
            scalar_losses.append(name)
            assert all(g.item() == 0.25 for g in grads), name
    assert {"cross_entropy", "fused_linear_cross_entropy", "grpo_loss", "kl_div", "tvd"} <= set(scalar_losses)
