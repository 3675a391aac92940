"""Cost-composed steps in the padded layout: windows cut into bands, bands dealt to steps by cost.

In the padded layout a micro-batch is ``B`` rows padded to its longest, so its samples must be of
similar length (a *band* of a window sorted by length) or padding eats the compute. A step is
then made of bands, and its ranks balance only if its bands cost alike. :func:`band_items` cuts
each sorted window into *items* (``m`` micro-batches of one shape each: one micro-batch, or with
``--pp`` a rank's whole pipeline step) and, where a rank holds one item per step (grad-accum 1,
or ``--pp``), caps an item's rows so that it costs no more than the window's median band filled
to the budget (attention makes a band of long rows cost more per token): the ranks of a step
then cost alike whatever their lengths, at the price of fewer tokens in long bands, bounded by
``--balance-fill``. An item whose single row costs more than that is *heavy*.
:func:`deal_band_items` deals a window's items to its steps: heavy items in groups of ``dp`` (one
per rank of a step, spread evenly), the rest in a snake over the window's length order, so that
every step holds bands of every length (low mixing) and ``per_step`` items; what does not make a
whole step moves on to the next window.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.tuning import HEAVY_EXCESS


@njit(cache=True, inline="always")
def _rows(t, budget, c_cap, lin, quad, fill):  # type: ignore[no-untyped-def]
    """Rows of an item's micro-batch at padded length ``t``: the budget's, capped at cost
    ``c_cap`` (at least ``fill`` of the budget's rows, and one)."""
    full = max(budget // t, 1)
    capped = np.int64(c_cap / cost(t, lin, quad)) if c_cap < np.inf else full
    keep = np.int64(np.ceil(fill * full))
    return max(1, min(full, max(capped, keep)))


@njit(cache=True)
def _reference(elens, a, b, budget, lin, quad):  # type: ignore[no-untyped-def]
    """A full micro-batch's cost at the window's token-weighted median length (its samples of
    at most half the budget; sorted ascending)."""
    total = 0.0
    for i in range(a, b):
        if 2 * elens[i] <= budget:
            total += elens[i]
    half = 0.5 * total
    acc = 0.0
    t = elens[a]
    for i in range(a, b):
        if 2 * elens[i] > budget:
            break
        acc += elens[i]
        t = elens[i]
        if acc >= half:
            break
    return budget * cost(t, lin, quad) / t


@njit(cache=True)
def band_items(elens, bounds, m, budget, lin, quad, capped, fill, slot_items):  # type: ignore[no-untyped-def]
    """``(starts, item_cost, heavy)``: each window ``bounds[w]:bounds[w+1]`` of ``elens``
    (effective lengths, sorted ascending in each window) cut into items of ``m`` micro-batches
    of one shape; with ``capped`` each micro-batch's rows are capped by cost (see module doc).
    An item is heavy when it costs more than a full median band, ``max(m, slot_items / 2)``
    times (``slot_items``: a rank's items per step; longest-processing-time first levels
    items up to about half a rank's share).

    An item takes consecutive samples while they fit ``m`` micro-batches of ``rows`` rows at its
    longest length; a window's last item may be short, so item boundaries are shifted left until
    every item holds at least ``m`` samples (one per micro-batch), as for pipeline groups. Where
    a window cannot, ``starts`` is ``[0]`` (the caller plans otherwise).

    >>> starts, c, heavy = band_items(np.array([1, 1, 1, 1, 4]), np.array([0, 5]), 1, 4, 1.0,
    ...                               0.0, False, 0.0, 1)
    >>> starts.tolist(), heavy.tolist()
    ([0, 4, 5], [False, False])
    """
    n = len(elens)
    starts = np.empty(n + 1, dtype=np.int64)
    g = 0
    for w in range(len(bounds) - 1):
        a, b = bounds[w], bounds[w + 1]
        if a == b:
            continue
        ref = _reference(elens, a, b, budget, lin, quad)
        c_cap = ref if capped else np.inf
        first = g
        i = a
        while i < b:
            starts[g] = i
            g += 1
            t = elens[i]
            cnt = 1
            i += 1
            while i < b and cnt + 1 <= m * _rows(max(t, elens[i]), budget, c_cap, lin, quad, fill):
                t = max(t, elens[i])
                cnt += 1
                i += 1
        nxt = b
        for j in range(g - 1, first - 1, -1):  # every item holds at least m samples
            if starts[j] > nxt - m:
                starts[j] = nxt - m
            nxt = starts[j]
        if starts[first] < a:  # the window cannot give every item m samples
            return starts[:1].copy(), np.empty(0), np.zeros(0, dtype=np.bool_)
    starts[g] = n
    starts = starts[: g + 1].copy()
    item_cost = np.empty(g)
    heavy = np.zeros(g, dtype=np.bool_)
    for j in range(g):
        t = elens[starts[j + 1] - 1]
        cnt = starts[j + 1] - starts[j]
        rows = -(-cnt // m)
        item_cost[j] = m * rows * cost(t, lin, quad)
    for w in range(len(bounds) - 1):
        a, b = bounds[w], bounds[w + 1]
        if a == b:
            continue
        ref = _reference(elens, a, b, budget, lin, quad)
        lo = np.searchsorted(starts[:-1], a)
        hi = np.searchsorted(starts[:-1], b)
        for j in range(lo, hi):
            heavy[j] = item_cost[j] > (1.0 + HEAVY_EXCESS) * max(m, slot_items / 2) * ref
    return starts, item_cost, heavy


@njit(cache=True, inline="always")
def _contains(a, v):  # type: ignore[no-untyped-def]
    for x in a:
        if x == v:
            return True
    return False


@njit(cache=True)
def _waiting_items(items, hv, held, dp, defer):  # type: ignore[no-untyped-def]
    """Positions (in ``items``) of the heavy items that wait for the next window: all of them
    when they are fewer than ``dp`` (a step holding one heavy item leaves its other ranks
    waiting; together with the next window's they may make a group), never one that waited
    already, none in the last window. A window with ``dp`` or more deals its remainder with
    the light items instead: measured, that balances better than holding it back."""
    h = len(hv)
    if not defer or h == 0 or h >= dp:
        return np.empty(0, dtype=np.int64)
    own = 0
    for q in hv:
        own += 0 if held[items[q]] else 1
    if h < dp and own < h:
        return np.empty(0, dtype=np.int64)  # some waited already: place them all now
    left = h % dp if h >= dp else h
    out = np.empty(left, dtype=np.int64)
    n = 0
    for q in hv[::-1]:  # hv is costliest first: the lightest wait
        if n < left and not held[items[q]]:
            out[n] = q
            n += 1
    return out[:n]


@njit(cache=True)
def deal_band_items(starts, bounds, heavy, item_cost, per_step, dp):  # type: ignore[no-untyped-def]
    """The items in step order: each window's items (plus those carried from the last one)
    dealt to its ``P = len // per_step`` steps, ``per_step`` each (see module doc); the rest move
    on; the epoch's last window gets as many steps as its items need (the last may be short).
    Returns item indices, consecutive ``per_step`` forming a step.

    >>> deal_band_items(np.array([0, 1, 2, 3, 4]), np.array([0, 4]), np.zeros(4, np.bool_),
    ...                 np.ones(4), 2, 2).tolist()
    [0, 3, 1, 2]
    """
    g = len(starts) - 1
    out = np.empty(g, dtype=np.int64)
    held = np.zeros(g, dtype=np.bool_)  # heavy items that waited for the next window
    no = 0
    carry = np.empty(g, dtype=np.int64)
    nc = 0
    item_win = np.searchsorted(bounds, starts[:-1], side="right") - 1
    nw = len(bounds) - 1
    j = 0
    for w in range(nw):
        lo = j
        while j < g and item_win[j] == w:
            j += 1
        last = w == nw - 1
        items = np.concatenate((carry[:nc], np.arange(lo, j)))
        nc = 0
        n = len(items)
        hv = np.flatnonzero(heavy[items])  # costliest first: a group of dp costs alike
        hv = hv[np.argsort(-item_cost[items[hv]], kind="mergesort")]
        wait = _waiting_items(items, hv, held, dp, not last and per_step == dp)
        p = (n - len(wait)) // per_step if not last else -(-n // per_step)
        if p == 0:
            carry[:n] = items
            nc = n
            continue
        take = min(n - len(wait), p * per_step)
        step = np.full(n, -1, dtype=np.int64)
        fill = np.zeros(p, dtype=np.int64)
        groups = -(-(len(hv) - len(wait)) // dp)
        placed = 0
        gi = 0
        for qh in hv:  # heavy items: groups of dp, spread evenly; a lone few wait a window
            if _contains(wait, qh):
                step[qh] = -2
                continue
            s = (gi // dp) * p // groups if groups <= p else (gi // dp) % p
            gi += 1
            if fill[s] < per_step and placed < take:
                step[qh] = s
                fill[s] += 1
                placed += 1
        r = 0  # the rest in a snake over the window's length order; the longest of them that
        for q in range(n):  # do not make a whole step move on (so short groups of heavy ones wait)
            if step[q] != -1:
                continue
            if placed >= take:
                break
            while True:
                lap, pos = r // p, r % p
                s = pos if lap % 2 == 0 else p - 1 - pos
                r += 1
                if fill[s] < per_step:
                    step[q] = s
                    fill[s] += 1
                    placed += 1
                    break
        first = np.zeros(p + 1, dtype=np.int64)  # counting sort of the items by step
        for q in range(n):
            if step[q] >= 0:
                first[step[q] + 1] += 1
        for s in range(p):
            first[s + 1] += first[s]
        for q in range(n):
            held[items[q]] = step[q] == -2  # a heavy item waits once
            if step[q] >= 0:
                out[no + first[step[q]]] = items[q]
                first[step[q]] += 1
            else:
                carry[nc] = items[q]
                nc += 1
        no += placed
    return out[:no]
