"""Stages 3, 4 and 6 on one rank's whole steps: shapes, ranks and LR factors.

Once a rank holds whole steps of every epoch, the later stages need nothing else: a micro-batch's
shape is its own, a step's ranks are balanced within the step and rotated by an offset drawn from
the step's global number, and a step's LR factor comes from its own totals. This runs the
planner's own stage functions on the rank's micro-batches, epoch by epoch (their steps are
consecutive there), and returns them as a :class:`~varpack.plan.PlanArrays` whose per-step
columns span the whole plan (zero on the steps other ranks hold).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from varpack.make.mpi.moves import Rows, count
from varpack.plan import PlanArrays, PlanConfig
from varpack.plan.arrays import Batches
from varpack.plan.cp.cost import CPLoad
from varpack.plan.cp.stage import CPPlan, place_cp
from varpack.plan.kernels.micro import Micro
from varpack.plan.lr import lr_factors, step_totals
from varpack.plan.stages.placement import assign
from varpack.plan.stages.shaping import shape


@dataclass
class RankPlan(PlanArrays):
    """One rank's part of the plan: :class:`~varpack.plan.PlanArrays` over its own micro-batches
    (epoch by epoch, ``epoch_micro`` of each) and samples, with the per-step columns of the whole
    plan. ``repeats``: every epoch streams the same rows (``ids``) in order (curriculum); else
    ``ids`` hold every epoch's rows one after the other. ``pos2``: each sample's twice middle
    token position in its epoch's permuted stream (shuffle order), in stream order."""

    epoch_micro: list[int] = field(default_factory=list)
    repeats: bool = True
    pos2: np.ndarray | None = None
    cp_load: CPLoad | None = None  # per micro-batch (--cp)


def local_plan(
    parts: list[tuple[Rows, np.ndarray, int, int]],
    cfg: PlanConfig,
    notes: list[str],
    lengths: np.ndarray | None = None,
    grouped: bool = False,
    alone_ids: list[int] | None = None,
) -> RankPlan:
    """This rank's micro-batches planned: ``parts`` holds each epoch's ``(rows, off, first,
    total)`` (micro-batches ``off`` of ``rows``, global numbers from ``first``, of ``total`` in
    the epoch), or one part that every epoch repeats (curriculum). ``grouped``: each rank's
    ``grad_accum`` micro-batches of a step stay together (composed by cost). ``alone_ids``:
    the samples kept alone, in input order (default: the repeated part's)."""
    per = cfg.micro_per_step
    every = parts * cfg.epochs if len(parts) == 1 else parts
    spe = [total // per for _, _, _, total in every]
    firsts = np.concatenate(([0], np.cumsum(spe)[:-1])).tolist()
    epochs = [{"epoch": e, "first_step": int(firsts[e]), "num_steps": spe[e]} for e in range(cfg.epochs)]  # fmt: skip
    micros, ranks, steps, index, empty = [], [], [], [], []
    cps: list[CPPlan] = []  # the warm-up reorder spans ranks: .warmup
    for e, (rows, off, first, _) in enumerate(every):
        lens, nm = rows["lens"], len(off) - 1
        step = (first + np.arange(nm, dtype=np.int64)) // per + firsts[e]
        stream = np.arange(count(rows), dtype=np.int64)
        batches = Batches(stream, off, step, epochs, stream_lens=lens,
                          group=cfg.grad_accum if grouped else 0)  # fmt: skip
        shaped = shape(batches, lens, cfg, lengths)
        cp = place_cp(batches, shaped, cfg)
        if cp is not None:
            cps.append(cp)
        placed = assign(batches, shaped, cfg, None if cp is None else cp.load.cost)
        micros.append(placed.micro)
        ranks.append(placed.rank)
        steps.append(placed.step)
        index.append(placed.micro_index)
        empty.append(shaped.pad_rows)
    micro = Micro(*(np.concatenate([getattr(m, f) for m in micros]) for f in Micro._fields))
    step = np.concatenate(steps)
    step_samples, step_tokens = step_totals(step, micro.samples, micro.tokens, sum(spe))
    lr = lr_factors(step_samples, step_tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit)
    rows = _rows(parts)
    n = [count(r) for r, _, _, _ in every]
    at = np.concatenate(([0], np.cumsum(n))).astype(np.int64)
    offsets = [o[:-1] + at[e] for e, (_, o, _, _) in enumerate(every)]
    if alone_ids is None:
        alone_ids = [int(i) for i in rows["ids"][rows["alone"]]]
    return RankPlan(
        cfg=cfg,
        ids=rows["ids"],
        lens=rows["lens"],
        stream=np.zeros(0, np.int64),  # position q is row q modulo the rows (in_order)
        offsets=np.concatenate([*offsets, [at[-1]]]),
        micro=micro,
        step=step,
        rank=np.concatenate(ranks),
        micro_index=np.concatenate(index),
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=lr,
        epochs=epochs,
        oversize_alone=alone_ids,
        stream_lens=rows["lens"],  # one epoch's where the epochs repeat it
        lengths=lengths,
        pad_rows=None if empty[0] is None else np.concatenate([e for e in empty if e is not None]),
        sample_offsets=rows.get("offsets"),
        group=rows.get("group"),
        notes=notes,
        epoch_micro=[len(o) - 1 for _, o, _, _ in every],
        repeats=len(parts) == 1,
        pos2=rows.get("pos2"),
        cp_placement=np.concatenate([c.placement for c in cps]) if cps else None,
        cp_load=CPLoad(*(np.concatenate([getattr(c.load, f) for c in cps]) for f in CPLoad._fields))
        if cps
        else None,
    )


def _rows(parts: list[tuple[Rows, np.ndarray, int, int]]) -> Rows:
    """The rows of every part, one after the other (no copy for one part)."""
    if len(parts) == 1:
        return parts[0][0]
    return {k: np.concatenate([r[k] for r, _, _, _ in parts]) for k in parts[0][0]}


def epoch_slices(p: RankPlan) -> list[slice]:
    """The micro-batches of each epoch in this rank's arrays."""
    at = np.concatenate(([0], np.cumsum(p.epoch_micro))).tolist()
    return [slice(a, b) for a, b in zip(at[:-1], at[1:], strict=True)]
