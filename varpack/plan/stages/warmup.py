"""Compile warm-up ordering: each rank meets every shape it will ever see in its first micro-batches.

Static ``torch.compile`` builds one graph per input shape; a rank that meets a new shape late
recompiles mid-training (and stalls the other ranks at the next collective). ``--warmup reorder``
moves, on every rank, one micro-batch of each distinct shape to the front of that rank's plan,
largest shape first (an out-of-memory error shows at once), and leaves the rest in plan order.
``--warmup list`` keeps the order and only records each rank's shapes (in plan.json).

Representation (all plain arrays): a plan of ``dp`` ranks, each with ``n`` micro-batches in
execution order (every rank has the same count: ``n = num_steps * grad_accum``), is a ``(dp, n)``
array of shape ids. Position ``i`` of a rank is step ``i // grad_accum``, micro ``i % grad_accum``.
Shape ids come from :func:`encode_shapes` and are ordered by size: a larger id is a larger shape.
Reordering only permutes positions within a rank, so every step keeps ``grad_accum`` micro-batches
on every rank; but micro-batches change steps, so the planner computes each step's global tokens
and samples and its LR factor after this stage.

The stage (:func:`warm_up`) applies the ``--warmup`` strategy chosen by name from :data:`WARMUPS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from varpack.plan.arrays import Placement
from varpack.plan.config import PlanConfig
from varpack.plan.sync import slotted

_SHIFT = 31  # a shape (rows, pad_to) as one int64 key: rows << 31 | pad_to (both < 2**31)


def encode_shapes(rows: np.ndarray, pad_to: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shape ids of micro-batches and the table of distinct shapes, smallest first.

    ``rows``: rows of each micro-batch (padded layout: samples + ``pad_rows``; packed: 1s);
    ``pad_to``: its padded length. Any array shape (e.g. ``(dp, n)``); ids have the same shape.
    Shapes are ordered by tokens ``rows * pad_to``, then by ``pad_to`` (attention memory grows with
    the length), so ``shapes[-1]`` is the largest. Returns ``(ids, shapes)`` with ``shapes`` an
    ``(S, 2)`` ``int64`` array of ``(rows, pad_to)``.

    >>> ids, table = encode_shapes(np.array([4, 1, 4, 2]), np.array([8, 64, 8, 16]))
    >>> ids.tolist(), table.tolist()
    ([0, 2, 0, 1], [[4, 8], [2, 16], [1, 64]])
    """
    r = np.asarray(rows, np.int64)
    t = np.asarray(pad_to, np.int64)
    keys, inv = np.unique((r.ravel() << _SHIFT) | t.ravel(), return_inverse=True)
    table = np.stack([keys >> _SHIFT, keys & ((1 << _SHIFT) - 1)], axis=1)
    order = np.lexsort((table[:, 0], table[:, 1], table[:, 0] * table[:, 1]))
    rank_of = np.empty(order.size, np.int64)
    rank_of[order] = np.arange(order.size)
    return rank_of[inv.ravel()].reshape(r.shape), table[order]


def _first_occurrence(shape_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, position, shape) of the first micro-batch of each distinct shape on each rank."""
    dp, n = shape_ids.shape
    s = int(shape_ids.max()) + 1 if shape_ids.size else 1
    key = np.arange(dp, dtype=np.int64)[:, None] * s + shape_ids
    _, first = np.unique(key.ravel(), return_index=True)
    return first // n, first % n, shape_ids.ravel()[first]


def warmup_order(shape_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``--warmup reorder``: a per-rank permutation putting one micro-batch per shape first.

    ``shape_ids``: ``(dp, n)`` ids in execution order, a larger id a larger shape. On each rank
    the first micro-batch of every distinct shape moves to the front, largest shape first; the
    others follow in their plan order. Returns ``(perm, warmup)``, both ``(dp, n)``:
    ``perm[r, i]`` is the old position of the micro-batch rank ``r`` runs at position ``i``
    (apply with ``np.take_along_axis(x, perm, axis=1)``) and ``warmup[r, i]`` is true for the
    prefix (the manifest's ``warmup`` column). Vectorised over all ranks.

    >>> perm, warm = warmup_order(np.array([[0, 0, 1, 2, 1, 0], [2, 2, 2, 2, 0, 2]]))
    >>> perm.tolist()
    [[3, 2, 0, 1, 4, 5], [0, 4, 1, 2, 3, 5]]
    >>> warm.astype(int).tolist()
    [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    """
    ids = np.asarray(shape_ids, np.int64)
    if ids.ndim != 2:
        raise ValueError("shape_ids must be (dp, n)")
    dp, n = ids.shape
    if ids.size == 0:
        return np.zeros((dp, n), np.int64), np.zeros((dp, n), bool)
    rank, pos, shape = _first_occurrence(ids)
    # Prefix slot of each representative: its rank among that rank's shapes, largest first.
    o = np.lexsort((-shape, rank))
    rank, pos, shape = rank[o], pos[o], shape[o]
    start = np.searchsorted(rank, np.arange(dp))
    slot = np.arange(rank.size) - start[rank]
    count = np.bincount(rank, minlength=dp)
    key = count[:, None] + np.arange(n, dtype=np.int64)[None, :]  # the rest, in plan order
    key[rank, pos] = slot
    perm = np.argsort(key, axis=1, kind="stable")
    warmup = np.arange(n)[None, :] < count[:, None]
    return perm, warmup


