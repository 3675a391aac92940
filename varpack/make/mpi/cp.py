"""``--cp`` under MPI: GDS steps, CP placement and the ``cp`` figures on each rank's own steps.

Context parallelism adds nothing that spans steps: global data scheduling re-forms each step's
micro-batches across the data-parallel ranks (:mod:`varpack.plan.stages.batching.gds`), the
placement and its cost are per micro-batch (:mod:`varpack.plan.cp.stage`), and the assign stage
balances each step by those costs. So every rank runs them on its whole steps, and plan.json's
``cp`` block is computed on rank 0 from the micro-batches' loads, gathered in the plan's order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.local import RankPlan, epoch_slices
from varpack.make.mpi.moves import Rows
from varpack.plan import PlanConfig
from varpack.plan.cp.cost import CPLoad, cp_model
from varpack.plan.cp.stage import cp_figures
from varpack.plan.stages.batching.gds import regroup_steps

Part = tuple[Rows, np.ndarray, int, int]


def gds_steps(part: Part, cfg: PlanConfig) -> Part:
    """A rank's whole steps of an epoch re-formed by GDS (``--cp-batching gds``)."""
    rows, off, first, total = part
    perm, new_off = regroup_steps(rows["lens"], off, cfg)
    return {k: v[perm] for k, v in rows.items()}, new_off, first, total


def cp_block(comm: Any, p: RankPlan) -> dict[str, Any] | None:
    """plan.json's ``cp`` block (rank 0; None elsewhere and without ``--cp``)."""
    if p.cp_load is None:
        return None
    mine = [
        (p.step[s], p.rank[s], *(f[s] for f in p.cp_load), int(p.micro.samples[s].sum()))
        for s in epoch_slices(p)
    ]
    got = comm.gather(mine, root=0)
    if got is None:
        return None
    order = [part[e] for e in range(len(p.epochs)) for part in got]
    step, rank = (np.concatenate([o[i] for o in order]) for i in (0, 1))
    load = CPLoad(*(np.concatenate([o[2 + i] for o in order]) for i in range(4)))
    samples = sum(o[6] for o in order)
    return cp_figures(step, rank, samples, load, cp_model(p.cfg), p.cfg.dp)
