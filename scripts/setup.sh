#!/usr/bin/env bash
# Creates ./.venv with npu-liger (editable) and what the CPU demo and the tests need.
# TORCH_SPEC picks the torch build: the default is the CPU build this project's machines carry on disk;
# plain `torch` from PyPI would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_SPEC" -e ".[cpu,test]"
