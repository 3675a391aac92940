"""Order and pack under MPI, curriculum order: the one process's micro-batches, whole steps per rank.

The curriculum stream is the input order every epoch, packed greedily as one segment, completed
to a multiple of ``dp x grad_accum`` micro-batches by splitting the costliest ones near the end
(:func:`varpack.plan.kernels.pack.complete`) and, with ``--cost flops/time``, ordered by cost in
windows of ``--shuffle-window`` steps. Under MPI:

1. every rank finds where packing would cut after each of its rows, then the packing is relayed
   from rank to rank, a step per micro-batch (:func:`~.moves.relay_pack`);
2. the last rank takes the last few steps' micro-batches and completes the count as one process
   would (it takes more, up to all of them, in the rare case that completing reaches further
   back);
3. every rank ends with whole units (steps, or cost windows), the ones whose first micro-batch it
   holds, and orders its windows by cost.

Every epoch packs the same input the same way, so one epoch is planned and repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from varpack.make.mpi.moves import Rows, count, move_micro, owners, relay_pack
from varpack.plan import PlanConfig
from varpack.plan.kernels.cuts import next_cuts
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.pack import complete, pack
from varpack.plan.stages.batching.common import effective_lengths
from varpack.plan.stages.levelling import by_cost_in_windows, levels
from varpack.sort.agree import agree

#: steps of micro-batches the last rank takes to complete the count (more only if it must)
TAIL_STEPS = 4


def curriculum_epoch(
    comm: Any, held: dict[str, Rows], cfg: PlanConfig, lengths: np.ndarray | None = None
) -> tuple[Rows, np.ndarray, int, int]:
    """``(rows, off, first, total)``: this rank's rows (taken out of ``held``, so that each
    move frees the rows before it) cut into micro-batches ``off``, the global number of its
    first micro-batch and the epoch's count of micro-batches. ``lengths``: the shape lengths
    known before batching (the padded layout packs samples at their chosen lengths)."""
    rule = cfg.pack_rule()
    rows = held.pop("rows")

    def view(r: Rows) -> np.ndarray:
        if lengths is not None and cfg.layout == "padded":
            return effective_lengths(r["lens"], cfg, lengths)
        return r["lens"]

    def pack_rows(r: Rows) -> np.ndarray:
        starts = pack(view(r), np.array([0, count(r)]), r["alone"], rule, 0, r.get("group"))[1]
        return starts.copy()  # a view of one entry per sample: keep only the micro-batches

    def cuts(r: Rows) -> np.ndarray:
        return next_cuts(view(r), r["alone"], rule, r.get("group"))

    rows, off = relay_pack(comm, rows, pack_rows, cuts)
    rows, off = complete_tail(comm, rows, off, cfg, "epoch 0")
    unit = cfg.micro_per_step * (cfg.shuffle_window if levels(cfg.cost, cfg.order) else 1)
    rows, off = whole_units(comm, rows, off, unit)
    if levels(cfg.cost, cfg.order):
        mrule = cfg.micro_rule()
        cost = summarize(off, rows["lens"], mrule).cost
        idx, off, _ = by_cost_in_windows(
            np.arange(count(rows)), off, rows["lens"], cost, cfg.shuffle_window * cfg.micro_per_step
        )
        rows = {k: v[idx] for k, v in rows.items()}
    counts = comm.allgather(len(off) - 1)
    return rows, off, sum(counts[: comm.Get_rank()]), sum(counts)


def _firsts(comm: Any, off: np.ndarray) -> tuple[np.ndarray, int]:
    """Each rank's first global micro-batch number, and the total."""
    counts = np.array(comm.allgather(len(off) - 1), dtype=np.int64)
    return np.concatenate(([0], np.cumsum(counts)[:-1])), int(counts.sum())


def complete_tail(
    comm: Any, rows: Rows, off: np.ndarray, cfg: PlanConfig, where: str
) -> tuple[Rows, np.ndarray]:
    """The epoch's micro-batches completed to whole steps, on the last rank (see module doc);
    ``where`` names the epoch in the error where they cannot be."""
    per = cfg.micro_per_step
    first, m = _firsts(comm, off)
    if m % per == 0:
        return rows, off
    last = comm.Get_size() - 1
    mrule = cfg.micro_rule()

    def cost_of(o: np.ndarray, v: np.ndarray) -> np.ndarray:
        return summarize(o, v, mrule).cost

    for tail in (min(m, m % per + TAIL_STEPS * per), m):
        first, _ = _firsts(comm, off)
        mine = first[comm.Get_rank()] + np.arange(len(off) - 1)
        rows, off = move_micro(comm, rows, off, np.where(mine >= m - tail, last, comm.Get_rank()))
        held = comm.Get_rank() == last
        start = int(_firsts(comm, off)[0][last])
        work = partial(_complete_held, rows, off, start, per, cost_of, held, tail < m, where)
        done = agree(comm, work)
        if comm.bcast(done is None, root=last):
            continue
        assert done is not None
        return rows, done
    raise AssertionError("the last rank held every micro-batch")


def _complete_held(
    rows: Rows,
    off: np.ndarray,
    start: int,
    per: int,
    cost_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    held: bool,
    partial_tail: bool,
    where: str,
) -> np.ndarray | None:
    """The last rank's completion of the micro-batches it holds from its first step boundary
    on (its first micro-batch is number ``start``); ``None``: completing reached further back
    than ``partial_tail`` held, so the last rank takes them all."""
    if not held:
        return off
    head = (-start) % per  # the end of a step that began on an earlier rank
    base = int(off[head])
    try:
        done = complete(off[head:] - base, rows["lens"][base:], per, cost_of, where)
    except Exception:
        if partial_tail:
            return None
        raise
    return np.concatenate((off[:head], done + base))


def whole_units(comm: Any, rows: Rows, off: np.ndarray, unit: int) -> tuple[Rows, np.ndarray]:
    """Micro-batches moved so that each rank holds whole runs of ``unit`` (steps, windows): a run
    goes to the rank that holds its first micro-batch."""
    first, _ = _firsts(comm, off)
    mine = first[comm.Get_rank()] + np.arange(len(off) - 1)
    return move_micro(comm, rows, off, owners(first, (mine // unit) * unit))
