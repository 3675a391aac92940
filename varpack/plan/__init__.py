"""Pure planning: sorted lengths in, a plan as arrays out (no I/O, no Arrow tables).

Owns: the options (:class:`PlanConfig`), the cost models, and the planner's stages (select ->
order + pack -> shapes -> assign -> warm-up -> LR, see :mod:`varpack.plan.planner`), each a
pure function over NumPy arrays with its strategies chosen by name from a registry, plus the
rule functions (budget, shape, pipeline, blocks, warm-up checks) that ``validate`` reuses.
Rooms: :mod:`.stages` (the stages), :mod:`.kernels` (the pure array functions they call),
:mod:`.cp` (context parallelism) and :mod:`.figures` (plan.json's stats and content); the options,
the arrays passed between stages, the cost models and the rules sit at the top, shared by all.
May import: NumPy, numba, and ``varpack.errors`` / ``varpack.fingerprint``. Nothing here
imports pyarrow or another varpack package: turning the arrays into files is
:mod:`varpack.planfile`'s job.

Entry points: :class:`PlanConfig` and :func:`make_plan` (or :func:`plan_arrays`). The kernels'
compiled code is cached by numba under one key of varpack's version and the planner's sources
(:mod:`.numba_cache`, installed here before any kernel is defined).
"""

from varpack.plan import numba_cache

numba_cache.install()

from varpack.plan.arrays import PlanArrays  # noqa: E402  (after the cache key)
from varpack.plan.config import PlanConfig  # noqa: E402
from varpack.plan.planner import make_plan, plan_arrays  # noqa: E402

__all__ = ["PlanArrays", "PlanConfig", "make_plan", "plan_arrays"]
