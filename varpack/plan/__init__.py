"""Pure planning: cost models, packing, steps and ranks, order, LR factors, stats (no I/O).

Entry points: :class:`PlanConfig` (every option) and :func:`make_plan` (sorted ids and lengths
in; plan arrays, plan.json content and per-rank extras out).
"""

from varpack.plan.config import PlanConfig
from varpack.plan.planner import PlanArrays, make_plan, plan_arrays

__all__ = ["PlanArrays", "PlanConfig", "make_plan", "plan_arrays"]
