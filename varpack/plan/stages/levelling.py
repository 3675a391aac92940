"""Curriculum steps levelled by cost: micro-batches ordered by cost inside windows of steps.

A curriculum packs the sorted stream into micro-batches and cuts consecutive runs of
``dp x grad_accum`` of them into steps. With attention's quadratic cost the micro-batches are
not in cost order where the number of samples per micro-batch changes: two samples of 8 K
tokens cost more than one of 8.2 K after them, and at grad-accum 1 (one micro-batch per rank) a
step mixing both waits on the pair. Ordering each window of ``--shuffle-window`` steps' micro-
batches by cost (stable: ties keep the stream order) puts micro-batches of like cost into the
same step; a micro-batch moves by less than one window, so the steps still walk from short to
long samples. Micro-batches move whole: what the packer made (budget, split pieces kept apart)
stays as it was.

Applied to curriculum plans scored by ``flops`` or ``time``: under ``tokens`` the micro-batches
of a sorted stream already cost alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.inputs import frozen


def levels(cost_kind: str, order: str) -> bool:
    """Does a plan level its curriculum steps by cost?

    >>> levels("flops", "curriculum"), levels("tokens", "curriculum"), levels("flops", "shuffle")
    (True, False, False)
    """
    return order == "curriculum" and cost_kind in ("flops", "time")


def by_cost_in_windows(
    idx: np.ndarray, off: np.ndarray, lens: np.ndarray, cost: np.ndarray, window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(idx, off, lens)`` with the micro-batches (``idx[off[j]:off[j+1]]``, costing ``cost[j]``)
    in cost order inside each run of ``window`` micro-batches.

    >>> idx, off, lens = np.arange(5), np.array([0, 2, 3, 5]), np.array([4, 4, 9, 3, 3])
    >>> i, o, v = by_cost_in_windows(idx, off, lens, np.array([8.0, 9, 6]), 2)  # in order
    >>> i.tolist(), o.tolist(), v.tolist()
    ([0, 1, 2, 3, 4], [0, 2, 3, 5], [4, 4, 9, 3, 3])
    >>> i, o, v = by_cost_in_windows(idx, off, lens, np.array([9.0, 8, 6]), 2)  # 1st pair swaps
    >>> i.tolist(), o.tolist(), v.tolist()
    ([2, 0, 1, 3, 4], [0, 1, 3, 5], [9, 4, 4, 3, 3])
    """
    return _reorder(
        frozen(idx),
        frozen(off, np.int64),
        frozen(lens),
        frozen(cost, np.float64),
        np.int64(max(window, 1)),
    )


@njit(cache=True)
def _reorder(idx, off, lens, cost, window):  # type: ignore[no-untyped-def]
    m = len(off) - 1
    new_idx = np.empty_like(idx)
    new_lens = np.empty_like(lens)
    new_off = np.empty(m + 1, dtype=np.int64)
    new_off[0] = off[0]
    out = off[0]
    for a in range(0, m, window):
        b = min(a + window, m)
        order = np.argsort(cost[a:b], kind="mergesort")  # stable: ties keep the stream order
        for t in range(b - a):
            j = a + order[t]
            for q in range(off[j], off[j + 1]):
                new_idx[out] = idx[q]
                new_lens[out] = lens[q]
                out += 1
            new_off[a + t + 1] = out
    return new_idx, new_off, new_lens
