"""Run the package's real host launchers on CPU tensors and record their kernel launches instead of running them.

CPU plans ARE the NPU plans of the emulated chip (tiling/launch.py): with ``NPU_LIGER_EMULATED_CHIP=<chip>`` the
launcher asks the UB manager with that chip's UB size and caps the grid at its vector cores, exactly as on the
device. Inside ``Recorder``:
- ``JITFunction.run`` (what ``kernel[grid](...)`` calls) records (kernel, args, kwargs, grid) and returns;
- every ``plan_launch`` the npu_ops modules imported is wrapped to record (TileRequest, LaunchPlan), so the check
  knows which constexprs are the UB-tiled block sizes;
- ``require_launchable`` is a no-op (it rejects CPU tensors when Triton is not the interpreter; here nothing runs).
All patches are undone on exit: the package itself is never changed.
"""

from __future__ import annotations

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
    plans: List[Tuple[Any, Any]] = field(default_factory=list)  # (TileRequest, LaunchPlan) asked since the last launch

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
        self._pending: List[Tuple[Any, Any]] = []
        self._undo: List[Tuple[Any, str, Any]] = []
        self._old_env: Optional[str] = None

    def _patch(self, owner, attr, value):
        self._undo.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        import npu_liger.npu_ops._triton as triton_helpers
        import npu_liger.tiling as tiling

        self._old_env = os.environ.get("NPU_LIGER_EMULATED_CHIP")
        os.environ["NPU_LIGER_EMULATED_CHIP"] = self.chip_name
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            recorder.launches.append(Launch(fn_self, args, kwargs, grid, list(recorder._pending)))
            recorder._pending.clear()
            return None

        original_plan = tiling.plan_launch

        def plan_launch(device_type, request):
            plan = original_plan(device_type, request)
            recorder._pending.append((request, plan))
            return plan

        original_require = triton_helpers.require_launchable

        def require_launchable(device):
            return None

        self._patch(JITFunction, "run", run)
        for name, module in list(sys.modules.items()):
            if not name.startswith("npu_liger.") or module is None:
                continue
            if getattr(module, "plan_launch", None) is original_plan:
                self._patch(module, "plan_launch", plan_launch)
            if getattr(module, "require_launchable", None) is original_require:
                self._patch(module, "require_launchable", require_launchable)
        return self

    def __exit__(self, *exc):
        for owner, attr, value in reversed(self._undo):
            setattr(owner, attr, value)
        self._undo.clear()
        if self._old_env is None:
            os.environ.pop("NPU_LIGER_EMULATED_CHIP", None)
        else:
            os.environ["NPU_LIGER_EMULATED_CHIP"] = self._old_env
        return False


def tiled_constexprs(launch: Launch) -> Tuple[dict, list]:
    """The launch's UB-tiled block constexprs and the UB manager's cap for each: matched by value against the tiled
    dims of the last plan asked before the launch. Returns ({name: value}, [(name, cap, unit_param, request)])."""
    if not launch.plans:
        return {}, []
    request, plan = launch.plans[-1]
    from npu_liger.tiling.ub_manager import _default_strategy, _normalize_tiling_dims

    caps = _default_strategy(plan.ub_bytes * 8, request.safety_margin, request.dtype_size, request.memory_multiplier,
                             request.shapes, request.tiling_dims)
    block_names = [p.name for p in launch.fn.params if p.is_constexpr and "BLOCK" in p.name.upper()]
    values = {name: launch.kwargs.get(name) for name in block_names}
    chosen, info = {}, []
    for shape, tiles, tiling_dim, cap in zip(request.shapes, plan.tiles, request.tiling_dims, caps):
        dims = _normalize_tiling_dims(tiling_dim)
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
