#!/usr/bin/env bash
# Round twenty-four's GPU calls, from the repository root (liger-kernel 0.8.5 wheel in .whl/); logs into $OUT.
# Round twenty-three's three calls, regrouped so that each fits one 600 s command:
#   bash benchmarks/results/round24/call.sh first    the CUDA tests of the embedding's flag and of CUDA-graph
#                                                    training (round23/call.sh tests), then the harness's first
#                                                    half of ops
#   bash benchmarks/results/round24/call.sh train    round twenty's goal-run training steps (round20/call.sh train)
#   bash benchmarks/results/round24/call.sh second   the harness's second half of ops
#   bash benchmarks/results/round24/call.sh rest     the first half's ops after fused_moe (in round twenty-four the
#                                                    first half ran out of its 270 s inside fused_moe's row)
#   bash benchmarks/results/round24/call.sh probe    for the next session: the fused_moe row alone, then round
#                                                    eighteen's rotary host-floor probe (public function, bare
#                                                    autograd.Function, Liger-Kernel; rope and qwen2vl_mrope),
#                                                    for qwen2vl_mrope's 0.57x forward+backward of this round
# Merge the halves with: python benchmarks/run.py --merge h_FIRST h_REST h_SECOND --out DIR (see benchmarks/run.py --help).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
OUT=${OUT:-/tmp/round24}; mkdir -p "$OUT"
FIRST=geglu,swiglu,embedding,tvd,cross_entropy,fused_linear_cross_entropy,fused_moe,rope,qwen2vl_mrope,llama4_rope,\
rms_norm
SECOND=fused_add_rms_norm,layer_norm,fused_linear_dpo,kl_div,jsd,fused_linear_jsd,grpo_loss,softmax,sparsemax,dyt,\
poly_norm,group_norm
REST=rope,qwen2vl_mrope,llama4_rope,rms_norm
harness_half() {  # $1: the name of the variable that lists the ops (FIRST, SECOND, REST, MOE); $2: seconds
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/device.txt"
    timeout "${2:-270}" python benchmarks/run.py --quick --rounds 3 --ops "${!1}" \
        --skip compile-count,dispatch,cudagraphs --out "/tmp/h_$1" > "$OUT/harness_$1.txt" 2>&1
    echo "$1 rc=$?"; grep -E "done at|npu_liger +fwd" "$OUT/harness_$1.txt" | tail -40
    tar czf "$OUT/harness_$1.tgz" -C /tmp "h_$1"
}
case "$1" in
    first) OUT="$OUT" bash benchmarks/results/round23/call.sh tests; harness_half FIRST ;;
    second) harness_half SECOND ;;
    rest) harness_half REST ;;
    probe)
        MOE=fused_moe; harness_half MOE 330
        timeout 200 python benchmarks/results/round18/rotary_floor.py 2>&1 | grep -v Warning | tee "$OUT/rotary_floor.txt" ;;
    train) OUT="$OUT" bash benchmarks/results/round20/call.sh train ;;
    *) echo "usage: call.sh first|train|second|rest|probe" >&2; exit 2 ;;
esac
