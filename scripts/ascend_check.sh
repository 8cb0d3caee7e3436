#!/usr/bin/env bash
# Ascend compile and UB-overflow check, without Ascend hardware (docs/ASCEND_CHECK.md).
# Creates its own venv (default .ascend-venv/, never the project's .venv: triton-ascend owns the `triton/` dir that
# community triton would overwrite) with triton-ascend, pybind11, ascendnpu-ir and a CPU torch, installs this
# checkout of npu-liger into it without dependencies, and runs scripts/ascend_check.py with the given arguments.
#   ASCEND_CHECK_VENV   where the venv lives (default .ascend-venv)
#   TORCH_SPEC          the CPU torch to install (default torch==2.13.0, the CPU build this project's machines carry;
#                       never plain `torch`, which pulls a CUDA build, and never torch_npu)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ASCEND_CHECK_VENV:-.ascend-venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PIP_FLAGS=(-q --disable-pip-version-check)
start=$(date +%s)
if ! "$VENV/bin/python" -c "import triton.backends.ascend.compiler, ascendnpuir, pybind11, torch" 2>/dev/null; then
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "ascend_check: $VENV exists and is not a venv; set ASCEND_CHECK_VENV to another folder" >&2
    exit 2
  fi
  "${PYTHON:-python3}" -m venv --clear "$VENV"
  "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" "triton-ascend==3.2.0" pybind11 "ascendnpu-ir==1.2.0" "$TORCH_SPEC" \
    "setuptools>=64"
fi
# This checkout, not an editable link: the check compiles exactly the tree it was started on.
"$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-deps --no-build-isolation --force-reinstall . >/dev/null
echo "ascend_check: venv $VENV ready in $(( $(date +%s) - start ))s"
unset TRITON_INTERPRET NPU_LIGER_EMULATED_CHIP NPU_LIGER_EMULATED_UB_BYTES
exec "$VENV/bin/python" scripts/ascend_check.py "$@"
