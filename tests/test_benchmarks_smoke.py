"""The GPU benchmark harness stays importable and runnable: its CPU smoke mode (Triton interpreter, tiny
shapes, wall-clock timer) for geglu only, in a subprocess so TRITON_INTERPRET is set before triton loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "run.py"

pytestmark = pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu") == "npu",
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
    cudagraphs = data["cudagraphs"]  # nothing to capture on the CPU: "not run", never a misleading "ok"
    assert cudagraphs["status"] == "not run" and cudagraphs["eager_model_check"] == "ok"
    assert cudagraphs["npu_liger_ops"] == ["geglu"] and "status: not run" in stdout
    assert "| geglu |" in (out / "BENCHMARKS_snippet.md").read_text()

    assert not (REPO / "benchmarks" / "results" / "BENCHMARKS_snippet.md").exists()

    merged = tmp_path / "merged"
    _run([sys.executable, str(RUN), "--merge", str(out), str(out), "--out", str(merged)])
    assert len(json.loads((merged / "results.json").read_text())["rows"]) == 2


def test_op_missing_from_npu_liger_is_skipped(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks import specs;"
        "specs.SPECS['geglu'].available = lambda: 'AttributeError: pretend it is not written yet';"
        "from benchmarks.run import main;"
        "sys.exit(main(['--device', 'cpu', '--smoke', '--ops', 'geglu', '--skip', 'cudagraphs', '--out', sys.argv[2]]))"
    )
    stdout = _run([sys.executable, "-c", code, str(REPO), str(tmp_path)])
    assert "npu_liger.geglu: not available" in stdout
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == []


def test_default_output_is_untracked_and_publish_is_explicit():
    sys.path.insert(0, str(REPO))
    from benchmarks.run import DEFAULT_OUT, PUBLISHED_OUT, parse_args

    assert parse_args(["--device", "cpu", "--smoke"]).out == DEFAULT_OUT
    assert parse_args(["--publish"]).out == PUBLISHED_OUT
    ignored = subprocess.run(["git", "check-ignore", "-q", str(Path(DEFAULT_OUT) / "results.json")], cwd=REPO)
    assert ignored.returncode == 0, "benchmarks/output/ must be git-ignored"
    with pytest.raises(SystemExit):
        parse_args(["--publish", "--out", "/tmp/x"])
