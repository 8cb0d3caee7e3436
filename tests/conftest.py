"""Test configuration: the device under test and the hypothesis profiles.

The device comes from ``--device`` or ``NPU_LIGER_TEST_DEVICE`` (default ``cpu``). CPU runs use the Triton
interpreter, which must be switched on before triton is first imported, i.e. before anything below.
"""

import os
import sys


def _device_from_argv():
    """``--device=X`` or ``--device X``: read before pytest parses options, because TRITON_INTERPRET must be
    set before anything imports triton (a missed ``--device cuda`` would run the CPU interpreter instead)."""
    for i, arg in enumerate(sys.argv):
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
        if arg == "--device" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
    return None


DEVICE = _device_from_argv() or os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
os.environ["NPU_LIGER_TEST_DEVICE"] = DEVICE
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
if DEVICE == "npu":
    import torch_npu  # noqa: F401

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",  # the CPU interpreter: few examples, no deadline (the first call of a shape compiles nothing but is slow)
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
settings.register_profile("gpu", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if DEVICE == "cpu" else "gpu"))


def pytest_addoption(parser):
    parser.addoption("--device", default=None, help="device to test on: cpu (Triton interpreter), cuda or npu")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def small_ub(monkeypatch):
    """Shrink the emulated UB (CPU runs only) so every tiling loop takes several iterations."""
    if DEVICE != "cpu":
        pytest.skip("the emulated UB only exists on CPU runs")

    def shrink(ub_bytes: int):
        monkeypatch.setenv("NPU_LIGER_EMULATED_UB_BYTES", str(ub_bytes))

    return shrink


@pytest.fixture
def set_inductor_launches():
    """``set_inductor_launches(setting)``: checklist.inductor_launches(setting) until the test ends (a later call
    takes over from an earlier one)."""
    import contextlib

    from checklist import inductor_launches

    with contextlib.ExitStack() as stack:
        yield lambda setting: stack.enter_context(inductor_launches(setting))
