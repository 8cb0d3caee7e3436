#!/usr/bin/env bash
# Round nineteen's GPU calls, from the repository root with liger-kernel 0.8.5 importable; logs into $OUT_DIR.
#   bash benchmarks/results/round19/call1.sh tests            the CUDA tests of the ops changed since round eighteen
#   bash benchmarks/results/round19/call1.sh probe dyt ...    each op's probe (benchmarks/results/round19/<op>_probe.py)
out=${OUT_DIR:-.}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
what=$1; shift
if [ "$what" = tests ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
    date -u | tee -a "$out/device.txt"
    NPU_LIGER_TEST_DEVICE=cuda timeout "${TESTS_TIMEOUT:-180}" python -m pytest -q -n 8 -p no:cacheprovider \
        tests/test_dyt.py tests/test_poly_norm.py tests/test_group_norm.py tests/test_grpo_loss.py \
        tests/test_softmax.py tests/test_kl_div.py tests/test_inductor_launches.py tests/test_preference_losses.py \
        > "$out/tests.txt" 2>&1
    echo "tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" "$out/tests.txt" | tail -25
else
    for op in "$@"; do
        echo "== $op $(date -u +%T)"
        timeout "${PROBE_TIMEOUT:-80}" python "benchmarks/results/round19/${op}_probe.py" > "$out/${op}_probe.txt" 2>&1
        echo "rc=$?"; cat "$out/${op}_probe.txt"
    done
fi
