"""Per-backend launch policy: block sizes and grid for a kernel's memory analysis and problem size.

A kernel describes itself with a ``TileRequest`` (its memory multiplier, the shapes it tiles and which dims
may be tiled, the element size). ``plan_launch(device, request)`` turns that into a ``LaunchPlan``:

==========  ======================================================  ================================
backend     tiles                                                   grid (``plan.grid(num_tasks)``)
==========  ======================================================  ================================
``npu``     UB manager of the attached chip (``get_ub_manager()``)  min(tasks, vector cores, 65535)
``cpu``     UB manager of the emulated chip (``chips.py``)          min(tasks, emulated vector cores)
``cuda``    the same formula against a per-program tile budget      one program per task, or
            (warps by tile size, or the request's ``cuda_num_warps``;   ``cuda_programs_per_sm`` x SMs
            ``cuda_max_block`` lifts the budget for whole rows)        when the request asks for it
==========  ======================================================  ================================

Plans are computed at dispatch time (never while tracing) and memoised, so a launch costs a dict lookup.
``record_plans()`` observes them: every plan made inside the ``with`` block is appended to the list it yields.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

from .chips import emulated_chip
from .ub_manager import (TilingDim, UBManager, _normalize_tiling_dims, compute_default_tiling_strategy, get_ub_manager,
                         next_power_of_2)

NPU_MAX_GRID = 65535  # triton-ascend rejects larger 1-D grids
CUDA_MAX_GRID = 2**31 - 1
# Bytes of live tile data one CUDA program may hold (the GPU analogue of the UB): large enough for
# 16-byte vector accesses on every thread of 4-16 warps, small enough to stay in registers.
CUDA_TILE_BUDGET_BYTES = 64 * 1024


@dataclass(frozen=True)
class TileRequest:
    """A kernel's memory analysis, in the UB manager's terms (see ``ub_manager.py``).

    ``cuda_num_warps``: warps per program on CUDA, when the kernel has measured a better value than the default
    rule (by tile size, ``_plan_cuda``).
    ``cuda_max_block``: on CUDA, tiled sizes up to this many elements regardless of the tile budget (a kernel
    that keeps a whole row in registers, e.g. a norm over hidden 8192, rather than loop over it twice).
    ``cuda_programs_per_sm``: on CUDA, a persistent grid of this many programs per SM instead of one program per
    task (kernels that keep one partial result per program, e.g. a norm's weight gradient).
    All three are ignored by the NPU and CPU plans."""

    memory_multiplier: float
    shapes: Tuple[Tuple[int, ...], ...]
    tiling_dims: Tuple[TilingDim, ...]
    dtype_size: int
    safety_margin: float = 0.80
    cuda_num_warps: Optional[int] = None
    cuda_max_block: Optional[int] = None
    cuda_programs_per_sm: Optional[int] = None


@dataclass(frozen=True)
class LaunchPlan:
    backend: str  # "npu", "cuda" or "cpu" (emulated NPU)
    tiles: Tuple[Tuple[int, ...], ...]  # same structure as TileRequest.shapes
    max_programs: Optional[int]  # persistent-grid cap; None = one program per task
    num_warps: Optional[int]  # CUDA only
    chip: Optional[str] = None
    ub_bytes: Optional[int] = None

    @property
    def block(self) -> int:
        """The first tiled size of the first shape: the BLOCK of a single-shape kernel."""
        return self.tiles[0][0]

    def grid(self, num_tasks: int) -> int:
        """Programs to launch for ``num_tasks`` independent tiles; kernels stride over the rest."""
        cap = self.max_programs if self.max_programs is not None else CUDA_MAX_GRID
        return max(1, min(int(num_tasks), cap))

    def launch_options(self) -> dict:
        """Extra keyword arguments for ``kernel[grid](...)`` on this backend."""
        return {"num_warps": self.num_warps} if self.num_warps is not None else {}


def backend_of(device_type: str) -> str:
    if device_type == "cuda":
        return "cuda"
    if device_type == "cpu":
        return "cpu"
    return "npu"  # the PrivateUse1 backend torch_npu registers


@dataclass(frozen=True)
class PlanRecord:
    """One ``plan_launch`` call seen by ``record_plans()``: who asked (``caller``: the launcher's module and
    function, e.g. ``"npu_liger.npu_ops.tvd.tvd_forward"``), what it asked for and what it got."""

    device_type: str
    request: TileRequest
    plan: LaunchPlan
    caller: str = "?"


_recorders: List[List[PlanRecord]] = []  # the lists of the active record_plans() blocks


@contextlib.contextmanager
def record_plans() -> Iterator[List[PlanRecord]]:
    """Collect every launch plan made inside the block (eager or compiled code alike), in launch order::

        with npu_liger.tiling.record_plans() as plans:
            model(x)
        for record in plans: print(record.caller, record.request.shapes, "->", record.plan.tiles)
    """
    records: List[PlanRecord] = []
    _recorders.append(records)
    try:
        yield records
    finally:
        _recorders.remove(records)


def launch_target(device_type: str):
    """What a plan depends on beyond its request: the emulated chip on CPU (read from the environment on every
    call, so tests may change it), the attached chip's UB manager on an NPU; nothing on CUDA (its SM count is
    fixed per process)."""
    backend = backend_of(device_type)
    if backend == "cpu":
        return emulated_chip()
    if backend == "npu":
        manager = get_ub_manager()
        return manager.npu_model, manager.ub_capacity_bits
    return None


def memoised_plan(plan_fn):
    """A kernel's plan function ``plan_fn(device_type, ...)``, memoised on its arguments and ``launch_target``: a
    repeated call skips building TileRequests and looking them up, a few µs of host time per kernel launch (on
    the CPU path, launches faked, rms_norm's forward+backward: ~20% of the package's own Python per call).
    While ``record_plans()`` records, the plan function runs every time, so every plan is seen (the Ascend
    check relies on that)."""

    @functools.lru_cache(maxsize=1024)
    def memo(device_type: str, target, *args, **kwargs):
        return plan_fn(device_type, *args, **kwargs)

    @functools.wraps(plan_fn)
    def plan(device_type: str, *args, **kwargs):
        if _recorders:
            return plan_fn(device_type, *args, **kwargs)
        return memo(device_type, launch_target(device_type), *args, **kwargs)

    plan.cache_clear = memo.cache_clear  # for tests that change what a CUDA plan depends on (the SM count)
    _PLAN_WRAPPERS.add(plan.__code__)
    return plan


_PLAN_WRAPPERS = set()  # the code of memoised_plan's wrapper: record_plans() names the launcher above it


def plan_launch(device_type: str, request: TileRequest) -> LaunchPlan:
    backend = backend_of(device_type)
    if backend == "cuda":
        plan = _plan_cuda(request)
    elif backend == "cpu":
        chip = emulated_chip()
        plan = _plan_ascend(request, "cpu", chip.name, chip.ub_bits, chip.vector_cores)
    else:
        manager = get_ub_manager()
        plan = _plan_ascend(request, "npu", manager.npu_model, manager.ub_capacity_bits, npu_vector_core_count())
    if _recorders:  # the only cost when nobody records
        frame = sys._getframe(1)
        if frame.f_back is not None and frame.f_back.f_code in _PLAN_WRAPPERS:  # a memoised plan function's
            frame = frame.f_back.f_back or frame                                 # caller: the launcher
        caller = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"
        for records in _recorders:
            records.append(PlanRecord(device_type, request, plan, caller))
    return plan


@functools.lru_cache(maxsize=4096)
def _plan_ascend(request: TileRequest, backend: str, chip: str, ub_bits: int, vector_cores: int) -> LaunchPlan:
    tiles = _tiles(request, UBManager(ub_capacity_bits=ub_bits, npu_model=chip))
    return LaunchPlan(backend, tiles, min(vector_cores, NPU_MAX_GRID), None, chip, ub_bits // 8)


@functools.lru_cache(maxsize=4096)
def _plan_cuda(request: TileRequest) -> LaunchPlan:
    manager = UBManager(ub_capacity_bits=CUDA_TILE_BUDGET_BYTES * 8, npu_model="cuda")
    tiles = _tiles(request, manager)
    if request.cuda_max_block is not None:
        tiles = tuple(_lift_tiled_dims(tiled, shape, dims, request.cuda_max_block)
                      for tiled, shape, dims in zip(tiles, request.shapes, request.tiling_dims))
    elements = 1
    for size in tiles[0]:
        elements *= size
    num_warps = 4 if elements <= 2048 else 8 if elements <= 8192 else 16
    if request.cuda_num_warps is not None:
        num_warps = request.cuda_num_warps
    max_programs = None
    if request.cuda_programs_per_sm is not None:
        max_programs = request.cuda_programs_per_sm * cuda_sm_count()
    return LaunchPlan("cuda", tiles, max_programs, num_warps)


def _lift_tiled_dims(tiled: Tuple[int, ...], shape: Tuple[int, ...], tiling_dim: TilingDim,
                     max_block: int) -> Tuple[int, ...]:
    """Tiled dims of one shape grown to ``min(next_pow2(size), max_block)`` (never shrunk)."""
    dims = _normalize_tiling_dims(tiling_dim)
    return tuple(max(tile, min(next_power_of_2(size), max_block)) if d in dims else tile
                 for d, (tile, size) in enumerate(zip(tiled, shape)))


def _tiles(request: TileRequest, manager: UBManager) -> Tuple[Tuple[int, ...], ...]:
    tiles = compute_default_tiling_strategy(
        safety_margin=request.safety_margin,
        dtype_size=request.dtype_size,
        memory_multiplier=request.memory_multiplier,
        shapes=request.shapes,
        tiling_dims=request.tiling_dims,
        ub_manager=manager,
    )
    if tiles is None:
        raise ValueError(f"invalid tile request {request!r}: shapes and tiling_dims must be non-empty and match")
    return tiles


@functools.lru_cache(maxsize=None)
def cuda_sm_count() -> int:
    """Streaming multiprocessors of the current CUDA device (first use only, then cached)."""
    import torch

    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)


@functools.lru_cache(maxsize=None)
def npu_vector_core_count(device_index: int = 0) -> int:
    """Vector cores of the attached NPU, from the triton-ascend driver (first launch only, then cached)."""
    import triton

    properties = triton.runtime.driver.active.utils.get_device_properties(device_index)
    return int(properties["num_vectorcore"])
