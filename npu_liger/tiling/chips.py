"""Known Ascend chips: Unified-Buffer size and vector-core count.

Used to emulate a chip on CPU (so the interpreter runs the NPU tiling loops and persistent grid) and by the
Ascend compile check. On a real NPU the UB size comes from the UB manager and the core count from the
triton-ascend driver; this table is never consulted there.

Values are per AI core / per SoC as CANN's platform configuration reports them for the 910B and 910_93 (A3)
families (192 KiB UB; 20 or 24 AI cores, two vector cores each). Ascend950's UB is what bishengir-compile's
Ascend950 targets report (2031616 bits = 248 KiB, see docs/ASCEND_CHECK.md); its vector-core count is the
published preview figure and less certain. Override with ``NPU_LIGER_EMULATED_UB_BYTES`` if you know better.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict

EMULATED_CHIP_ENV = "NPU_LIGER_EMULATED_CHIP"
EMULATED_UB_BYTES_ENV = "NPU_LIGER_EMULATED_UB_BYTES"
DEFAULT_EMULATED_CHIP = "Ascend910B3"


@dataclass(frozen=True)
class AscendChip:
    name: str
    ub_bytes: int
    vector_cores: int

    @property
    def ub_bits(self) -> int:
        return self.ub_bytes * 8


_KIB = 1024
ASCEND_CHIPS: Dict[str, AscendChip] = {
    chip.name: chip
    for chip in (
        AscendChip("Ascend910B1", 192 * _KIB, 48),
        AscendChip("Ascend910B2", 192 * _KIB, 48),
        AscendChip("Ascend910B3", 192 * _KIB, 40),
        AscendChip("Ascend910B4", 192 * _KIB, 40),
        AscendChip("Ascend910_9391", 192 * _KIB, 48),
        AscendChip("Ascend910_9392", 192 * _KIB, 48),
        AscendChip("Ascend910_9381", 192 * _KIB, 48),
        AscendChip("Ascend910_9382", 192 * _KIB, 48),
        AscendChip("Ascend910_9372", 192 * _KIB, 40),
        AscendChip("Ascend910_9362", 192 * _KIB, 40),
        AscendChip("Ascend950", 248 * _KIB, 64),
    )
}


def get_chip(name: str) -> AscendChip:
    try:
        return ASCEND_CHIPS[name]
    except KeyError:
        known = ", ".join(sorted(ASCEND_CHIPS))
        raise ValueError(f"unknown Ascend chip {name!r}; known chips: {known}") from None


def emulated_chip() -> AscendChip:
    """The chip CPU runs emulate: ``NPU_LIGER_EMULATED_CHIP`` (default Ascend910B3), with its UB optionally
    shrunk or grown by ``NPU_LIGER_EMULATED_UB_BYTES`` (tests use that to force many tiling iterations).
    Read on every call, so tests may change the environment between launches."""
    chip = get_chip(os.environ.get(EMULATED_CHIP_ENV, DEFAULT_EMULATED_CHIP))
    override = os.environ.get(EMULATED_UB_BYTES_ENV)
    if override is None:
        return chip
    try:
        ub_bytes = int(override)
    except ValueError:
        ub_bytes = 0
    if ub_bytes <= 0:
        raise ValueError(f"{EMULATED_UB_BYTES_ENV} must be a positive number of bytes, got {override!r}")
    return AscendChip(chip.name, ub_bytes, chip.vector_cores)
