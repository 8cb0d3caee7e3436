"""Where tiles and grids come from: the UB manager, the Ascend chip table and the per-backend launch policy.
Knows nothing of any op."""

from .chips import ASCEND_CHIPS, AscendChip, emulated_chip, get_chip
from .launch import LaunchPlan, PlanRecord, TileRequest, memoised_plan, plan_launch, record_plans
from .ub_manager import UBManager, compute_default_tiling_strategy, get_ub_manager, next_power_of_2, reset_ub_manager

__all__ = [
    "ASCEND_CHIPS",
    "AscendChip",
    "LaunchPlan",
    "PlanRecord",
    "TileRequest",
    "UBManager",
    "compute_default_tiling_strategy",
    "emulated_chip",
    "get_chip",
    "get_ub_manager",
    "memoised_plan",
    "next_power_of_2",
    "plan_launch",
    "record_plans",
    "reset_ub_manager",
]
