"""benchmarks/train_step.py stays runnable: its CPU smoke mode (tiny HF models, Triton interpreter, each variant
in its own process) for the three families, and the one function that picks the patch flags."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import train_step  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu") != "cpu",
                                reason="the smoke run uses community Triton's CPU interpreter")


def test_patch_kwargs_same_ops_turns_everything_else_off():
    def liger_like(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True,
                   model=None):
        pass

    assert train_step.patch_kwargs(liger_like, "full") == {}
    assert train_step.patch_kwargs(liger_like, "same") == dict(
        rope=True, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=False, swiglu=True)

    from npu_liger.transformers import apply_to_model

    same = train_step.patch_kwargs(apply_to_model, "same")
    assert same["rope"] is True and same["mlp"] is True
    assert all(value is False for name, value in same.items() if name not in ("rope", "mlp")), same
    mask_only = train_step.patch_kwargs(apply_to_model, "causal_mask")  # hf_compiled_causal_mask: no kernel of ours
    assert mask_only.pop("causal_mask") is True and not any(mask_only.values()), mask_only


def test_profile_groups_kernels_by_their_names():
    """--profile-steps sorts kernels: ours and Liger's by their Python names, vendors' by name fragments (cuDNN's
    attention says "wgmma", so attention is matched before matmul)."""
    import npu_liger  # noqa: F401 - imports every kernel module

    ours = train_step.triton_kernel_names("npu_liger")
    assert {"_fused_moe_gather_kernel", "_swiglu_fwd_kernel", "_rms_norm_bwd_kernel"} <= ours
    assert train_step.kernel_group("_fused_moe_gather_kernel", ours) == "npu_liger kernels"
    assert train_step.kernel_group("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == \
        "attention"
    assert train_step.kernel_group("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT") == "matmul"
    assert train_step.kernel_group("triton_red_fused__to_copy_add_mean_11") == "inductor"
    assert train_step.kernel_group("_fused_moe_gather_kernel") == "aten elementwise/reduce"  # without the names
    text = train_step.profile_markdown([dict(family="llama", variant="x", profile=dict(
        steps=2, wall_ms_per_step=80.0, kernel_ms_per_step=70.0, groups={"matmul": 50.0}, top=[["k", 50.0, 8]]))])
    assert "wall 80.0 ms/step, kernels 70.0 ms/step" in text and "| matmul | 50.0 |" in text


def test_smoke_run(tmp_path):
    """Llama through the driver: one process per variant, outputs written, losses equal to transformers'."""
    variants = "hf_eager,npu_liger,liger_full,npu_liger_compiled"
    cmd = [sys.executable, str(REPO / "benchmarks" / "train_step.py"), "--device", "cpu", "--smoke",
           "--families", "llama", "--variants", variants, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    for name in ("train_step.md", "train_step.json", "train_step.png"):
        assert (tmp_path / name).is_file(), name
    rows = json.loads((tmp_path / "train_step.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == variants.split(",")
    by = {r["variant"]: r for r in rows}
    eager = by["hf_eager"]
    assert eager["tokens_per_s"] > 0 and eager["step_ms"] > 0
    # one time per timed step (smoke: 2), which together account for the timed span (the host clock on CPU)
    each = eager["step_ms_each"]
    assert len(each) == 2 and all(t > 0 for t in each)
    assert sum(each) == pytest.approx(2 * eager["step_ms"], rel=0.2)
    for variant in ("npu_liger", "npu_liger_compiled"):
        row = by[variant]
        # fp32, same seed and batches: the first loss (forward only) and the loss after 3 AdamW updates (so the
        # gradients too) agree with transformers' own code to rounding
        assert row["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-5), variant
        assert row["last_loss"] == pytest.approx(eager["last_loss"], rel=1e-4), variant
        assert "'swiglu': 2" in row["note"] and "llama.apply_rotary_pos_emb" in row["note"], row["note"]
    assert by["npu_liger_compiled"]["graph_breaks"] == 0
    if importlib.util.find_spec("liger_kernel") is None:
        assert by["liger_full"]["skipped"] == "liger_kernel is not installed"
    assert "| llama | npu_liger |" in (tmp_path / "train_step.md").read_text()


@pytest.mark.parametrize("family", ["gemma", "qwen3"])
def test_build_model_other_families(family):
    """Gemma (GeGLU, tied embeddings) and Qwen3 (q/k norms) built the way the benchmark builds them: npu_liger's
    patch takes the gated MLP and the rotary function, and one training step matches transformers'."""
    import torch

    import npu_liger.transformers as nlt

    size, batch = train_step.SIZES["smoke"], None
    losses, grads = {}, {}
    try:
        for name in ("hf_eager", "npu_liger"):
            model, note = train_step.build_model(family, size, train_step.VARIANTS[name], torch.device("cpu"),
                                                 torch.float32)
            batch = train_step.make_batches(size, 1, torch.device("cpu"))[0]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            losses[name] = loss.detach()
            grads[name] = [p.grad for p in model.parameters()]
            if name == "npu_liger":
                op = "geglu" if family == "gemma" else "swiglu"
                assert f"'{op}': {size['layers']}" in note and f"{family}.apply_rotary_pos_emb" in note, note
    finally:
        nlt.revert()  # the rotary patch is module-wide
    torch.testing.assert_close(losses["npu_liger"], losses["hf_eager"], rtol=1e-5, atol=1e-6)
    for got, ref in zip(grads["npu_liger"], grads["hf_eager"]):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)
