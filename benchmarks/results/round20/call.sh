#!/usr/bin/env bash
# Round twenty's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
#   bash benchmarks/results/round20/call.sh          on an H200: the goal run's training steps (three families, five
#                                                    variants); on another card: rows_probe.py, host costs and the
#                                                    gemma launches A/B
#   bash benchmarks/results/round20/call.sh probe    rows_probe.py, host costs and the A/B on any card
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round20}; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"; date -u
if [ "$1" != probe ] && echo "$gpu" | grep -q H200; then
    timeout 570 python benchmarks/train_step.py --quick --families llama,qwen3,gemma --variants liger_full,npu_liger,\
hf_compiled,npu_liger_compiled,npu_liger_compiled_cudagraphs --budget-s 500 --timeout-s 120 --out /tmp/train \
        > "$OUT/train.txt" 2>&1; echo "rc=$?"; tail -40 "$OUT/train.txt"; tar czf "$OUT/train.tgz" -C /tmp train
else
    timeout 250 python benchmarks/results/round20/rows_probe.py 2>&1 | grep -v Warning > "$OUT/rows_probe.txt"
    cat "$OUT/rows_probe.txt"
    timeout 60 python -m benchmarks.host_overhead --ops dyt,poly_norm,softmax,group_norm,rms_norm --iters 300 \
        --repeats 3 2>&1 | tail -9 | tee "$OUT/host.txt"
    timeout 230 python benchmarks/train_step.py --quick --families gemma --variants hf_compiled,npu_liger_compiled,\
npu_liger_compiled_launches --timeout-s 90 --budget-s 220 --out /tmp/tab > "$OUT/train_ab.txt" 2>&1
    tail -15 "$OUT/train_ab.txt"; tar czf "$OUT/tab.tgz" -C /tmp tab
fi
