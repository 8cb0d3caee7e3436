#!/usr/bin/env bash
# Creates ./.venv with npu-liger (editable) and what the CPU demo and the tests need.
# TORCH_SPEC picks the torch build: the default is the CPU build this project's machines carry on disk.
# Elsewhere, TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu fetches PyTorch's CPU wheels (plain `torch`
# from PyPI is a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PIP=(.venv/bin/python -m pip install --disable-pip-version-check --progress-bar off)
step() { printf '[setup] %s\n' "$*"; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with ${PYTHON:-python3}"
  "${PYTHON:-python3}" -m venv .venv
fi
# pip's own lines are filtered to the ones that say what it fetches and what it installed.
# On failure (pipefail + set -e) the ERROR lines have been shown; rerun the pip command by hand for the rest.
quiet_pip() { "${PIP[@]}" "$@" 2>&1 | { grep -E --line-buffered '^(Collecting|Successfully installed|ERROR)' || true; }; }
step "installing $TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (skipped if present)"
quiet_pip "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
step "installing npu-liger (editable) with the cpu and test extras: triton, transformers, peft, pytest, hypothesis, ruff, matplotlib, tqdm"
quiet_pip -e ".[cpu,test]"
step "ready: .venv/bin/python"
