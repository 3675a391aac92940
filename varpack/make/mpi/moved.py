"""A shuffled plan's ``moved_*`` figures under MPI, to the one process's last bit.

How far each sample trains from its random position (:class:`~varpack.plan.kernels.order.
MovedTally`): the mean sums a float per sample, and a float sum depends on its order. So each is
summed here in the one process's order:

* composed by cost, the planner tallies while it composes, one running sum over the epoch's
  micro-batches: here the running sum is relayed from rank to rank (:func:`moved_tally`);
* otherwise plan.json recomputes them from the plan (:func:`varpack.plan.kernels.order.moved`),
  summing pieces of :data:`~varpack.plan.kernels.order.MOVED_PIECE` samples of each epoch: here each
  piece is summed where it lies whole, or where its first sample lies (:func:`moved_recomputed`).

The maximum and the whole-step counts add up in any order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from varpack.make.mpi.figures import Ranks
from varpack.make.mpi.local import RankPlan, epoch_slices
from varpack.make.mpi.moves import Rows, relayed
from varpack.plan.figures.plan_json import sample_steps
from varpack.plan.kernels.order import MOVED_PIECE, MovedTally

Tally = tuple[float, float, np.ndarray]  # (total, top, whole-step counts) of one epoch


@njit(cache=True)
def _run_moved(pos2, starts, first, per_step, steps, run, total):  # type: ignore[no-untyped-def]
    """:func:`varpack.plan.kernels.order._epoch_moved` over a run of the epoch's micro-batches
    (global numbers from ``first``; ``pos2`` in stream order), its sum continued from ``total``."""
    per = steps / (2.0 * run)
    whole = np.zeros(steps + 2, dtype=np.int64)
    top = 0.0
    for j in range(len(starts) - 1):
        step = (first + j) // per_step
        for q in range(starts[j], starts[j + 1]):
            d = abs(step - pos2[q] * per)
            total += d
            top = max(top, d)
            whole[np.int64(d)] += 1
    return total, top, whole


def moved_tally(comm: Any, epoch: tuple[Rows, np.ndarray, int, int], per_step: int) -> Tally | None:
    """One epoch's tally, as composing by cost keeps it (rank 0 gets it; None elsewhere)."""
    rows, off, first, total_micro = epoch
    run = comm.allreduce(int(rows["lens"].sum()))
    steps = total_micro // per_step

    def work(before: float) -> tuple[tuple[float, float, np.ndarray], float]:
        got = _run_moved(rows["pos2"], off, np.int64(first), np.int64(per_step),
                         np.int64(steps), np.int64(run), before)  # fmt: skip
        return got, got[0]

    total, top, whole = relayed(comm, work, 0.0)
    total = comm.bcast(total, root=comm.Get_size() - 1)  # the relay's end holds the epoch's sum
    return _merged(comm, total, top, whole)


def _merged(comm: Any, total: float, top: float, whole: np.ndarray) -> Tally | None:
    """The epoch's total with every rank's maximum and whole-step counts, on rank 0."""
    parts = comm.gather((top, whole), root=0)
    if parts is None:
        return None
    size = max(len(w) for _, w in parts)
    counts = np.zeros(size, dtype=np.int64)
    for _, w in parts:
        counts[: len(w)] += w
    return total, max(t for t, _ in parts), counts


def tally_figures(tallies: list[Tally], window: int) -> dict[str, float]:
    """plan.json's figures from each epoch's tally, summed in epoch order (as one process)."""
    tally = MovedTally()
    for total, top, whole in tallies:
        tally.merge(total, top, whole)
    return tally.figures(window)


def moved_recomputed(
    comm: Any,
    pos2: np.ndarray,
    sample_step: np.ndarray,
    epochs: list[dict[str, int]],
    epoch_samples: list[int],
    total_tokens: int,
    window: int,
) -> dict[str, float] | None:
    """:func:`varpack.plan.kernels.order.moved` over every rank's samples (rank 0 gets it):
    ``pos2`` and ``sample_step`` of this rank's samples in stream order, epoch by epoch
    (``epoch_samples`` of each); ``total_tokens``: the selected samples' tokens."""
    ranks, tally = Ranks(comm), MovedTally()
    span = 2 * total_tokens
    at = 0
    top, hist = 0.0, np.zeros(1, dtype=np.int64)
    for e, size in zip(epochs, epoch_samples, strict=True):
        d = np.abs(
            sample_step[at : at + size]
            - (e["first_step"] + pos2[at : at + size] * (e["num_steps"] / span))
        )
        at += size
        sums = ranks.chunked(d, MOVED_PIECE, lambda x: float(x.sum()))
        if len(d):
            top = max(top, float(d.max()))
            whole = np.bincount(d.astype(np.int64))
            hist = _add(hist, whole)
        for s in sums or []:
            tally.merge(s, 0.0, np.zeros(0, np.int64))
    parts = comm.gather((top, hist), root=0)
    if parts is None:
        return None
    for t, h in parts:
        tally.merge(0.0, t, h)
    return tally.figures(window)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if len(b) > len(a):
        a, b = b, a
    out = a.copy()
    out[: len(b)] += b
    return out


def moved_figures(
    comm: Any, p: RankPlan, tallies: list[Tally] | None, total_tokens: int
) -> dict[str, float] | None:
    """plan.json's ``moved_*`` figures of a shuffled plan (rank 0; None elsewhere and where a
    plan has none): the tallies kept while composing by cost, unless the warm-up reorder moved
    micro-batches; else recomputed from the plan's steps."""
    cfg = p.cfg
    if cfg.order != "shuffle" or (cfg.warmup == "reorder" and cfg.epochs > 1):
        return None
    if tallies is not None and cfg.warmup != "reorder":  # composed by cost (slotted or not)
        return tally_figures(tallies, cfg.shuffle_window) if comm.Get_rank() == 0 else None
    assert p.pos2 is not None
    sizes = [int(p.micro.samples[s].sum()) for s in epoch_slices(p)]
    step = sample_steps(p.step, p.micro.samples, p.num_steps)
    return moved_recomputed(comm, p.pos2, step, p.epochs, sizes, total_tokens, cfg.shuffle_window)
