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

In the padded layout a heavy micro-batch (a band of long rows) cannot be topped up with short
rows, so a slot of them balances only when ``dp`` of them cost alike, and one block holds too few
for sorted runs of alike ones. :func:`pool_pairs` first pools the costliest micro-batches of two
neighbouring blocks (the heavy ones and the next costliest, in whole groups of ``dp``) and hands
each block whole groups of them, costliest first: a heavy band trains at most one block from
where it was composed (as a heavy sample that waits a window in the packed layout), and the
other micro-batches stay in their block unless a group's room moves one to the other block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import HEAVY_EXCESS
from varpack.plan.kernels.order import snake


def slot_order(cost: np.ndarray, dp: int, k: int, window: int) -> np.ndarray:
    """The micro-batches in their new order (``dp * k`` a step, ``dp`` a slot): each block of
    ``window`` steps (the last one may be shorter) sorted by ``cost`` (costliest first, ties by
    position), cut into slots of ``dp``, the slots dealt in a snake to the block's steps.

    Two ranks, two slots a step, one block of two steps: the two costliest micro-batches make
    a slot, the next two another, and they go to different steps.

    >>> slot_order(np.array([1.0, 9, 2, 8, 3, 7, 4, 6]), 2, 2, 2).tolist()
    [1, 3, 2, 0, 5, 7, 6, 4]
    """
    m = len(cost)
    if m == 0:
        return np.arange(m, dtype=np.int64)
    size = window * k * dp
    pos = np.arange(m, dtype=np.int64)
    block = pos // size
    order = np.lexsort((pos, -np.asarray(cost, dtype=np.float64), block))
    rank = pos - block * size  # place of order[i] in its block, costliest first
    steps = np.minimum(size, m - block * size) // (k * dp)  # steps of each block
    slot, lane = np.divmod(rank, dp)
    lap = slot // steps
    new = block * size + (snake(slot, steps) * k + lap) * dp + lane
    out = np.empty(m, dtype=np.int64)
    out[new] = order
    return out


@njit(cache=True)
def _heavy_count(cost):  # type: ignore[no-untyped-def]
    """Micro-batches of a block costing more than ``1 + HEAVY_EXCESS`` times its median."""
    if len(cost) == 0:
        return 0
    return int(np.sum(cost > (1.0 + HEAVY_EXCESS) * np.median(cost)))


@njit(cache=True)
def _pool_pair(cost, a, mid, b, dp, out):  # type: ignore[no-untyped-def]
    """Blocks ``a:mid`` and ``mid:b`` of ``out`` re-formed (see :func:`pool_pairs`)."""
    n, size = b - a, mid - a
    h = _heavy_count(cost[a:mid]) + _heavy_count(cost[mid:b])
    if h == 0:
        return
    g = min((-(-h // dp) + 1) * dp, n)  # the heavy groups and one more
    top = np.argsort(-cost[a:b], kind="mergesort")[:g]  # costliest first, ties by position
    pooled = np.zeros(n, dtype=np.bool_)
    pooled[top] = True
    own = int(np.sum(pooled[:size]))
    q = (2 * own + dp) // (2 * dp) * dp  # the first block's share: whole groups, about its own
    q = max(min(q, size, g), g - (n - size))
    first = np.empty(size, dtype=np.int64)
    second = np.empty(n - size, dtype=np.int64)
    flag = np.zeros(n, dtype=np.bool_)  # in the first block
    flag[top[:q]] = True
    need = size - q  # the others, in stream order: the first ones fill the first block
    for i in range(n):
        if not pooled[i] and need > 0:
            flag[i] = True
            need -= 1
    n1 = n2 = 0
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
    stream order inside it) but pools, in each pair of blocks ``(2j, 2j + 1)``, the costliest
    ones: if the pair holds ``h`` heavy micro-batches (costing more than ``1 + HEAVY_EXCESS``
    times their block's median), its ``g = (ceil(h / dp) + 1) * dp`` costliest go, costliest
    first, to the first block in whole groups of ``dp`` (about as many as it held) and the rest
    to the second; the others keep their block except where a block's room for them changed
    (the first ones in stream order fill the first block). A last unpaired block keeps its own.

    Two ranks, blocks of four, one heavy micro-batch in each: the second block's (8, at 6)
    joins the first block's (9, at 1), whose last light one (3) takes its place.

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
