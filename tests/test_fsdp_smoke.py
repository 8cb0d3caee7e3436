"""FSDP2 on two CPU processes (gloo, Triton interpreter): benchmarks/fsdp_throughput.py's smoke mode and
examples/fsdp_train.py, each launched the way a user launches it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu") != "cpu",
                                reason="runs on the CPU through community Triton's interpreter")


def _run(cmd, timeout=240):
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_fsdp_throughput_smoke(tmp_path):
    _run([sys.executable, str(REPO / "benchmarks" / "fsdp_throughput.py"), "--device", "cpu", "--smoke",
          "--out", str(tmp_path)])
    data = json.loads((tmp_path / "fsdp.json").read_text())
    by = {r["variant"]: r for r in data["rows"]}
    assert list(by) == ["hf_eager", "npu_liger", "liger_full"]
    eager, ours = by["hf_eager"], by["npu_liger"]
    assert eager["ranks"] == ours["ranks"] == 2 and eager["tokens_per_s"] > 0 and ours["tokens_per_s"] > 0
    # fp32, same weights and per-rank batches: npu_liger's sharded run follows transformers' to rounding
    assert ours["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-5)
    assert ours["last_loss"] == pytest.approx(eager["last_loss"], rel=1e-4)
    assert "'swiglu': 2" in ours["note"] and "llama.apply_rotary_pos_emb" in ours["note"]
    if "skipped" in by["liger_full"]:
        assert by["liger_full"]["skipped"] == "liger_kernel is not installed"
    assert "| npu_liger |" in (tmp_path / "fsdp.md").read_text()


def test_fsdp_train_example():
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(REPO / "examples" / "fsdp_train.py"), "--device", "cpu", "--steps", "3"])
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.M)]
    assert len(losses) == 3, out  # rank 0 alone prints, once per step
    assert "'swiglu': 2" in out and "llama.apply_rotary_pos_emb" in out, out
    assert losses[-1] < losses[0], losses


def test_fsdp_moe_smoke(tmp_path):
    """A Qwen3-MoE-style model under FSDP2: experts on npu_liger.fused_moe follow transformers' loss curve."""
    _run([sys.executable, str(REPO / "benchmarks" / "fsdp_throughput.py"), "--device", "cpu", "--smoke",
          "--family", "qwen3_moe", "--variants", "hf_eager,npu_liger", "--out", str(tmp_path)])
    by = {r["variant"]: r for r in json.loads((tmp_path / "fsdp.json").read_text())["rows"]}
    eager, ours = by["hf_eager"], by["npu_liger"]
    assert ours["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-5)
    assert ours["last_loss"] == pytest.approx(eager["last_loss"], rel=1e-4)
    assert "'fused_moe': 2" in ours["note"] and "qwen3_moe.apply_rotary_pos_emb" in ours["note"], ours["note"]


def test_fsdp_train_example_moe():
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(REPO / "examples" / "fsdp_train.py"), "--device", "cpu", "--steps", "3", "--family", "qwen3_moe"])
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.M)]
    assert len(losses) == 3 and "'fused_moe': 2" in out, out
    assert losses[-1] < losses[0], losses
