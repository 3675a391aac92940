"""A blend's shares repaired step by step: swaps of like-sized samples between a window's steps.

The cost composer deals each sample of a blend to the step holding least of its source
(:mod:`.window`), which keeps most steps near the weights; a few end a window further off (a
step whose long samples came from one source, a window's last samples too few to even it out).
:func:`repair_shares` then takes each step whose share of some source is more than ``tol`` from
its weight and swaps one of its samples for a sample of about the same length (within
:data:`LENGTH_SLACK`) and another source in another step of the window, the swap that brings the
two steps' shares closest to the weights, until the step is within ``tol`` or the swaps left
help too little (a step a few like-sized swaps cannot even out stays as it is: the search is
bounded, about 2 % of the planning time).

A swap exchanges samples one for one, so every micro-batch keeps its count of samples; it never
lifts a micro-batch over its budget nor a rank's cost above its step's costliest rank, so no
step lasts longer and the balance the deal reached is kept. Samples that need a micro-batch of
their own never move.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.tuning import LENGTH_SLACK, MAX_SWAPS, NEIGHBOURS, PEAK_SLACK


@njit(cache=True, inline="always")
def _dev(held, tot, s, w, c):  # type: ignore[no-untyped-def]
    return held[s, c] / max(tot[s], 1.0) - w[c]


@njit(cache=True)
def _cost(held, tot, s, w):  # type: ignore[no-untyped-def]
    """Sum of squared share deviations of step ``s``."""
    f = 0.0
    for c in range(len(w)):
        d = _dev(held, tot, s, w, c)
        f += d * d
    return f


@njit(cache=True)
def _worst(held, tot, s, w):  # type: ignore[no-untyped-def]
    """The largest distance of step ``s``'s shares from the weights."""
    out = 0.0
    for c in range(len(w)):
        out = max(out, abs(_dev(held, tot, s, w, c)))
    return out


@njit(cache=True)
def _gain(held, tot, w, s, a, x, t, b, y):  # type: ignore[no-untyped-def]
    """How much swapping ``x`` tokens of source ``a`` in step ``s`` for ``y`` of ``b`` in step
    ``t`` lowers the two steps' squared deviations (applied, measured, undone)."""
    before = _cost(held, tot, s, w) + _cost(held, tot, t, w)
    held[s, a] -= x
    held[s, b] += y
    held[t, b] -= y
    held[t, a] += x
    tot[s] += y - x
    tot[t] += x - y
    after = _cost(held, tot, s, w) + _cost(held, tot, t, w)
    held[s, a] += x
    held[s, b] -= y
    held[t, b] += y
    held[t, a] -= x
    tot[s] -= y - x
    tot[t] -= x - y
    return before - after


