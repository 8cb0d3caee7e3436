#!/usr/bin/env bash
# Creates ./.venv with npu-liger (editable) and what the CPU demo and the tests need.
# torch comes from PyTorch's CPU index (https://download.pytorch.org/whl/cpu): plain `torch` from PyPI is a
# multi-GB CUDA build. Where that index cannot be reached (a machine that sees only PyPI or a local mirror), one
# line says so and pip's default index is used instead, after a few seconds, not minutes.
#   TORCH_SPEC       the torch to install (default torch==2.13.0)
#   TORCH_INDEX_URL  the index to take it from, no fallback (set but empty: pip's default index, no probe)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu
PROBE_TIMEOUT_S=5
PIP=(.venv/bin/python -m pip install --disable-pip-version-check --progress-bar off)
step() { printf '[setup] %s\n' "$*"; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with ${PYTHON:-python3}"
  "${PYTHON:-python3}" -m venv .venv
fi
# pip's own lines are filtered to the ones that say what it fetches and what it installed.
# On failure (pipefail + set -e) the ERROR lines have been shown; rerun the pip command by hand for the rest.
quiet_pip() { "${PIP[@]}" "$@" 2>&1 | { grep -E --line-buffered '^(Collecting|Successfully installed|ERROR)' || true; }; }
# The CPU index, if it answers within PROBE_TIMEOUT_S (urllib honours HTTPS_PROXY as pip does).
reachable() {
  .venv/bin/python - "$1" "$PROBE_TIMEOUT_S" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1].rstrip("/") + "/torch/", method="HEAD"),
                       timeout=float(sys.argv[2]))
PY
}
if [ -z "${TORCH_INDEX_URL+set}" ]; then
  if reachable "$CPU_INDEX"; then
    TORCH_INDEX_URL=$CPU_INDEX
  else
    step "$CPU_INDEX is not reachable (probe timeout ${PROBE_TIMEOUT_S} s): taking torch from pip's default index"
    TORCH_INDEX_URL=
  fi
fi
step "installing $TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (skipped if present)"
quiet_pip "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
step "installing npu-liger (editable) with the cpu and test extras: triton, transformers, peft, pytest, hypothesis, ruff, matplotlib, tqdm"
quiet_pip -e ".[cpu,test]"
step "ready: .venv/bin/python"
