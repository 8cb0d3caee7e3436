#!/usr/bin/env bash
# Round twenty-three's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
#   bash benchmarks/results/round23/call.sh check    the CUDA tests of CUDA-graph training (new) and of Inductor
#                                                    launches; the CUDA-graph diagnosis for llama; round eighteen's
#                                                    code (old18/, from `git archive 364a324 npu_liger benchmarks`,
#                                                    carried; today's train_step.py) timing its CUDA-graph step
#                                                    with a kernel profile, our kernels launched by Inductor as
#                                                    rounds seventeen and eighteen ran them
#   bash benchmarks/results/round23/call.sh tests    after the flag fix: the CUDA tests of the embedding's flag
#                                                    and of CUDA-graph training
#   bash benchmarks/results/round23/call.sh train    round twenty's goal-run training steps
#   bash benchmarks/results/round23/call.sh harness  the whole timing harness in two halves (round21/call.sh)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round23}; mkdir -p "$OUT"
if [ "$1" = check ]; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/device.txt"
    date -u | tee -a "$OUT/device.txt"
    NPU_LIGER_TEST_DEVICE=cuda timeout 170 python -m pytest -q -n 8 -p no:cacheprovider \
        tests/test_transformers_integration.py tests/test_inductor_launches.py > "$OUT/tests.txt" 2>&1
    echo "tests rc=$?"; grep -E "FAILED|Error|passed|failed" "$OUT/tests.txt" | tail -20
    timeout 120 python benchmarks/results/round21/cudagraph_diag.py llama \
        npu_liger_compiled_cudagraphs 2>&1 | tee "$OUT/cudagraph_diag.txt"
    (cd old18 && NPU_LIGER_INDUCTOR_LAUNCHES=1 PYTHONPATH=/tmp/site:$PWD timeout 110 python benchmarks/train_step.py --quick --families llama \
        --variants npu_liger_compiled_cudagraphs --profile-steps 2 --timeout-s 100 --out /tmp/old18 \
        > "$OUT/old18_train.txt" 2>&1; echo "old18 rc=$?"; tail -4 "$OUT/old18_train.txt")
    python - <<'PY' | tee "$OUT/old18_summary.txt"
import json
for r in json.load(open("/tmp/old18/train_step.json"))["rows"]:
    prof = r.get("profile", {})
    print(r["variant"], round(r.get("tokens_per_s", 0)), "step ms", r.get("step_ms_each"), "loss",
          r.get("first_loss"), "->", r.get("last_loss"), "kernel ms/step", prof.get("kernel_ms_per_step"),
          "wall", prof.get("wall_ms_per_step"), prof.get("error", ""))
PY
    cp /tmp/old18/train_step.json "$OUT/old18_train_step.json"
elif [ "$1" = tests ]; then
    nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"; date -u | tee -a "$OUT/device.txt"
    NPU_LIGER_TEST_DEVICE=cuda timeout 130 python -m pytest -q -n 8 -p no:cacheprovider tests/test_embedding.py \
        tests/test_transformers_integration.py -k "flag or pool or cuda_graph" > "$OUT/tests2.txt" 2>&1
    echo "tests rc=$?"; grep -E "FAILED|Error|passed|failed" "$OUT/tests2.txt" | tail -20
elif [ "$1" = harness ]; then
    OUT="$OUT" bash benchmarks/results/round21/call.sh harness
else
    OUT="$OUT" bash benchmarks/results/round20/call.sh "$@"
fi
