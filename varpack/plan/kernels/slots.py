"""Slots dealt to steps (``--sync micro``): balanced slots, and every step holds slots of every weight.

A plan for ranks that meet at every micro-batch lasts, step after step, the sum over its *slots*
(one micro-batch per rank) of the costliest micro-batch in each, whichever step a slot belongs
to. A composer makes micro-batches that come in near-equal groups of ``dp``;
:func:`slot_order` then takes each block of ``window`` steps' micro-batches, sorted by cost, in
runs of ``dp`` as slots (sorted runs make the sum of the slots' maxima the least any grouping of
these micro-batches into slots reaches: the ``j``-th costliest slot waits on at least the
``j * dp``-th costliest micro-batch), and deals the slots, costliest first, to the block's steps
in a snake (0, 1, .., n-1, n-1, .., 0): every step holds slots of every weight, so its length mix
follows the block's, and a micro-batch moves by less than one block.
:func:`move_micro` applies the order to a stream cut into micro-batches.

In the padded layout a micro-batch (a band of rows of one length range) cannot be topped up
with short rows, so a block's band costs spread over its window's lengths and its sorted runs
wait about half that spread; a heavy band balances only when ``dp`` of them cost alike, and one
block holds too few. :func:`pool_pairs` first cuts each pair of neighbouring blocks as one (its
sorted runs of ``dp``, each to the block most of it comes from): a band trains at most one
block from where it was composed (as a heavy sample that waits a window in the packed layout).
At grad-accum 1 a block holds too few bands of long rows even so (a band of one long row is
priced by its length alone): :func:`pool_quads` pools each group of four blocks as one where
that pays, and a band then moves at most three blocks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.level import slot_cut_time
from varpack.plan.kernels.order import snake


def slot_order(
    cost: np.ndarray,
    dp: int,
    k: int,
    window: int,
    mix: tuple[float, np.uint64, np.ndarray] | None = None,
    deal: np.ndarray | None = None,
) -> np.ndarray:
    """The micro-batches in their new order (``dp * k`` a step, ``dp`` a slot): each block of
    ``window`` steps (the last one may be shorter) sorted by ``cost`` (costliest first, ties by
    position), cut into slots of ``dp``, the slots dealt in a snake to the block's steps.

    Two ranks, two slots a step, one block of two steps: the two costliest micro-batches make
    a slot, the next two another, and they go to different steps.

    >>> slot_order(np.array([1.0, 9, 2, 8, 3, 7, 4, 6]), 2, 2, 2).tolist()
    [1, 3, 2, 0, 5, 7, 6, 4]

    ``mix`` ``(share, seed, wide)``: in a block most of whose micro-batches are flagged in
    ``wide`` (dealt window-wide, :mod:`.lpt`: they cost about the same whatever they hold),
    costs within ``share`` of the block's mean count as alike (sorted in buckets of that width),
    taken in a ``seed``-drawn order rather than by position, so a slot mixes micro-batches of
    unlike contents (see :func:`_bucketed`).

    ``deal``: a key of each micro-batch (the padded layout: its rows' length) by which a
    block's slots, as cut by cost, are dealt in the snake instead of by their cost (a slot's
    key: its micro-batches' mean). Under ``--sync micro`` a plan lasts the sum of its slots'
    costs whichever step holds each, so this costs no time; a padded slot holds bands of one
    length range and a short band many more rows than a long one, so a deal by cost, which
    follows the fill as much as the length, leaves steps of a few length ranges.

    >>> c = np.array([9.0, 8, 7, 6, 5, 4, 3, 2])
    >>> slot_order(c, 2, 2, 2, deal=np.array([1, 1, 2, 2, 3, 3, 4, 4])).tolist()
    [6, 7, 0, 1, 4, 5, 2, 3]
    """
    m = len(cost)
    if m == 0:
        return np.arange(m, dtype=np.int64)
    size = window * k * dp
    pos = np.arange(m, dtype=np.int64)
    block = pos // size
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    if mix is None:
        order = _sorted_blocks(cost, size)
    else:
        share, seed, wide = mix
        order = _bucketed(cost, size, share, seed, np.ascontiguousarray(wide, dtype=np.bool_))
    rank = pos - block * size  # place of order[i] in its block, costliest first
    steps = np.minimum(size, m - block * size) // (k * dp)  # steps of each block
    slot, lane = np.divmod(rank, dp)
    if deal is not None:
        slot = _by_key(np.asarray(deal, dtype=np.float64)[order], block, size, dp)
    lap = slot // steps
    new = block * size + (snake(slot, steps) * k + lap) * dp + lane
    out = np.empty(m, dtype=np.int64)
    out[new] = order
    return out


def _by_key(key: np.ndarray, block: np.ndarray, size: int, dp: int) -> np.ndarray:
    """Each position's slot rank in its block by its slot's mean ``key``, largest first (ties:
    the cost order); ``key`` in slot order (runs of ``dp``)."""
    per = key.reshape(-1, dp).mean(axis=1)
    sb = block[::dp]
    first = np.searchsorted(sb, sb)  # each slot's block's first slot
    ranked = np.lexsort((np.arange(len(per)), -per, sb))
    rank = np.empty(len(per), dtype=np.int64)
    rank[ranked] = np.arange(len(per)) - first[ranked]
    return np.repeat(rank, dp)


@njit(cache=True)
def _sorted_blocks(cost, size):  # type: ignore[no-untyped-def]
    """Positions, each block of ``size`` sorted by ``cost``, costliest first, ties by position
    (a stable sort per block: 2.5x quicker than one lexsort of the whole epoch)."""
    out = np.empty(len(cost), dtype=np.int64)
    for a in range(0, len(cost), size):
        b = min(a + size, len(cost))
        out[a:b] = np.argsort(-cost[a:b], kind="mergesort") + a
    return out


@njit(cache=True)
def _draw(seed, j):  # type: ignore[no-untyped-def]
    """A pseudo-random key of place ``j`` (splitmix64): the same on every rank and run."""
    z = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(j + 1)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _bucketed(cost, size, share, seed, wide):  # type: ignore[no-untyped-def]
    """Positions, each block of ``size`` most of whose micro-batches are flagged in ``wide``
    sorted by cost in buckets of ``share`` of the block's mean cost, costliest first, inside a
    bucket in an order drawn from ``seed`` and the place in the block (not the stream position:
    a block's order is the same on every rank); the other blocks as :func:`_sorted_blocks`."""
    out = np.empty(len(cost), dtype=np.int64)
    for a in range(0, len(cost), size):
        b = min(a + size, len(cost))
        if 2 * wide[a:b].sum() <= b - a:  # composed by the cost composer: the sorted cut
            out[a:b] = np.argsort(-cost[a:b], kind="mergesort") + a
            continue
        width = share * max(cost[a:b].mean(), 1e-300)
        key = np.empty(b - a, dtype=np.uint64)
        for j in range(b - a):
            key[j] = _draw(seed, j)
        drawn = np.argsort(key)
        bucket = np.floor(cost[a:b] / width)
        out[a:b] = drawn[np.argsort(-bucket[drawn], kind="mergesort")] + a
    return out


@njit(cache=True)
def _pool_pair(cost, a, mid, b, dp, out):  # type: ignore[no-untyped-def]
    """Blocks ``a:mid`` and ``mid:b`` of ``out`` re-formed (see :func:`pool_pairs`)."""
    n, size = b - a, mid - a
    top = np.argsort(-cost[a:b], kind="mergesort")  # costliest first, ties by position
    room = np.array([size, n - size])
    flag = np.zeros(n, dtype=np.bool_)  # in the first block
    for r in range(0, n, dp):  # a run to the block most of it comes from, else the other
        run = top[r : r + dp]
        blk = 0 if 2 * np.sum(run < size) >= len(run) else 1
        # ... unless that block is a run ahead of its share of the runs so far: each block
        # keeps its share of every cost range (else the first fills up first and the pair's
        # cheapest runs, its shortest bands, all go to the second: steps of one length range)
        share = (r + len(run)) * size / n if blk == 0 else (r + len(run)) * (n - size) / n
        if (size if blk == 0 else n - size) - room[blk] + len(run) > share + dp:
            blk = 1 - blk
        if room[blk] < len(run):
            blk = 1 - blk
        if room[blk] < len(run):  # the last, short run: split by room
            for q in range(len(run)):
                flag[run[q]] = room[0] > 0
                room[0 if room[0] > 0 else 1] -= 1
            break
        room[blk] -= len(run)
        for q in range(len(run)):
            flag[run[q]] = blk == 0
    n1 = n2 = 0
    first = np.empty(size, dtype=np.int64)
    second = np.empty(n - size, dtype=np.int64)
    for i in range(n):
        if flag[i]:
            first[n1] = a + i
            n1 += 1
        else:
            second[n2] = a + i
            n2 += 1
    out[a:mid] = first
    out[mid:b] = second


@njit(cache=True)
def pool_pairs(cost, size, dp):  # type: ignore[no-untyped-def]
    """The micro-batches in a new order that keeps every block of ``size`` (its count, and the
    stream order inside it) but pools each pair of blocks ``(2j, 2j + 1)``: its micro-batches,
    costliest first, cut into runs of ``dp``, each run to the block most of it comes from (to
    the other where that one has no room left). A last unpaired block keeps its own. Each block then holds whole runs of the pair's sorted order, so the slot cut of
    :func:`slot_order` finds them again: the pair's micro-batches are cut as one block would
    be, while a micro-batch moves at most to the other block of its pair.

    Two ranks, blocks of four, one heavy micro-batch in each: the second block's (8, at 6)
    joins the first block's (9, at 1) in one run, and the first block's last light one (3)
    takes its place.

    >>> pool_pairs(np.array([1.0, 9, 1, 1, 1, 1, 8, 1]), 4, 2).tolist()
    [0, 1, 2, 6, 3, 4, 5, 7]
    """
    m = len(cost)
    out = np.arange(m)
    if dp < 2:
        return out
    for a in range(0, m - size, 2 * size):
        _pool_pair(cost, a, a + size, min(a + 2 * size, m), dp, out)
    return out


@njit(cache=True)
def _gather(src, starts, order, new_starts):  # type: ignore[no-untyped-def]
    """``src``'s runs ``starts[order[i]] .. starts[order[i] + 1]`` one after the other."""
    out = np.empty(len(src), dtype=src.dtype)
    for i in range(len(order)):
        a, b = starts[order[i]], starts[order[i] + 1]
        out[new_starts[i] : new_starts[i] + b - a] = src[a:b]
    return out


def move_micro(
    arrays: tuple[np.ndarray, ...], starts: np.ndarray, order: np.ndarray
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """``(arrays, starts)`` of a stream cut into micro-batches at ``starts`` (``arrays``: its
    columns, position by position), the micro-batches moved into ``order`` (one new array per
    column, no temporary of the stream's size).

    >>> (idx,), starts = move_micro((np.arange(5),), np.array([0, 1, 3, 5]), np.array([2, 0, 1]))
    >>> idx.tolist(), starts.tolist()
    ([3, 4, 0, 1, 2], [0, 2, 3, 5])
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    new_starts = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(np.diff(starts)[order], out=new_starts[1:])
    return tuple(_gather(a, starts, order, new_starts) for a in arrays), new_starts


def pool_quads(cost: np.ndarray, size: int, dp: int, gain: float) -> np.ndarray:
    """:func:`pool_pairs`' order, but each group of four blocks ``(4j .. 4j + 3)`` pooled as one
    where that lowers the group's slot time by more than ``gain`` of it: its micro-batches,
    costliest first, in runs of ``dp``, each run to the pair of blocks most of it comes from,
    then inside the pair to the block (:func:`pool_pairs` on pairs of blocks, then on blocks).
    A micro-batch then moves at most to another block of its group; every block keeps its
    count and its stream order.

    Two ranks, blocks of two: each block holds one heavy micro-batch, each pair two of unlike
    cost (9 with 5, 8.5 with 4); pooled by four the two costliest meet in one slot, and the
    5 and the 4 in another (slots of 9, 5, 1, 1 against 9, 1, 8.5, 1).

    >>> c = np.array([9.0, 1, 5, 1, 8.5, 1, 4, 1])
    >>> pool_pairs(c, 2, 2).tolist(), pool_quads(c, 2, 2, 0.01).tolist()
    ([0, 2, 1, 3, 4, 6, 5, 7], [0, 4, 2, 6, 1, 3, 5, 7])
    """
    pairs = pool_pairs(cost, size, dp)
    wide = pool_pairs(cost, 2 * size, dp)
    wide = wide[pool_pairs(cost[wide], size, dp)]
    return _choose(cost, pairs, wide, size, dp, gain)


@njit(cache=True)
def _choose(cost, pairs, wide, size, dp, gain):  # type: ignore[no-untyped-def]
    """``pairs`` with each group of four blocks taken from ``wide`` where that pays."""
    out = pairs.copy()
    m = len(cost)
    for g in range(0, m, 4 * size):
        tp = tw = 0.0
        for a in range(g, min(g + 4 * size, m), size):
            b = min(a + size, m)
            tp += slot_cut_time(cost[pairs[a:b]], dp)  # the slot cut's time of each block
            tw += slot_cut_time(cost[wide[a:b]], dp)
        if tw < (1.0 - gain) * tp:
            out[g : g + 4 * size] = wide[g : g + 4 * size]
    return out
