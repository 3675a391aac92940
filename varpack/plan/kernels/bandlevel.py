"""Levelling a block's bands by moving rows (padded layout, slots cut by cost).

In the padded layout a micro-batch (a *band*) is ``rows`` rows padded to its longest, and costs
``rows * cost(pad)``. A block's bands are cut into slots by cost (:mod:`.slots`): sorted,
costliest first, in runs of ``dp``, each run waiting on its first, so the block's time is the
sum of every ``dp``-th cost in that order. Bands cut from a sorted window cost unalike (a band
of a few long rows cannot be topped up with short ones), and the runs wait on that spread.
:func:`level_bands` lowers a run's *top* by moving one of its rows to another band of the same
block whose padded length (nearly) covers it, or by swapping its longest row for another band's
shortest (the top's padding falls, the other band's often stays), where the other band stays at
most its own run's top, within the budget, and the two bands' padded volume does not grow
(padding never rises). Each move lowers the block's time, checked exactly; rows never leave their block, so the shuffle window's bound and mixing are those of
the bands. Work per pass is linear in the block's bands and rows, and at most :data:`BAND_PASSES`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.kernels.level import slot_cut_time


@njit(cache=True)
def _stats(q, buf, where, e, m, out):  # type: ignore[no-untyped-def]
    """Band ``q``'s rows, longest, its count, second longest, shortest (and that row)."""
    rows, mx, n_mx, sec, mn, at = 0, 0, 0, 0, np.iinfo(np.int64).max, -1
    for i in range(m):
        if where[i] != q:
            continue
        x = e[buf[i]]
        rows += 1
        if x > mx:
            sec, mx, n_mx = mx, x, 1
        elif x == mx:
            n_mx += 1
        elif x > sec:
            sec = x
        if x < mn or at < 0:
            mn, at = x, i
    out[q, 0], out[q, 1], out[q, 2], out[q, 3], out[q, 4], out[q, 5] = rows, mx, n_mx, sec, mn, at


@njit(cache=True, inline="always")
def _pad_without_longest(st):  # type: ignore[no-untyped-def]
    """A band's padded length once one of its longest rows left it."""
    return st[1] if st[2] > 1 else st[3]


@njit(cache=True)
def _candidate(a, b, kind, st, c, budget, lin, quad):  # type: ignore[no-untyped-def]
    """``(new cost of a, new cost of b)`` of move ``kind`` (0: a's shortest row to b, 1: a's
    longest row to b, 2: a's longest row swapped for b's shortest); ``(-1, -1)`` where the move
    is not allowed (a band left empty, the budget exceeded, nothing gained)."""
    ra, rb = st[a, 0], st[b, 0]
    if kind == 2:
        x, y = st[a, 1], st[b, 4]
        if st[a, 2] > 1 or y >= x:
            return -1.0, -1.0
        pa = max(st[a, 3], y)
        pb = max(st[b, 1] if rb > 1 else 0, x)
        if rb * pb > budget or ra * pa + rb * pb > ra * st[a, 1] + rb * st[b, 1]:
            return -1.0, -1.0
        return ra * cost(pa, lin, quad), rb * cost(pb, lin, quad)
    if ra < 2:
        return -1.0, -1.0
    x = st[a, 4] if kind == 0 else st[a, 1]
    pa = _pad_without_longest(st[a]) if kind == 1 else st[a, 1]
    pb = max(st[b, 1], x)
    if (rb + 1) * pb > budget or (ra - 1) * pa + (rb + 1) * pb > ra * st[a, 1] + rb * st[b, 1]:
        return -1.0, -1.0
    return (ra - 1) * cost(pa, lin, quad), (rb + 1) * cost(pb, lin, quad)


@njit(cache=True)
def _row_of(a, kind, st, buf, where, e, m):  # type: ignore[no-untyped-def]
    """The row (position in ``buf``) that move ``kind`` takes out of band ``a``."""
    if kind == 0:
        return st[a, 5]
    for i in range(m):
        if where[i] == a and e[buf[i]] == st[a, 1]:
            return i
    return -1