def slot_warmup_order(shape_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`warmup_order` for ranks that meet at every micro-batch (``--sync micro``): the
    positions holding any rank's first micro-batch of a shape move to the front on every rank,
    so that every later position still pairs the micro-batches the plan balanced as a slot.
    Inside that front, each rank runs its own first micro-batch of every shape first, largest
    first, then the others in plan order. Returns ``(perm, warmup)`` as :func:`warmup_order`.

    >>> perm, warm = slot_warmup_order(np.array([[0, 0, 1, 0], [1, 0, 0, 0]]))
    >>> perm.tolist(), warm.astype(int).tolist()
    ([[2, 0, 1, 3], [0, 1, 2, 3]], [[1, 1, 0, 0], [1, 1, 0, 0]])
    """
    ids = np.asarray(shape_ids, np.int64)
    dp, n = ids.shape
    if ids.size == 0:
        return np.zeros((dp, n), np.int64), np.zeros((dp, n), bool)
    rank, pos, shape = _first_occurrence(ids)
    front = np.unique(pos)  # the positions that move, on every rank
    o = np.lexsort((-shape, rank))
    rank, pos, shape = rank[o], pos[o], shape[o]
    count = np.bincount(rank, minlength=dp)
    slot = np.arange(rank.size) - np.searchsorted(rank, np.arange(dp))[rank]
    # the rest after the front (a rank's firsts, then the other moved ones, count + L at most)
    key = np.broadcast_to(2 * len(front) + np.arange(n, dtype=np.int64), (dp, n)).copy()
    key[:, front] = count[:, None] + np.arange(len(front))  # moved, after the rank's own firsts
    key[rank, pos] = slot
    perm = np.argsort(key, axis=1, kind="stable")
    return perm, np.arange(n)[None, :] < count[:, None]


def first_new_shape_after_prefix(shape_ids: np.ndarray, warmup_mask: np.ndarray) -> int:
    """Position of the first micro-batch after the warm-up prefix whose shape the prefix lacks.

    One rank's ``shape_ids`` and ``warmup`` flags in execution order; -1 if there is none, i.e.
    the rank never meets a new shape after its warm-up.

    >>> first_new_shape_after_prefix(np.array([2, 0, 0, 1]), np.array([1, 1, 0, 0], bool))
    3
    >>> first_new_shape_after_prefix(np.array([2, 0, 0, 2]), np.array([1, 1, 0, 0], bool))
    -1
    """
    ids = np.asarray(shape_ids, np.int64)
    mask = np.asarray(warmup_mask, bool)
    new = ~mask & ~np.isin(ids, ids[mask])
    return int(np.argmax(new)) if new.any() else -1


def check_warmup_prefix(
    shape_ids: np.ndarray, warmup_mask: np.ndarray, rank: int | None = None
) -> list[str]:
    """Violations of the warm-up rule on one rank (empty if fine).

    The ``warmup`` rows form a prefix, hold one micro-batch per shape, largest first (larger
    id = larger shape, :func:`encode_shapes`), and no shape first appears after the prefix.

    >>> check_warmup_prefix(np.array([1, 0, 1, 0]), np.array([1, 1, 0, 0], bool))
    []
    >>> check_warmup_prefix(np.array([0, 1, 0, 2]), np.array([1, 1, 0, 0], bool), rank=1)
    ['rank 1: warm-up shapes are not largest first', 'rank 1: micro-batch 3 has a shape not in the warm-up prefix']
    """
    where = "" if rank is None else f"rank {rank}: "
    ids = np.asarray(shape_ids, np.int64)
    mask = np.asarray(warmup_mask, bool)
    out: list[str] = []
    p = int(mask.sum())
    if not mask[:p].all():
        out.append(f"{where}warm-up rows are not a prefix of the rank's plan")
    head = ids[mask]
    if np.unique(head).size != head.size:
        out.append(f"{where}the warm-up prefix repeats a shape")
    if np.any(np.diff(head) > 0):
        out.append(f"{where}warm-up shapes are not largest first")
    i = first_new_shape_after_prefix(ids, mask)
    if i >= 0:
        out.append(f"{where}micro-batch {i} has a shape not in the warm-up prefix")
    return out


def reorder_plan(
    step: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    rows: np.ndarray,
    pad_to: np.ndarray,
    dp: int,
    grad_accum: int,
    whole_steps: bool = False,
    whole_slots: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``--warmup reorder`` on a whole plan: new ``(step, micro, warmup)`` of every micro-batch.

    Micro-batches are given by their ``step``, ``rank`` and ``micro`` (every rank holds
    ``num_steps * grad_accum`` of them) and shape ``(rows, pad_to)``. Each rank's micro-batches are
    permuted by :func:`warmup_order`; with ``whole_steps`` (pipeline parallel: a step's
    micro-batches on a rank share one shape) whole (step, rank) groups move instead, so each step
    keeps one shape; with ``whole_slots`` (``--sync micro``) the same positions move on every
    rank (:func:`slot_warmup_order`). Ranks never exchange micro-batches.

    >>> st, mi, w = reorder_plan(np.array([0, 1, 2]), np.zeros(3, int), np.zeros(3, int),
    ...                          np.ones(3, int), np.array([8, 8, 16]), 1, 1)
    >>> st.tolist(), mi.tolist(), w.tolist()
    ([1, 2, 0], [0, 0, 0], [True, False, True])
    """
    m = len(step)
    n = m // dp
    order = np.lexsort((micro, step, rank)).reshape(dp, n)  # micro-batch at each position
    ids, _ = encode_shapes(rows[order], pad_to[order])
    if whole_steps:
        k = grad_accum
        perm_g, warm_g = warmup_order(ids.reshape(dp, n // k, k)[:, :, 0])
        perm = (perm_g[:, :, None] * k + np.arange(k)).reshape(dp, n)
        warm = np.repeat(warm_g, k, axis=1)
    else:
        perm, warm = (slot_warmup_order if whole_slots else warmup_order)(ids)
    moved = np.take_along_axis(order, perm, axis=1).ravel()  # micro-batch run at each position
    pos = np.tile(np.arange(n, dtype=np.int64), dp)
    new_step = np.empty(m, np.int64)
    new_micro = np.empty(m, np.int64)
    flag = np.empty(m, bool)
    new_step[moved] = pos // grad_accum
    new_micro[moved] = pos % grad_accum
    flag[moved] = warm.ravel()
    return new_step, new_micro, flag


def _keep(placed: Placement, cfg: PlanConfig) -> Placement:
    return placed


def _reorder(placed: Placement, cfg: PlanConfig) -> Placement:
    m = placed.micro
    step, index, warm = reorder_plan(
        placed.step, placed.rank, placed.micro_index, m.rows, m.pad_to, cfg.dp, cfg.grad_accum,
        cfg.pp > 1, slotted(cfg.sync, cfg.grad_accum),
    )  # fmt: skip
    return dataclasses.replace(placed, step=step, micro_index=index, warmup=warm)


#: warm-up name -> ``fn(placement, cfg) -> placement`` (list and none keep the order)
WARMUPS: dict[str, Callable[[Placement, PlanConfig], Placement]] = {
    "list": _keep,
    "none": _keep,
    "reorder": _reorder,
}


def warm_up(placed: Placement, cfg: PlanConfig) -> Placement:
    """Stage 5, warm-up: the execution order the ``--warmup`` strategy asks for."""
    return WARMUPS[cfg.warmup](placed, cfg)
