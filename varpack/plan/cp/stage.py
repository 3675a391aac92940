"""Stage 3b, context-parallel placement (``--cp N``): every micro-batch's samples over its CP group.

Runs after the shapes and before ranks are assigned, because a CP micro-batch's cost depends on
its placement: each sample gets its CP rank or -1 (distributed) by the ``--cp-placement``
strategy (:mod:`varpack.plan.cp.place`), and each micro-batch its time by the CP cost model
(:mod:`varpack.plan.cp.cost`), which the assign stage then balances over the DP ranks.
:func:`cp_figures` gives plan.json's ``cp`` block, which ``validate`` recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.plan.arrays import Batches, Shapes
from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import CPLoad, CPModel, cp_load, cp_model
from varpack.plan.cp.place import place


@dataclass
class CPPlan:
    """Each stream position's CP placement (int32, -1 = distributed) and the loads it gives."""

    placement: np.ndarray
    load: CPLoad
    model: CPModel


def place_cp(batches: Batches, shaped: Shapes, cfg: PlanConfig) -> CPPlan | None:
    """The CP placement of every micro-batch (None without ``--cp``)."""
    if cfg.cp == 1:
        return None
    model = cp_model(cfg)
    lens = shaped.stream_lens
    placement = place(
        lens, batches.offsets, model.bucket, model.n, cfg.cp_placement, (model.lin, model.quad)
    )
    return CPPlan(placement, cp_load(batches.offsets, lens, placement, model), model)


def estimated_time(step: np.ndarray, rank: np.ndarray, cost: np.ndarray, dp: int) -> float:
    """Sum over steps of the slowest DP rank's summed micro-batch times."""
    num_steps = int(step.max()) + 1 if len(step) else 0
    per = np.bincount(step * dp + rank, weights=cost, minlength=num_steps * dp)
    return float(per.reshape(num_steps, dp).max(axis=1).sum()) if num_steps else 0.0


def cp_figures(
    step: np.ndarray, rank: np.ndarray, samples: int, load: CPLoad, model: CPModel, dp: int
) -> dict[str, Any]:
    """plan.json's ``cp`` block: estimated time, distributed samples (of ``samples`` placed),
    memory and CP balance."""
    compute = load.compute
    mean = compute.mean(axis=1)
    imbalance = np.where(mean > 0, compute.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    return {
        "cp": model.n,
        "bucket_size": model.bucket,
        "estimated_time": estimated_time(step, rank, load.cost, dp),
        "distributed_samples": int(load.distributed.sum()),
        "local_samples": int(samples - load.distributed.sum()),
        "memory_max": float(load.memory.max() / (model.n * model.bucket)) if len(step) else 0.0,
        "memory_mean": float(load.memory.mean() / (model.n * model.bucket)) if len(step) else 0.0,
        "cp_imbalance_mean": float(imbalance.mean()) if len(step) else 1.0,
        "cp_imbalance_max": float(imbalance.max()) if len(step) else 1.0,
    }
