"""Sorted runs of long samples, one run per step: the least waiting a window's ranks must leave.

Used by the per-plan bound (:mod:`varpack.plan.figures.bound`), which needs the least idle over
every grouping of a window's long samples into steps. A run's step lasts at least its first (costliest) sample's cost, plus
``k - 1`` micro-batches of at least ``eps`` on that rank; its ranks without a long sample carry at
most ``full[n]`` (``n`` such ranks, filled with the costliest light tokens, :func:`phi`), and with
``k = 1`` a rank with one carries at most ``beside[i]`` (the sample and the rest of its budget so
filled). Grouping the long samples into sorted runs is optimal for this relaxation (swapping two
samples out of order never lowers it), so a DP over run boundaries finds the least idle.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def phi(tok, top, low_tok, low_top, t):  # type: ignore[no-untyped-def]
    """The most ``sum(x^2)`` of light samples with ``sum(x) <= t``: the longest first, each bin
    at its top length (``tok``/``top``: bins longest first; ``low_tok`` tokens at ``low_top``).

    >>> phi(np.array([10.0, 20.0]), np.array([5.0, 2.0]), 0.0, 0.0, 15.0)
    60.0
    """
    out = 0.0
    left = t
    for b in range(len(tok)):
        if left <= 0:
            return out
        use = min(left, tok[b])
        out += use * top[b]
        left -= use
    return out + max(min(left, low_tok), 0.0) * low_top


@njit(cache=True)
def capacities(c_long, x_long, tok, top, low_tok, low_top, dp, k, cap, lin, quad):  # type: ignore[no-untyped-def]
    """``(full, beside)``: the most cost ``n`` ranks without a long sample carry (``full[n]``),
    and with ``k = 1`` the most long sample ``i``'s micro-batch carries (``beside[i]``)."""
    full = np.empty(dp + 1)
    for n in range(dp + 1):
        full[n] = lin * n * k * cap + quad * phi(tok, top, low_tok, low_top, n * k * cap)
    beside = np.zeros(len(c_long))
    if k == 1:
        for i in range(len(c_long)):
            room = max(cap - x_long[i], 0.0)
            beside[i] = c_long[i] + lin * room + quad * phi(tok, top, low_tok, low_top, room)
    return full, beside


@njit(cache=True)
def runs(c_long, full, beside, eps, dp, k, most):  # type: ignore[no-untyped-def]
    """``(idle, start)``: the least idle over groupings of the long samples (costliest first)
    into sorted runs of at most ``most``, and where the run of the best grouping that ends at
    ``j`` starts (``start[j + 1]``).

    Two ranks, costs 9, 9 and 5, a rank without a long sample carrying 2: the 9s make a step
    (no wait), the 5 a step whose other rank waits 5 - 2 (pairing 9 with 5 would wait more):

    >>> c = np.array([9.0, 9.0, 5.0])
    >>> idle, start = runs(c, np.array([0.0, 2.0, 4.0]), c, 0.0, 2, 1, 2)
    >>> float(idle), start.tolist()
    (3.0, [0, 0, 0, 2])
    """
    h = len(c_long)
    best = np.full(h + 1, np.inf)
    start = np.zeros(h + 1, dtype=np.int64)
    best[0] = 0.0
    for i in range(h):
        t = c_long[i] + (k - 1) * eps
        own = 0.0
        for j in range(i, min(h, i + most)):
            if k == 1:
                own += max(t - beside[j], 0.0)
            n = max(dp - (j - i + 1), 0)
            idle = best[i] + own + max(n * t - full[n], 0.0)
            if idle < best[j + 1]:
                best[j + 1] = idle
                start[j + 1] = i
    return best[h], start


@njit(cache=True)
def pooled(c_long, x_long, tok, top, low_tok, low_top, dp, cap, lin, quad):  # type: ignore[no-untyped-def]
    """The least idle of the long samples' steps at ``K = 1`` when their light samples come from
    one pool: :func:`runs` fills every rank from the costliest light tokens on its own, so two
    ranks may count the same ones; here they share them.

    With ``m`` steps holding the long samples (``x_long``, costs ``c_long``, costliest first),
    their ranks wait ``dp * (sum of the steps' costliest) - sum(c_long)`` less the light cost
    they carry, which is at most the pool's costliest tokens that fit their free budget
    (``m * dp * cap - sum(x_long)``). The least sum of the steps' costliest long samples over
    groupings into ``m`` steps of at most ``dp`` is reached by sorted runs, each as long as the
    ones after it still get a sample: the step maxima at ``min(i * dp, h - m + i)``.

    Two ranks, costs 9, 9 and 5, no light samples: two steps (9+9, 5 beside nothing) wait 5.

    >>> c = np.array([9.0, 9.0, 5.0]); z = np.zeros(0)
    >>> float(pooled(c, np.array([3.0, 3.0, 2.0]), z, z, 0.0, 0.0, 2, 4.0, 0.0, 1.0))
    5.0
    """
    h = len(c_long)
    if h == 0:
        return 0.0
    pre = np.zeros(h + 1)
    for i in range(h):
        pre[i + 1] = pre[i] + c_long[i]
    xs = 0.0
    for i in range(h):
        xs += x_long[i]
    pool = low_tok
    for b in range(len(tok)):
        pool += tok[b]
    best = np.inf
    for m in range(-(-h // dp), h + 1):
        a = m if dp == 1 else min(m, (h - m) // (dp - 1) + 1)  # maxima at i * dp for i < a
        tops = pre[h] - pre[h - m + a]
        for i in range(a):
            tops += c_long[i * dp]
        free = m * dp * cap - xs
        light = lin * min(free, pool) + quad * phi(tok, top, low_tok, low_top, free)
        best = min(best, dp * tops - pre[h] - light)
        if free >= pool:  # more steps only add waiting: the pool is spent
            break
    return max(best, 0.0)
