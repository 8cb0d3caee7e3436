#!/usr/bin/env bash
# Round twenty-five's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
# Three calls (a fourth if time is left), each one 600 s command, in this order on one warm machine:
#   bash benchmarks/results/round25/call.sh train    round twenty's goal-run training steps (round20/call.sh train)
#   bash benchmarks/results/round25/call.sh harness  the CUDA tests of round twenty-four (embedding flag, CUDA-graph
#                                                    training), then the whole harness but fused_moe in one run
#                                                    (no merge of halves)
#   bash benchmarks/results/round25/call.sh probe    host µs per call on the GPU host for the rows behind a peer
#                                                    (ours, eager, Liger), the timeline probe (host time, kernel
#                                                    time and the device's idle gaps per forward+backward, ours and
#                                                    Liger's: what holds qwen2vl_mrope at 0.57x), then the fused_moe
#                                                    row alone (last: it may run out of time)
#   bash benchmarks/results/round25/call.sh lossgrad if device time is left: three loss rows whose gradient comes
#                                                    out of the forward, with an incoming gradient of 0.25 (a loss
#                                                    over 4 gradient-accumulation steps): the scaling pass's cost
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round25}; mkdir -p "$OUT"
ALL_BUT_MOE=geglu,swiglu,embedding,tvd,cross_entropy,fused_linear_cross_entropy,rope,qwen2vl_mrope,llama4_rope,\
rms_norm,fused_add_rms_norm,layer_norm,fused_linear_dpo,kl_div,jsd,fused_linear_jsd,grpo_loss,softmax,sparsemax,\
dyt,poly_norm,group_norm
harness() {  # $1: ops; $2: seconds; $3: name of the output folder and log
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/device.txt"
    date -u | tee -a "$OUT/device.txt"
    timeout "$2" python benchmarks/run.py --quick --rounds 3 --ops "$1" \
        --skip compile-count,dispatch,cudagraphs --out "/tmp/$3" > "$OUT/$3.txt" 2>&1
    echo "$3 rc=$?"; grep -E "done at" "$OUT/$3.txt" | tail -30
    tar czf "$OUT/$3.tgz" -C /tmp "$3"
}
case "$1" in
    train) OUT="$OUT" bash benchmarks/results/round20/call.sh train ;;
    harness)
        OUT="$OUT" bash benchmarks/results/round23/call.sh tests
        harness "$ALL_BUT_MOE" 450 harness ;;
    probe)
        timeout 80 python -m benchmarks.host_overhead --ops embedding,rope,qwen2vl_mrope,llama4_rope,layer_norm,\
softmax,dyt,poly_norm --iters 200 --repeats 3 --out "$OUT/host.json" 2>&1 | grep -v Warning | tail -12 | tee "$OUT/host.txt"
        timeout 150 python benchmarks/results/round25/timeline_probe.py embedding,rope,qwen2vl_mrope,layer_norm,\
softmax,poly_norm 2>&1 | grep -v Warning | tee "$OUT/timeline.txt"
        harness fused_moe 320 harness_moe ;;
    lossgrad)
        timeout 200 python benchmarks/run.py --quick --rounds 3 --ops cross_entropy,fused_linear_cross_entropy,\
grpo_loss --loss-grad 0.25 --skip compile-count,dispatch,cudagraphs --out /tmp/harness_lossgrad \
            > "$OUT/harness_lossgrad.txt" 2>&1; echo "rc=$?"; tar czf "$OUT/harness_lossgrad.tgz" -C /tmp harness_lossgrad ;;
    *) echo "usage: call.sh train|harness|probe|lossgrad" >&2; exit 2 ;;
esac
