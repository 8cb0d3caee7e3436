"""Helpers of ``scripts/ascend_check.py`` (the Ascend compile and UB-overflow check, docs/ASCEND_CHECK.md).

- ``compiler``: chip profiles and the two compile stages (triton-ascend to Linalg, bishengir-compile's UB plan)
- ``record``:   runs the package's real host launchers on CPU tensors and records the kernel launches
- ``cases``:    the case table: every op x problem size, from the op contracts in docs/DESIGN.md section 4

Runs only inside the check venv (triton-ascend, not community triton), never inside the package's tests.
"""
