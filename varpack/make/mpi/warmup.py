"""``--warmup reorder`` under MPI: every rank's first micro-batch of each shape moved to its front.

One process permutes each data-parallel rank's micro-batches (:func:`varpack.plan.stages.warmup.
warmup_order`): the first micro-batch of every distinct shape goes to the front, largest shape
first, the others follow in plan order. Here each MPI rank finds the first micro-batch of each
(data-parallel rank, shape) among its own steps; the ranks gather those few candidates and keep
the earliest, so all know which micro-batches lead; each then renumbers its own micro-batches: a
leader takes its slot, any other moves back by the leaders that came from behind it (with
``--pp``, whole (step, rank) groups move, as one process moves them). Micro-
batches change steps but not MPI ranks: the rank files' owners sort their rows by step
(:mod:`.write`), and each step's totals are summed over the ranks (:func:`global_totals`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.plan import PlanArrays
from varpack.plan.lr import lr_factors, step_totals
from varpack.plan.sync import slotted


def reorder_ranks(comm: Any, p: PlanArrays) -> None:
    """Renumber ``p``'s micro-batches (step, micro index) and flag the warm-up prefix, in place.
    With ``--pp`` whole (step, rank) groups move, so that each step keeps one shape (their
    first micro-batch stands for them); a rank holds whole steps, so a group never spans ranks."""
    k, dp = p.cfg.grad_accum, p.cfg.dp
    rows, pad_to = p.micro.rows.astype(np.int64), p.micro.pad_to.astype(np.int64)
    if p.cfg.pp == 1:
        slots = slotted(p.cfg.sync, k)  # the same positions move on every rank
        new, count = _reordered(comm, p.rank, p.step * k + p.micro_index, rows, pad_to, dp, slots)
        p.step, p.micro_index = new // k, new % k
        p.warmup = new < count[p.rank]
        return
    lead = np.flatnonzero(p.micro_index == 0)
    new, count = _reordered(comm, p.rank[lead], p.step[lead], rows[lead], pad_to[lead], dp)
    span = int(p.step.max()) + 1 if len(p.step) else 1
    key = p.rank[lead] * span + p.step[lead]
    order = np.argsort(key)
    group = order[np.searchsorted(key[order], p.rank * span + p.step)]  # each one's lead
    p.step = new[group]
    p.warmup = p.step < count[p.rank]


def _reordered(
    comm: Any,
    rank: np.ndarray,
    pos: np.ndarray,
    rows: np.ndarray,
    pad_to: np.ndarray,
    dp: int,
    slots: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """New position of each item (at ``pos`` in its data-parallel ``rank``'s order, of shape
    ``(rows, pad_to)``) and each data-parallel rank's count of leaders (its warm-up prefix).
    ``slots``: every leader's position moves to the front on every rank, as
    :func:`varpack.plan.stages.warmup.slot_warmup_order` moves them."""
    first = np.lexsort((pos, pad_to, rows, rank))
    head = np.ones(len(first), dtype=bool)
    key = np.stack((rank[first], rows[first], pad_to[first]))
    head[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    mine = np.stack((rank[first][head], rows[first][head], pad_to[first][head], pos[first][head]))
    every = np.concatenate(comm.allgather(mine), axis=1)
    # earliest per (rank, shape): sorted by position, the first of each key wins
    o = np.lexsort((every[3], every[2], every[1], every[0]))
    every = every[:, o]
    lead = np.ones(every.shape[1], dtype=bool)
    lead[1:] = (every[:3, 1:] != every[:3, :-1]).any(axis=0)
    r, srows, spad, spos = every[:, lead]
    # slots: each rank's leaders, largest shape first (tokens, then padded length)
    o = np.lexsort((-spad, -(srows * spad), r))
    r, spos = r[o], spos[o]
    start = np.searchsorted(r, np.arange(dp + 1))
    slot = np.arange(len(r)) - start[r]
    count = np.diff(start)
    # leaders by (rank, position) to find each item's own and those before it
    span = int(pos.max()) + 1 if len(pos) else 1
    span = max(span, int(spos.max()) + 1 if len(spos) else 1)
    span = max(comm.allgather(span))
    lkey = r * span + spos
    order = np.argsort(lkey)
    lkey, lslot = lkey[order], slot[order]
    q = rank * span + pos
    at = np.searchsorted(lkey, q)
    is_lead = (at < len(lkey)) & (lkey[np.minimum(at, len(lkey) - 1)] == q)
    before = at - start[rank]  # leaders of this rank at earlier positions
    lead_new = lslot[np.minimum(at, len(lkey) - 1)]
    if not slots:
        return np.where(is_lead, lead_new, pos + count[rank] - before), count
    front = np.unique(spos)  # positions that move on every rank
    c = np.searchsorted(front, pos)  # front positions before (or at) each item's
    moved = (c < len(front)) & (front[np.minimum(c, len(front) - 1)] == pos)
    rest = np.where(moved, count[rank] + c - before, len(front) + pos - c)
    return np.where(is_lead, lead_new, rest), count


def global_totals(comm: Any, p: PlanArrays) -> None:
    """Each step's samples and tokens summed over every rank's micro-batches, and the LR
    factors from them, in place (every rank gets the whole plan's per-step columns)."""
    cfg = p.cfg
    samples, tokens = step_totals(p.step, p.micro.samples, p.micro.tokens, p.num_steps)
    p.step_samples = comm.allreduce(samples)
    p.step_tokens = comm.allreduce(tokens)
    p.lr = lr_factors(
        p.step_samples, p.step_tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit
    )
