#!/usr/bin/env bash
# Round twenty-one's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
#   bash benchmarks/results/round21/call.sh harness   the whole timing harness (--quick, 3 rounds), in two halves
#                                                     of ops (merge them with benchmarks/run.py --merge)
#   bash benchmarks/results/round21/call.sh train     round twenty's goal-run training steps (call.sh train there)
#   bash benchmarks/results/round21/call.sh final     round twenty's "final short" (the grpo num_stages probe, the
#                                                     grpo harness row, the CUDA tests of grpo_loss and softmax),
#                                                     then the CUDA tests of jsd and fused_linear_jsd
#   bash benchmarks/results/round21/call.sh cgdiag [F [V,...]]  cudagraph_diag.py: why the CUDA-graph training step
#                                                     gained nothing in this round (family F, default gemma;
#                                                     variants V, default all five)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round21}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"; date -u | tee -a "$OUT/device.txt"
python -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" | tee -a "$OUT/device.txt"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,power.max_limit,temperature.gpu \
    --format=csv | tee -a "$OUT/device.txt"
(lscpu | grep -m1 "Model name"; nproc; env | grep -E "^(PYTORCH|TORCH|CUDA_)" ) | tee -a "$OUT/device.txt"
FIRST=geglu,swiglu,embedding,tvd,cross_entropy,fused_linear_cross_entropy,fused_moe,rope,qwen2vl_mrope,llama4_rope,\
rms_norm
SECOND=fused_add_rms_norm,layer_norm,fused_linear_dpo,kl_div,jsd,fused_linear_jsd,grpo_loss,softmax,sparsemax,dyt,\
poly_norm,group_norm
if [ "$1" = harness ]; then
    for half in FIRST SECOND; do
        timeout 270 python benchmarks/run.py --quick --rounds 3 --ops "${!half}" \
            --skip compile-count,dispatch,cudagraphs --out "/tmp/h_$half" > "$OUT/harness_$half.txt" 2>&1
        echo "$half rc=$?"; grep -E "done at|npu_liger +fwd" "$OUT/harness_$half.txt" | tail -40
    done
    tar czf "$OUT/harness.tgz" -C /tmp h_FIRST h_SECOND
elif [ "$1" = cgdiag ]; then
    timeout 560 python benchmarks/results/round21/cudagraph_diag.py "${2:-gemma}" $3 2>&1 | tee "$OUT/cudagraph_diag.txt"
elif [ "$1" = final ]; then
    OUT="$OUT" bash benchmarks/results/round20/call.sh final short
    NPU_LIGER_TEST_DEVICE=cuda timeout 100 python -m pytest -q -n 8 -p no:cacheprovider tests/test_jsd.py \
        tests/test_fused_linear_jsd.py > "$OUT/tests_jsd.txt" 2>&1; echo "jsd tests rc=$?"; tail -3 "$OUT/tests_jsd.txt"
else
    OUT="$OUT" bash benchmarks/results/round20/call.sh "$@"
fi
