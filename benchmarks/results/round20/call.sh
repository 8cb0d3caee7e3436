#!/usr/bin/env bash
# Round twenty's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
#   bash benchmarks/results/round20/call.sh probe    grpo_probe.py, the CUDA tests of the kernels it changes, host
#                                                    costs per call, and the gemma A/B of Inductor launches in plain
#                                                    compiles
#   bash benchmarks/results/round20/call.sh train    the goal run's training steps (three families, five variants)
#   bash benchmarks/results/round20/call.sh final    grpo_probe.py's second set (num_stages), the grpo_loss harness
#                                                    row at the new defaults, the CUDA tests of grpo_loss and
#                                                    softmax at those defaults, llama's and qwen3's eager and compiled
#                                                    training steps with their peers ("final short": not the
#                                                    training steps)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round20}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"; date -u | tee -a "$OUT/device.txt"
if [ "$1" = final ]; then
    timeout 60 python benchmarks/results/round20/grpo_probe.py 2>&1 | grep -v Warning > "$OUT/grpo_probe2.txt"
    cat "$OUT/grpo_probe2.txt"
    timeout 70 python benchmarks/run.py --quick --rounds 3 --ops grpo_loss --skip compile-count,dispatch,cudagraphs \
        --out /tmp/hgrpo > "$OUT/harness_grpo.txt" 2>&1; grep -E "grpo_loss +B8" "$OUT/harness_grpo.txt" | head -8
    tar czf "$OUT/hgrpo.tgz" -C /tmp hgrpo
    NPU_LIGER_TEST_DEVICE=cuda timeout 100 python -m pytest -q -n 8 -p no:cacheprovider tests/test_grpo_loss.py \
        tests/test_softmax.py > "$OUT/tests2.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/tests2.txt"
    [ "$2" = short ] && exit 0
    timeout 210 python benchmarks/train_step.py --quick --families llama,qwen3 --variants hf_compiled,\
npu_liger_compiled,liger_full,npu_liger --timeout-s 80 --budget-s 200 --out /tmp/train2 > "$OUT/train2.txt" 2>&1
    tail -12 "$OUT/train2.txt"; tar czf "$OUT/train2.tgz" -C /tmp train2
elif [ "$1" = train ]; then
    timeout 570 python benchmarks/train_step.py --quick --families llama,qwen3,gemma --variants liger_full,npu_liger,\
hf_compiled,npu_liger_compiled,npu_liger_compiled_cudagraphs --budget-s 500 --timeout-s 120 --out /tmp/train \
        > "$OUT/train.txt" 2>&1; echo "rc=$?"; tail -40 "$OUT/train.txt"; tar czf "$OUT/train.tgz" -C /tmp train
else
    timeout 200 python benchmarks/results/round20/grpo_probe.py 2>&1 | grep -v Warning > "$OUT/grpo_probe.txt"
    cat "$OUT/grpo_probe.txt"
    NPU_LIGER_TEST_DEVICE=cuda timeout 120 python -m pytest -q -n 8 -p no:cacheprovider tests/test_grpo_loss.py \
        tests/test_softmax.py > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/tests.txt"
    timeout 50 python -m benchmarks.host_overhead --ops dyt,poly_norm,softmax,group_norm,grpo_loss --iters 200 \
        --repeats 3 2>&1 | tail -9 | tee "$OUT/host.txt"
    timeout 190 python benchmarks/train_step.py --quick --families gemma --variants hf_compiled,npu_liger_compiled,\
npu_liger_compiled_launches --timeout-s 80 --budget-s 180 --out /tmp/tab > "$OUT/train_ab.txt" 2>&1
    tail -12 "$OUT/train_ab.txt"; tar czf "$OUT/tab.tgz" -C /tmp tab
fi
