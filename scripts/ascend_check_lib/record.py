"""Run the package's real host launchers on CPU tensors and record their kernel launches instead of running them.

CPU plans ARE the NPU plans of the emulated chip (tiling/launch.py): with ``NPU_LIGER_EMULATED_CHIP=<chip>`` the
launcher asks the UB manager with that chip's UB size and caps the grid at its vector cores, exactly as on the
device. Inside ``Recorder``:
- ``JITFunction.run`` (what ``kernel[grid](...)`` calls) records (kernel, args, kwargs, grid) and returns;
- ``npu_liger.tiling.record_plans()`` collects every launch plan, so the check knows which constexprs are the
  UB-tiled block sizes (the plans asked since the previous launch belong to the next one);
- ``require_launchable`` is a no-op (it rejects CPU tensors when Triton is not the interpreter; here nothing runs).
All patches are undone on exit: the package itself is never changed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple


@dataclass
class Launch:
    fn: Any
    args: tuple
    kwargs: dict
    grid: Any
    plans: List[Any] = field(default_factory=list)  # the tiling.PlanRecords made since the previous launch

    @property
    def name(self) -> str:
        return self.fn.__name__

    def grid_size(self) -> Optional[int]:
        grid = self.grid
        if callable(grid):
            return None
        size = 1
        for g in tuple(grid):
            size *= int(g)
        return size


class Recorder:
    def __init__(self, chip_name: str):
        self.chip_name = chip_name
        self.launches: List[Launch] = []
        self._plans: List[Any] = []  # the list record_plans() fills
        self._planned = 0  # how many of self._plans earlier launches took
        self._stack = contextlib.ExitStack()

    def _patch(self, owner, attr, value):
        original = getattr(owner, attr)
        setattr(owner, attr, value)
        self._stack.callback(setattr, owner, attr, original)

    def _set_env(self, name, value):
        original = os.environ.get(name)
        os.environ[name] = value
        self._stack.callback(lambda: os.environ.__setitem__(name, original) if original is not None
                             else os.environ.pop(name, None))

    def _record_launch(self, fn, args, grid, kwargs):
        self.launches.append(Launch(fn, args, kwargs, grid, self._plans[self._planned:]))
        self._planned = len(self._plans)

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        import npu_liger.npu_ops._triton as triton_helpers
        from npu_liger.tiling import record_plans

        self._set_env("NPU_LIGER_EMULATED_CHIP", self.chip_name)
        self._plans = self._stack.enter_context(record_plans())
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            recorder._record_launch(fn_self, args, grid, kwargs)
            return None

        self._patch(JITFunction, "run", run)
        # Every npu_ops module imported require_launchable by name: replace each reference for the block.
        original_require = triton_helpers.require_launchable
        for name, module in list(sys.modules.items()):
            if name.startswith("npu_liger.") and getattr(module, "require_launchable", None) is original_require:
                self._patch(module, "require_launchable", lambda device: None)
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


def _tiled_dims(tiling_dim) -> set:
    return {tiling_dim} if isinstance(tiling_dim, int) else set(tiling_dim)


def ub_manager_caps(record) -> Tuple[int, ...]:
    """Per shape of the plan's request, the block the UB manager allows when the tiled dims are unbounded (the
    shape no longer limits it): the request's own cap, asked through the public tiling API."""
    from npu_liger.tiling import UBManager, compute_default_tiling_strategy

    request, plan = record.request, record.plan
    unbounded = tuple(tuple(2**62 if i in _tiled_dims(dims) else size for i, size in enumerate(shape))
                      for shape, dims in zip(request.shapes, request.tiling_dims, strict=True))
    tiles = compute_default_tiling_strategy(
        request.safety_margin, request.dtype_size, request.memory_multiplier, unbounded, request.tiling_dims,
        ub_manager=UBManager(ub_capacity_bits=plan.ub_bytes * 8, npu_model=plan.chip))
    return tuple(shape_tiles[min(_tiled_dims(dims))]
                 for shape_tiles, dims in zip(tiles, request.tiling_dims, strict=True))


def tiled_constexprs(launch: Launch) -> Tuple[dict, list]:
    """The launch's UB-tiled block constexprs and the UB manager's cap for each: matched by value against the tiled
    dims of the last plan asked before the launch. Returns ({name: value}, [(name, cap, unit_param, request)])."""
    if not launch.plans:
        return {}, []
    record = launch.plans[-1]
    request, plan = record.request, record.plan
    caps = ub_manager_caps(record)
    block_names = [p.name for p in launch.fn.params if p.is_constexpr and "BLOCK" in p.name.upper()]
    values = {name: launch.kwargs.get(name) for name in block_names}
    chosen, info = {}, []
    for tiles, tiling_dim, cap in zip(plan.tiles, request.tiling_dims, caps, strict=True):
        dims = _tiled_dims(tiling_dim)
        unit = 1
        for index, size in enumerate(tiles):
            if index not in dims:
                unit *= max(1, size)
        for index in sorted(dims):
            for name, value in values.items():
                if name not in chosen and isinstance(value, int) and value == tiles[index]:
                    chosen[name] = value
                    info.append((name, cap, unit, request))
                    break
    return chosen, info
