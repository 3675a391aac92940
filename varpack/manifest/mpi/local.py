"""Stages 3, 4 and 6 on one rank's whole steps: shapes, ranks and LR factors.

Once a rank holds whole steps of every epoch, the later stages need nothing else: a micro-batch's
shape is its own, a step's ranks are balanced within the step and rotated by an offset drawn from
the step's global number, and a step's LR factor comes from its own totals. This runs the
planner's own stage functions on the rank's micro-batches, epoch by epoch (their steps are
consecutive there), and returns them as a :class:`~varpack.plan.PlanArrays` whose per-step
columns span the whole plan (zero on the steps other ranks hold).
"""

from __future__ import annotations

import numpy as np

from varpack.manifest.mpi.moves import Rows, count
from varpack.plan import PlanArrays, PlanConfig
from varpack.plan.arrays import Batches
from varpack.plan.kernels.micro import Micro
from varpack.plan.lr import lr_factors, step_totals
from varpack.plan.stages.placement import assign
from varpack.plan.stages.shaping import shape


def local_plan(
    rows: Rows,
    off: np.ndarray,
    first: int,
    total: int,
    cfg: PlanConfig,
    notes: list[str],
    lengths: np.ndarray | None = None,
) -> PlanArrays:
    """This rank's micro-batches ``off`` of ``rows`` (global numbers from ``first``, of ``total``
    in an epoch) planned over every epoch. Every epoch streams the rows in order: the plan's
    ``stream`` is left empty and ``stream_lens`` holds one epoch's lengths."""
    per = cfg.micro_per_step
    spe = total // per
    n, nm, lens = count(rows), len(off) - 1, rows["lens"]
    epochs = [{"epoch": e, "first_step": e * spe, "num_steps": spe} for e in range(cfg.epochs)]
    micros, ranks, steps, index, empty = [], [], [], [], []
    stream = np.arange(n, dtype=np.int64)  # every epoch streams the rows in their order
    for e in range(cfg.epochs):
        step = (first + np.arange(nm, dtype=np.int64)) // per + e * spe
        batches = Batches(stream, off, step, epochs, stream_lens=lens)
        shaped = shape(batches, lens, cfg, lengths)
        placed = assign(batches, shaped, cfg)  # the warm-up reorder spans ranks: .warmup
        micros.append(placed.micro)
        ranks.append(placed.rank)
        steps.append(placed.step)
        index.append(placed.micro_index)
        empty.append(shaped.pad_rows)
    micro = Micro(*(np.concatenate([getattr(m, f) for m in micros]) for f in Micro._fields))
    step = np.concatenate(steps)
    num_steps = spe * cfg.epochs
    step_samples, step_tokens = step_totals(step, micro.samples, micro.tokens, num_steps)
    lr = lr_factors(step_samples, step_tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit)
    return PlanArrays(
        cfg=cfg,
        ids=rows["ids"],
        lens=lens,
        stream=np.zeros(0, np.int64),  # every epoch streams the rows in order (in_order)
        offsets=np.concatenate([off[:-1] + e * n for e in range(cfg.epochs)] + [[n * cfg.epochs]]),
        micro=micro,
        step=step,
        rank=np.concatenate(ranks),
        micro_index=np.concatenate(index),
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=lr,
        epochs=epochs,
        oversize_alone=[int(i) for i in rows["ids"][rows["alone"]]],
        stream_lens=lens,  # one epoch's: the epochs repeat it
        lengths=lengths,
        pad_rows=None if empty[0] is None else np.concatenate([e for e in empty if e is not None]),
        sample_offsets=rows.get("offsets"),
        group=rows.get("group"),
        notes=notes,
    )


def epoch_slices(p: PlanArrays) -> list[slice]:
    """The micro-batches of each epoch in this rank's arrays (each epoch holds as many)."""
    nm = len(p.step) // len(p.epochs)
    return [slice(e * nm, (e + 1) * nm) for e in range(len(p.epochs))]
