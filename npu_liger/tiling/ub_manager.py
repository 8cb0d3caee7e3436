"""The Ascend Unified-Buffer (UB) manager, as specified in ``docs/UB_MANAGER.md``.

Every Ascend vector core computes out of a small on-chip Unified Buffer (192 KiB on the 910B family).
A Triton kernel whose tiles do not fit fails to compile with "ub overflow". This module answers one
question for every kernel: *how large may the tiled dimension of each block be?*

    memory = memory_multiplier * BLOCK_SIZE * unit_param * dtype_size * 8   bits  <=  UB bits * safety_margin

where ``unit_param`` is the product of the dimensions that are not tiled. Kernels state their multiplier in a
memory-analysis comment beside the call (see ``npu_liger/npu_ops/geglu.py``).

Detection order (normative): ``ASCEND_UB_CAPACITY_BITS`` (bits) -> CANN ``get_soc_spec("UB_SIZE")`` (bytes)
-> ``RuntimeError`` with instructions. The CPU emulation never changes detection: it builds its own
``UBManager(ub_capacity_bits=...)`` and passes it in through ``ub_manager=``.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple, Union

UB_CAPACITY_ENV = "ASCEND_UB_CAPACITY_BITS"
# Largest accepted override: 1 MiB, four times the largest UB of any Ascend chip (Ascend950, 248 KiB). A larger
# value is a typo (bytes or a unit mix-up) that would make every tile overflow the real UB.
MAX_UB_CAPACITY_BITS = 8 * 1024 * 1024

TilingDim = Union[int, Tuple[int, ...]]


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (0 for n <= 0); the same values as ``triton.next_power_of_2`` for n >= 0.

    Kept here so that tiling never imports Triton (whose ``triton`` module differs per flavour).
    """
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


class UBManager:
    """UB capacity of the current device (or of an explicitly given chip).

    ``ub_capacity_bits`` / ``npu_model`` given explicitly skip detection; that is how the CPU emulation and
    the Ascend compile check describe a chip that is not attached.
    """

    def __init__(self, ub_capacity_bits: Optional[int] = None, npu_model: Optional[str] = None):
        if ub_capacity_bits is not None and (not isinstance(ub_capacity_bits, int) or ub_capacity_bits <= 0):
            raise ValueError(f"ub_capacity_bits must be a positive int, got {ub_capacity_bits!r}")
        self._npu_model = npu_model if npu_model is not None else self._detect_npu_model()
        self._ub_capacity_bits = ub_capacity_bits if ub_capacity_bits is not None else self._detect_ub_capacity()

    @property
    def ub_capacity_bits(self) -> int:
        return self._ub_capacity_bits

    @property
    def ub_capacity_bytes(self) -> int:
        return self._ub_capacity_bits // 8

    @property
    def npu_model(self) -> str:
        return self._npu_model

    def __repr__(self) -> str:
        return f"UBManager(npu_model={self._npu_model!r}, ub_capacity_bits={self._ub_capacity_bits})"

    @staticmethod
    def _detect_npu_model() -> str:
        """SoC name from torch_npu when it is loaded; "unknown" otherwise (never imports torch_npu)."""
        import sys

        if "torch_npu" not in sys.modules:
            return "unknown"
        try:
            import torch

            return str(torch.npu.get_device_name(torch.npu.current_device()))
        except Exception:  # no device, no driver: the model name is informative only
            return "unknown"

    def _detect_ub_capacity(self) -> int:
        raw = os.environ.get(UB_CAPACITY_ENV)
        if raw is not None:
            try:
                bits = int(raw)
            except ValueError:
                bits = 0
            if not 0 < bits <= MAX_UB_CAPACITY_BITS:
                # A misconfigured override must not silently fall through to another source.
                raise ValueError(f"{UB_CAPACITY_ENV} must be a positive integer number of bits, at most "
                                 f"{MAX_UB_CAPACITY_BITS} (1 MiB; real chips have 192-248 KiB), got {raw!r}")
            return bits

        ub_bytes = _ub_bytes_from_cann(self._npu_model)
        if ub_bytes is not None:
            return ub_bytes * 8

        raise RuntimeError(
            "Cannot determine the Ascend UB capacity. Either set "
            f"{UB_CAPACITY_ENV} to the UB size in bits (e.g. {UB_CAPACITY_ENV}=1572864 for a 192 KiB UB), "
            "or source the CANN environment (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`) so "
            "that get_soc_spec('UB_SIZE') is available."
        )