@njit(cache=True)
def _best_swap(
    i,
    srt,
    rank,
    buf,
    where,
    lens,
    src,
    held,
    tot,
    w,
    bin_tok,
    cap,
    per_step,
    slack,
    load,
    peak,
    k,
    lin,
    quad,
):  # type: ignore[no-untyped-def]
    """The partner of position ``i`` whose swap helps most, among the like-sized samples (within
    ``slack``) next to it in length order, and how much it helps (``-1, 0``: none helps)."""
    x = lens[buf[i]]
    s, a, bi = where[i] // per_step, src[buf[i]], where[i]
    best, gain = -1, 1e-15
    for step in (-1, 1):  # outwards from i in length order, each way while lengths are close
        q = rank[i] + step
        for _ in range(NEIGHBOURS):
            if q < 0 or q >= len(srt):
                break
            j = srt[q]
            q += step
            y = lens[buf[j]]
            if abs(x - y) > slack * max(x, y):
                break
            t, b, bj = where[j] // per_step, src[buf[j]], where[j]
            if t == s or b == a:
                continue
            if bin_tok[bi] - x + y > cap or bin_tok[bj] - y + x > cap:
                continue
            dc = cost(y, lin, quad) - cost(x, lin, quad)  # slot i's cost goes up by dc, j's down
            if load[bi // k] + dc > peak[s] or load[bj // k] - dc > peak[t]:  # peak: with the slack
                continue  # never lengthen a step
            g = _gain(held, tot, w, s, a, x, t, b, y)
            if g > gain:
                best, gain = j, g
    return best, gain


@njit(cache=True)
def repair_shares(buf, m, where, lens, alone, src, w, p, dp, k, cap, tol, lin, quad):  # type: ignore[no-untyped-def]
    """Swap like-sized samples between the window's ``p`` steps until every step's share of
    each source is within ``tol`` of its weight ``w`` (or no swap helps); ``where[:m]`` is each
    window position's micro-batch (-1: it moves on); ``dp`` slots of ``k`` micro-batches a step;
    a sample of ``x`` tokens costs ``lin * x + quad * x^2``."""
    nsrc = len(w)
    per_step = dp * k
    load = np.zeros(p * dp)
    peak = np.zeros(p)
    held = np.zeros((p, nsrc))
    tot = np.zeros(p)
    bin_tok = np.zeros(p * per_step, dtype=np.int64)
    movable = np.zeros(m, dtype=np.bool_)
    for i in range(m):
        if where[i] >= 0:
            x = lens[buf[i]]
            s = where[i] // per_step
            held[s, src[buf[i]]] += x
            tot[s] += x
            bin_tok[where[i]] += x
            load[where[i] // k] += cost(x, lin, quad)
            movable[i] = not alone[buf[i]]
    for r in range(p * dp):
        peak[r // dp] = max(peak[r // dp], load[r] * (1.0 + PEAK_SLACK))
    off = False
    for s in range(p):
        off = off or _worst(held, tot, s, w) > tol
    if not off:  # every step within the tolerance already: nothing to sort
        return
    cand = np.flatnonzero(movable)
    key = np.empty(len(cand), dtype=np.int64)
    for q in range(len(cand)):
        key[q] = lens[buf[cand[q]]]
    srt = cand[np.argsort(key, kind="mergesort")]
    rank = np.full(m, -1, dtype=np.int64)
    for q in range(len(srt)):
        rank[srt[q]] = q
    for s in range(p):
        for slack in LENGTH_SLACK:  # the closest lengths first
            if _worst(held, tot, s, w) <= tol:
                break
            _repair_step(s, cand, srt, rank, buf, where, lens, src, held, tot, w, bin_tok, cap,
                         per_step, tol, slack, load, peak, k, lin, quad)  # fmt: skip


@njit(cache=True)
def _repair_step(
    s,
    cand,
    srt,
    rank,
    buf,
    where,
    lens,
    src,
    held,
    tot,
    w,
    bin_tok,
    cap,
    per_step,
    tol,
    slack,
    load,
    peak,
    k,
    lin,
    quad,
):  # type: ignore[no-untyped-def]
    """Step ``s``'s most helpful swaps within ``slack``, until it is within ``tol``."""
    mine = np.empty(len(cand), dtype=np.int64)
    n = 0
    for i in cand:
        if where[i] // per_step == s:
            mine[n] = i
            n += 1
    for _ in range(MAX_SWAPS):
        if _worst(held, tot, s, w) <= tol:
            return
        best_i, best_j, best_g = -1, -1, 0.0
        enough = 0.5 * _cost(held, tot, s, w)  # a swap that halves the step's error is taken
        for q in range(n):
            i = mine[q]
            j, g = _best_swap(i, srt, rank, buf, where, lens, src, held, tot, w, bin_tok, cap,
                              per_step, slack, load, peak, k, lin, quad)  # fmt: skip
            if j >= 0 and g > best_g:
                best_i, best_j, best_g = i, j, g
                if g >= enough:
                    break
        if best_i < 0 or best_g < 0.02 * enough:
            return  # no swap helps, or too little to reach the tolerance in a few more
        for q in range(n):  # the step's sample i is now j
            if mine[q] == best_i:
                mine[q] = best_j
        _swap(best_i, best_j, buf, where, lens, src, held, tot, bin_tok, per_step, load, k, lin,
              quad)  # fmt: skip


@njit(cache=True)
def _swap(i, j, buf, where, lens, src, held, tot, bin_tok, per_step, load, k, lin, quad):  # type: ignore[no-untyped-def]
    x, y = lens[buf[i]], lens[buf[j]]
    bi, bj = where[i], where[j]
    s, t, a, b = bi // per_step, bj // per_step, src[buf[i]], src[buf[j]]
    held[s, a] -= x
    held[s, b] += y
    held[t, b] -= y
    held[t, a] += x
    tot[s] += y - x
    tot[t] += x - y
    bin_tok[bi] += y - x
    bin_tok[bj] += x - y
    dc = cost(y, lin, quad) - cost(x, lin, quad)
    load[bi // k] += dc
    load[bj // k] -= dc
    where[i], where[j] = bj, bi