@njit(cache=True)
def _level_block(buf, where, e, nb, dp, budget, lin, quad, passes):  # type: ignore[no-untyped-def]
    """One block: ``where[i]`` (band of row ``buf[i]``, ``nb`` bands) changed by moves."""
    m = len(buf)
    st = np.zeros((nb, 6), dtype=np.int64)
    c = np.zeros(nb)
    for q in range(nb):
        _stats(q, buf, where, e, m, st)
        c[q] = st[q, 0] * cost(st[q, 1], lin, quad)
    for _ in range(passes):
        moved = False
        for g in range(0, nb - 1, dp):
            order = np.argsort(-c, kind="mergesort")
            lim = np.empty(nb)
            for q in range(nb):
                lim[order[q]] = c[order[(q // dp) * dp]]
            a = order[g]
            need = c[a] - (c[order[g + 1]] if g + 1 < nb else 0.0)
            best, bb, bk, bna, bnb = 1e-9 * c[a], -1, -1, 0.0, 0.0
            for b in range(nb):
                if b == a:
                    continue
                for kind in range(3):
                    na, nbc = _candidate(a, b, kind, st, c, budget, lin, quad)
                    if na < 0 or nbc > lim[b] * (1.0 + 1e-12):
                        continue
                    gain = min(c[a] - na, need)
                    if gain > best:
                        best, bb, bk, bna, bnb = gain, b, kind, na, nbc
            if bb < 0:
                continue
            before = slot_cut_time(c, dp)
            ca, cb = c[a], c[bb]
            c[a], c[bb] = bna, bnb
            if slot_cut_time(c, dp) >= before * (1.0 - 1e-12):
                c[a], c[bb] = ca, cb  # the top fell past other runs: no better after all
                continue
            s = _row_of(a, bk, st, buf, where, e, m)
            where[s] = bb
            if bk == 2:
                where[st[bb, 5]] = a
            _stats(a, buf, where, e, m, st)
            _stats(bb, buf, where, e, m, st)
            moved = True
        if not moved:
            return


@njit(cache=True)
def level_bands(e, starts, order, size, dp, budget, lin, quad, passes):  # type: ignore[no-untyped-def]
    """Each stream position's band after levelling every block of ``size`` bands of ``order``
    (the bands, ``starts`` their offsets into the stream of effective lengths ``e``; see the
    module doc); ``passes`` 0 or ``dp`` 1: the bands as they are.

    Two ranks, one block of four bands costing 1, 18, 25 and 75 (``x^2`` a row): the band of
    three rows of 5 gives one to the band of one, so the top run waits on 50 instead of 75.

    >>> level_bands(np.array([1, 3, 3, 5, 5, 5, 5]), np.array([0, 1, 3, 4, 7]),
    ...             np.arange(4), 4, 2, 100, 0.0, 1.0, 8).tolist()
    [0, 1, 1, 2, 2, 3, 3]
    """
    band = np.empty(len(e), dtype=np.int64)
    for q in range(len(starts) - 1):
        band[starts[q] : starts[q + 1]] = q
    if passes <= 0 or dp < 2:
        return band
    for a in range(0, len(order), size):
        blk = order[a : a + size]
        m = 0
        for q in blk:
            m += starts[q + 1] - starts[q]
        buf = np.empty(m, dtype=np.int64)
        where = np.empty(m, dtype=np.int64)
        n = 0
        for j in range(len(blk)):
            for i in range(starts[blk[j]], starts[blk[j] + 1]):
                buf[n], where[n] = i, j
                n += 1
        _level_block(buf, where, e, len(blk), dp, budget, lin, quad, passes)
        for i in range(m):
            band[buf[i]] = blk[where[i]]
    return band


@njit(cache=True)
def group_by_band(band, nb):  # type: ignore[no-untyped-def]
    """``(perm, starts)``: the stream positions grouped by ``band`` (``nb`` bands, each keeping
    its rows in stream order) and the bands' new offsets (a counting sort).

    >>> perm, starts = group_by_band(np.array([0, 1, 1, 0, 2]), 3)
    >>> perm.tolist(), starts.tolist()
    ([0, 3, 1, 2, 4], [0, 2, 4, 5])
    """
    starts = np.zeros(nb + 1, dtype=np.int64)
    for q in band:
        starts[q + 1] += 1
    for q in range(nb):
        starts[q + 1] += starts[q]
    fill = starts[:-1].copy()
    perm = np.empty(len(band), dtype=np.int64)
    for i in range(len(band)):
        perm[fill[band[i]]] = i
        fill[band[i]] += 1
    return perm, starts