def _ub_bytes_from_cann(npu_model: str) -> Optional[int]:
    """UB size in bytes from CANN's ``get_soc_spec("UB_SIZE")``, or None when CANN is not available."""
    try:
        from tbe.common.platform import get_soc_spec, set_current_compile_soc_info  # lazy: CANN only
    except Exception:
        return None
    try:
        if npu_model and npu_model != "unknown":
            set_current_compile_soc_info(npu_model)
        ub_bytes = int(get_soc_spec("UB_SIZE"))
    except Exception:
        return None
    return ub_bytes if ub_bytes > 0 else None


_ub_manager: Optional[UBManager] = None


def get_ub_manager() -> UBManager:
    """The process-wide UB manager of the attached NPU, created on first use."""
    global _ub_manager
    if _ub_manager is None:
        _ub_manager = UBManager()
    return _ub_manager


def reset_ub_manager() -> None:
    """Forget the singleton so the next ``get_ub_manager()`` detects again (tests, changed environment)."""
    global _ub_manager
    _ub_manager = None


def _normalize_tiling_dims(tiling_dim: TilingDim) -> set:
    """An int or a tuple of ints -> the set of tiled dimension indices (anything else -> empty set)."""
    if isinstance(tiling_dim, bool):
        return set()
    if isinstance(tiling_dim, int):
        return {tiling_dim}
    if isinstance(tiling_dim, tuple):
        return set(tiling_dim)
    return set()


def _validated_tiling_dims(shape: Tuple[int, ...], tiling_dim: TilingDim) -> set:
    dims = _normalize_tiling_dims(tiling_dim)
    if not dims:
        raise ValueError(f"Invalid tiling_dim: {tiling_dim!r}; expected an int or a non-empty tuple of ints.")
    if any(not isinstance(d, int) or d < 0 or d >= len(shape) for d in dims):
        raise ValueError(
            f"Invalid tiling_dim: {tiling_dim!r} for shape {tuple(shape)}; "
            f"every dimension index must be in range [0, {len(shape)})."
        )
    return dims


def _default_strategy(
    ub_capacity_bits: int,
    safety_margin: float,
    dtype_size: int,
    memory_multiplier: float,
    shapes: Tuple[Tuple[int, ...], ...],
    tiling_dims: Tuple[TilingDim, ...],
) -> Tuple[int, ...]:
    """Largest power-of-two block (>= 1) per shape such that the kernel's tiles fit the safe UB share."""
    if not shapes or not tiling_dims:
        return ()
    safe_bits = int(ub_capacity_bits * safety_margin)
    max_safe_sizes = []
    for shape, tiling_dim in zip(shapes, tiling_dims, strict=True):
        dims = _validated_tiling_dims(shape, tiling_dim)
        unit_param = 1.0
        for index, size in enumerate(shape):
            if index not in dims:
                if size <= 0:  # degenerate fixed dimension: fall back to the conservative unit
                    unit_param = 1.0
                    break
                unit_param *= float(size)
        max_block = int(safe_bits // (memory_multiplier * unit_param * dtype_size * 8))
        max_block = max(1, max_block)
        max_safe_sizes.append(next_power_of_2(max_block + 1) // 2)  # largest power of two <= max_block
    return tuple(max_safe_sizes)


def compute_default_tiling_strategy(
    safety_margin: float = 0.80,
    dtype_size: Optional[int] = None,
    memory_multiplier: Optional[float] = None,
    shapes: Optional[Tuple[Tuple[int, ...], ...]] = None,
    tiling_dims: Optional[Tuple[TilingDim, ...]] = None,
    *,
    ub_manager: Optional[UBManager] = None,
) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """Tiled shapes with the structure of ``shapes``: tiled dims -> ``min(next_pow2(dim), max_safe)``,
    the other dims padded to the next power of two. ``None`` when shapes/tiling_dims are empty or their
    lengths differ. ``ub_manager`` (an npu-liger extension of the specification) describes a chip other than the
    attached one.
    """
    manager = ub_manager if ub_manager is not None else get_ub_manager()
    if not shapes or not tiling_dims or len(shapes) != len(tiling_dims):
        return None
    if dtype_size is None or dtype_size <= 0:
        dtype_size = 4
    if memory_multiplier is None or memory_multiplier <= 0:
        memory_multiplier = 10.0

    max_supported = _default_strategy(
        manager.ub_capacity_bits, safety_margin, dtype_size, memory_multiplier, shapes, tiling_dims
    )
    if len(max_supported) != len(shapes):
        return None

    result = []
    for shape, tiling_dim, max_safe in zip(shapes, tiling_dims, max_supported, strict=True):
        dims = _validated_tiling_dims(shape, tiling_dim)
        tiled = tuple(
            max(1, min(next_power_of_2(size), max_safe)) if index in dims else next_power_of_2(size)
            for index, size in enumerate(shape)
        )
        result.append(tiled)
    return tuple(result)
