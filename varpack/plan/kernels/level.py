"""Levelling a composed window's slots by swaps (grad-accum 1, ``--sync micro``).

A window composed one slot (``dp`` micro-batches) at a time is later cut into slots by cost
(:mod:`.slots`): its micro-batches sorted, costliest first, in runs of ``dp``. Its time is then
the sum of every ``dp``-th cost in that order (each run waits on its first). Where micro-batches
hold a few chunky samples (lengths up to half the budget: bimodal lengths at 128 K, documents,
RL rollouts), the deal leaves some runs with one micro-batch well above the rest of its run,
and no deal order fixes that. :func:`level_window` lowers such a *top* by moving one of its
samples to another micro-batch, or swapping it for a shorter one there, where the other
micro-batch stays at most its own run's top (so no other run waits longer): each move lowers
the window's time, checked exactly. Bounded work: only windows of few samples per micro-batch,
and at most :data:`PASSES` passes over the runs' tops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.tuning import LEVEL_BINS, LEVEL_SAMPLES, WIDE_BINS, WIDE_PASSES


@njit(cache=True)
def slot_cut_time(c, dp):  # type: ignore[no-untyped-def]
    """Sum of every ``dp``-th cost, costliest first: the runs' waits."""
    s = np.sort(c)[::-1]
    out = 0.0
    for j in range(0, len(s), dp):
        out += s[j]
    return out


@njit(cache=True)
def _tops(c, dp):  # type: ignore[no-untyped-def]
    """``(order, lim)``: micro-batches costliest first; each one's run top (its own for a top)."""
    order = np.argsort(-c, kind="mergesort")
    lim = np.empty(len(c))
    for q in range(len(c)):
        lim[order[q]] = c[order[(q // dp) * dp]]
    return order, lim


@njit(cache=True)
def _best(a, need, buf, m, where, lens, alone, closed, c, tk, cnt, lim, top, cap, cw):  # type: ignore[no-untyped-def]
    """``(gain, s, t, b)``: the move of sample ``s`` out of top ``a`` (into ``b``, swapped for
    ``t``; -1: a plain move) that lowers ``a`` most, up to ``need``, while ``b`` stays at most
    its run's top; ties to the smaller change (``cw``: the samples' costs, computed once)."""
    best, bs, bt, bb, bd = 0.0, -1, -1, -1, np.inf
    for s in range(m):
        xs = lens[buf[s]]
        if where[s] != a or alone[buf[s]] or 2 * xs > cap:
            continue
        cs = cw[s]
        if cnt[a] > 1:  # a plain move leaves a micro-batch behind
            for b in range(len(c)):
                if b == a or top[b] or closed[b] or tk[b] + xs > cap or cs > lim[b] - c[b]:
                    continue
                g = min(cs, need)
                if g > best or (g == best and cs < bd):
                    best, bs, bt, bb, bd = g, s, -1, b, cs
        for t in range(m):
            b = where[t]
            if b < 0 or b == a or top[b]:
                continue
            d = cs - cw[t]  # the cost is monotone in length: d > 0 is a shorter sample
            if d <= 0.0 or d > lim[b] - c[b] or alone[buf[t]] or tk[b] - lens[buf[t]] + xs > cap:
                continue
            g = min(d, need)
            if g > best or (g == best and d < bd):
                best, bs, bt, bb, bd = g, s, t, b, d
    return best, bs, bt, bb


@njit(cache=True)
def _shift(i, frm, to, x, c_i, where, c, tk, cnt):  # type: ignore[no-untyped-def]
    where[i] = to
    c[frm] -= c_i
    c[to] += c_i
    tk[frm] -= x
    tk[to] += x
    cnt[frm] -= 1
    cnt[to] += 1


@njit(cache=True)
def level_window(buf, m, where, lens, alone, nbins, dp, cap, lin, quad, passes):  # type: ignore[no-untyped-def]
    """Lower the runs' tops of a window composed at grad-accum 1 (``where[:m]``: each sample's
    micro-batch, ``nbins`` of them; -1: moved on) by moves and swaps that lower its time, in at
    most ``passes`` passes (0: not levelled)."""
    if passes <= 0 or dp < 2 or quad <= 0 or m > LEVEL_SAMPLES * nbins or nbins > WIDE_BINS:
        return
    if nbins > LEVEL_BINS:
        passes = min(passes, WIDE_PASSES)
    c = np.zeros(nbins)
    tk = np.zeros(nbins, dtype=np.int64)
    cnt = np.zeros(nbins, dtype=np.int64)
    closed = np.zeros(nbins, dtype=np.bool_)
    cw = np.empty(m)
    for i in range(m):
        cw[i] = cost(lens[buf[i]], lin, quad)
        b = where[i]
        if b >= 0:
            x = lens[buf[i]]
            c[b] += cw[i]
            tk[b] += x
            cnt[b] += 1
            closed[b] = closed[b] or alone[buf[i]]
    order, lim = _tops(c, dp)
    top = np.zeros(nbins, dtype=np.bool_)
    before = 0.0
    stale = True  # the costs changed since the tops were sorted (only a kept move does that)
    for _ in range(passes):
        moved = False
        for g in range(0, nbins - 1, dp):
            if stale:
                order, lim = _tops(c, dp)
                top[:] = False
                before = 0.0  # the window's time: as slot_cut_time, from the same sorted costs
                for q in range(0, nbins, dp):
                    top[order[q]] = True
                    before += c[order[q]]
                stale = False
            a = order[g]
            need = c[a] - c[order[g + 1]] if g + 1 < nbins else 0.0
            if need <= 1e-9 * c[a]:
                continue
            gain, s, t, b = _best(a, need, buf, m, where, lens, alone, closed, c, tk, cnt, lim,
                                  top, cap, cw)  # fmt: skip
            if gain <= 1e-9 * c[a]:
                continue
            keep = (c[a], c[b], tk[a], tk[b], cnt[a], cnt[b])
            xs, xt = lens[buf[s]], lens[buf[t]] if t >= 0 else 0
            _shift(s, a, b, xs, cw[s], where, c, tk, cnt)
            if t >= 0:
                _shift(t, b, a, xt, cw[t], where, c, tk, cnt)
            if slot_cut_time(c, dp) < before * (1.0 - 1e-12):
                moved = stale = True
                continue
            where[s] = a  # no better after all (the top fell past other runs): undo
            if t >= 0:
                where[t] = b
            c[a], c[b], tk[a], tk[b], cnt[a], cnt[b] = keep
        if not moved:
            return
