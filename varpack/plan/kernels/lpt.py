"""A window dealt window-wide, longest-processing-time first (grad-accum 1, no blend).

At grad-accum 1 a window's micro-batches are later cut into slots by cost (:mod:`.slots`):
sorted, in runs of ``dp``. Where a micro-batch's cost follows what it holds (RL rollouts: a
quarter of the responses cut at a generation cap), the composer's micro-batches spread in cost
by what they hold, so each sorted run holds alike samples and a step's length mix drifts from
the dataset's. :func:`lpt_window` deals the window's samples, costliest first, each to the least
loaded of all its micro-batches that has room: every micro-batch then lands near the window's
mean cost whatever it holds, and a run of ``dp`` of them mixes. The caller keeps whichever of
the two compositions has the lower slot time (:func:`window_time`), so windows where it does
not pay (most samples short beside a few long ones) keep the composer's.
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.kernels.level import level_window, slot_cut_time
from varpack.plan.kernels.window import CLOSED, fill_empty, has_room
from varpack.plan.tuning import LEVEL_BINS, LEVEL_SAMPLES


@njit(cache=True)
def lpt_window(buf, order, wait, lens, alone, lin, quad, nbins, cap, where, last):  # type: ignore[no-untyped-def]
    """Deal ``buf[:m]`` (``order``: costliest first) to ``nbins`` micro-batches, each sample to
    the least loaded one with room (a sample that needs a micro-batch of its own: to an empty
    one; the first of a tie). Samples flagged in ``wait``, and those that fit nowhere, move on
    (``where`` -1). Returns False when a micro-batch stays empty or, in the epoch's ``last``
    window, a sample would move on. The micro-batches wait in a heap by load: those without
    room for a sample are set aside for it and put back (a micro-batch of a lone sample, for
    good), so a sample costs about ``log(nbins)``, not ``nbins``."""
    m = len(order)
    load = np.zeros(nbins)
    tok = np.zeros(nbins, dtype=np.int64)
    cnt = np.zeros(nbins, dtype=np.int64)
    heap = [(0.0, j) for j in range(nbins)]  # (load, micro-batch): equal loads, in order
    aside = np.empty(nbins, dtype=np.int64)
    where[:m] = -1
    for q in range(m):
        i = order[q]
        if wait[i]:
            continue
        x, lone = lens[buf[i]], alone[buf[i]]
        best, na = -1, 0
        while len(heap) > 0:
            j = heapq.heappop(heap)[1]
            if has_room(x, lone, tok, j, cap):
                best = j
                break
            if tok[j] != CLOSED:
                aside[na] = j
                na += 1
        for t in range(na):
            heapq.heappush(heap, (load[aside[t]], aside[t]))
        if best < 0:
            if last:
                return False
            continue
        where[i] = best
        load[best] += cost(x, lin, quad)
        tok[best] = CLOSED if lone else tok[best] + x
        cnt[best] += 1
        if not lone:
            heapq.heappush(heap, (load[best], best))
    return fill_empty(order, where[:m], cnt, 1)


@njit(cache=True)
def window_time(buf, m, where, lens, nbins, dp, lin, quad):  # type: ignore[no-untyped-def]
    """The window's slot time over its placed cost (``where[:m]``: each sample's micro-batch):
    the sum of every ``dp``-th micro-batch cost, costliest first, as the slot cut makes it, per
    unit of cost placed (so a composition that moves more on is not favoured for it)."""
    c = np.zeros(nbins)
    placed = 0.0
    for i in range(m):
        if where[i] >= 0:
            v = cost(lens[buf[i]], lin, quad)
            c[where[i]] += v
            placed += v
    return slot_cut_time(c, dp) / placed if placed > 0 else np.inf


@njit(cache=True)
def mix_window(buf, order, wait, lens, alone, lin, quad, nbins, dp, cap, where, last, passes):  # type: ignore[no-untyped-def]
    """Replace the composer's ``where[:m]`` by the window-wide deal (:func:`lpt_window`, its
    runs' tops then lowered as the composer's are) where that has the lower slot time (True).
    Only windows of few samples per micro-batch and at most ``LEVEL_BINS`` micro-batches, those
    the composer's are levelled in fully (the deal's work is about the samples times the
    micro-batches)."""
    m = len(order)
    if m > LEVEL_SAMPLES * nbins or nbins > LEVEL_BINS:
        return False
    other = np.empty(m, dtype=np.int64)
    if not lpt_window(buf, order, wait, lens, alone, lin, quad, nbins, cap, other, last):
        return False
    # levelled as fully as the composer's: the swaps also bring alike costs into one bucket of
    # the slot cut (RL rollouts, dp 16: mixing 0.220 unlevelled, 0.203 at 32 passes, 0.193 at
    # 128, for 1.2-1.3x the plan time at grad-accum 1)
    level_window(buf, m, other, lens, alone, nbins, dp, cap, lin, quad, passes)
    mine = window_time(buf, m, where, lens, nbins, dp, lin, quad)
    if window_time(buf, m, other, lens, nbins, dp, lin, quad) >= mine:
        return False
    where[:m] = other
    return True
