"""Stage 4, assign: each step's micro-batches to data-parallel ranks, balanced by cost.

Every step's ``dp x grad_accum`` micro-batches go to the ranks, ``grad_accum`` each, minimising
the slowest rank (:func:`varpack.plan.kernels.assign.balance_ranks`), then each step's ranks are
rotated by an offset drawn from ``(seed, step)`` (:func:`~varpack.plan.kernels.assign.step_offsets`):
balancing hands a step's costliest share to the lowest rank on ties, and without the rotation one
rank would be the slowest step after step. With ``--sync micro`` ranks meet at every micro-batch:
each step's micro-batches are sorted by cost and cut into ``grad_accum`` slots of ``dp``
(:func:`~varpack.plan.kernels.assign.balance_slots`), one per rank, rotated by slot. Pipeline
groups (``--pp``, padded) move whole, one group per rank and step; with ``--pp`` in the packed
layout every micro-batch of a (step, rank) takes the largest shape among them (one shape per
pipeline step).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches, Placement, Shapes
from varpack.plan.config import PlanConfig
from varpack.plan.kernels import assign as algo
from varpack.plan.kernels.micro import summarize
from varpack.plan.segments import group_max
from varpack.plan.sync import slotted


def assign(
    batches: Batches, shaped: Shapes, cfg: PlanConfig, cost: np.ndarray | None = None
) -> Placement:
    """Rank and position of every micro-batch in its step (by ``cost`` if given: ``--cp``)."""
    micro = shaped.micro
    cost = micro.cost if cost is None else cost
    if slotted(
        cfg.sync, cfg.grad_accum
    ):  # ranks meet at every micro-batch: each slot balanced across them
        index, lane = algo.balance_slots(batches.step, cost, cfg.dp, cfg.grad_accum)
        slot = batches.step * cfg.grad_accum + index
        offsets = algo.step_offsets(int(slot.max()) + 1 if len(slot) else 0, cfg.dp, cfg.seed)
        return Placement((lane + offsets[slot]) % cfg.dp, batches.step, index, micro)
    if not batches.group:
        rank, index = algo.balance_ranks(batches.step, cost, cfg.dp, cfg.grad_accum)
    else:
        k = batches.group
        gcost = cost.reshape(-1, k).sum(axis=1)
        grank, _ = algo.balance_ranks(batches.step[::k], gcost, cfg.dp, 1)
        rank, index = np.repeat(grank, k), np.tile(np.arange(k, dtype=np.int64), len(gcost))
    if len(rank) and cfg.dp > 1:  # each step's ranks rotated: no rank is favoured step after step
        rank = (
            rank + algo.step_offsets(int(batches.step.max()) + 1, cfg.dp, cfg.seed)[batches.step]
        ) % cfg.dp
    if cfg.pp > 1 and cfg.layout == "packed":  # one shape per (step, rank): its largest pad_to
        top = group_max(batches.step, rank, micro.pad_to, cfg.dp)
        micro = summarize(batches.offsets, shaped.stream_lens, cfg.micro_rule(), pad_to=top)
    return Placement(rank, batches.step, index, micro)
