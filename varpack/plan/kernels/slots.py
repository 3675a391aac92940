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
"""

from __future__ import annotations

import numpy as np

from varpack.plan.kernels.order import snake
from varpack.plan.segments import gather_positions


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


def move_micro(
    idx: np.ndarray, starts: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(idx, starts)`` of a stream cut into micro-batches at ``starts``, the micro-batches
    moved into ``order``.

    >>> idx, starts = move_micro(np.arange(5), np.array([0, 1, 3, 5]), np.array([2, 0, 1]))
    >>> idx.tolist(), starts.tolist()
    ([3, 4, 0, 1, 2], [0, 2, 3, 5])
    """
    pos, new_starts = gather_positions(starts[:-1][order], np.diff(starts)[order])
    return idx[pos], new_starts
