"""Heavy samples of a composition window: which they are, and which wait for the next window.

A sample is *heavy* when the rank that holds it cannot be levelled by giving the others more
of the window's other samples: its cost exceeds what its tokens would cost at the window's
light density by more than :data:`HEAVY_EXCESS` of a full micro-batch (or it needs a
micro-batch of its own: more than half the budget). Heavy samples are placed first, in groups of
up to ``dp`` of similar cost (one per rank of a step), so that a step holds none of them or one on
every rank (:mod:`varpack.plan.kernels.window`). A group that would stay short waits for the next
window's heavy samples (:func:`grouping`), once: a short group is what leaves ranks idle at small
grad-accum.

Pure numba over a window's positions ``buf`` (into the epoch's permuted lengths) and ``order``
(the window's positions, costliest first).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.tuning import GROUP_RATIO, HEAVY_EXCESS


@njit(cache=True, inline="always")
def cost(x, lin, quad):  # type: ignore[no-untyped-def]
    """A sample's cost: ``lin * x + quad * x^2`` (tokens: 1, 0; flops: its two parts)."""
    return lin * x + quad * x * x


@njit(cache=True)
def heavy_prefix(buf, order, lens, lin, quad, cap, held, k=1):  # type: ignore[no-untyped-def]
    """``(h, density)``: the window's heavy samples are ``order[:h]``; ``density`` is the mean
    cost per token of its samples of at most half a micro-batch (``cap`` tokens).

    A sample that waited in the last window (``held``) stays heavy here, with every costlier one.
    At grad-accum ``k`` 1 a sample of more than half a micro-batch is heavy by that alone (its
    rank's only micro-batch); from 2 up only by its cost: its rank's other micro-batches level
    it, and a step need not hold one on every rank (dealt with the rest, such samples spread
    over the steps like every length range).

    >>> lens = np.array([100, 100, 100, 100, 2100])
    >>> buf = np.arange(5); order = np.array([4, 0, 1, 2, 3])
    >>> held = np.zeros(5, np.bool_)
    >>> heavy_prefix(buf, order, lens, 1.0, 1e-5, 4000, held)
    (1, 1.001)
    >>> heavy_prefix(buf, order, lens, 1.0, 1e-5, 4000, held, 2)
    (0, 1.001)
    """
    m = len(order)
    ct = 0.0
    xt = 0.0
    for i in range(m):
        x = lens[buf[i]]
        if 2 * x <= cap:
            ct += cost(x, lin, quad)
            xt += x
    density = ct / xt if xt > 0 else cost(cap, lin, quad) / cap
    lim = HEAVY_EXCESS * cap * density
    h = 0
    while h < m:  # a sample of more than half a micro-batch needs one of its own: first too
        x = lens[buf[order[h]]]
        if cost(x, lin, quad) - x * density <= lim and (2 * x <= cap or k > 1):
            break
        h += 1
    for q in range(h, m):
        if held[buf[order[q]]]:
            h = q + 1
    return h, density


@njit(cache=True)
def grouping(order, carried, h, dp, defer, lens, buf, lin, quad):  # type: ignore[no-untyped-def]
    """The group of each heavy sample (``order[:h]``, costliest first), or -1 if it waits.

    Groups are sorted runs of at most ``dp``, cut early where a sample costs less than
    :data:`GROUP_RATIO` of its group's first (a group of similar costs balances; a step holding
    one very long sample and a few shorter heavy ones does not). With ``defer`` (not the
    epoch's last window) a short group waits for the next window's heavy samples, unless one of
    its samples came from the last window (``order`` values below ``carried``): none waits twice.

    >>> lens = np.array([100, 90, 80, 10]); order = np.arange(4)
    >>> grouping(order, 0, 4, 2, True, lens, order, 1.0, 0.0).tolist()
    [0, 0, -1, -1]
    """
    group = np.full(h, -1, dtype=np.int64)
    q = 0
    g = 0
    while q < h:
        top = cost(lens[buf[order[q]]], lin, quad)
        end = q + 1
        while (
            end < h and end - q < dp and cost(lens[buf[order[end]]], lin, quad) >= GROUP_RATIO * top
        ):
            end += 1
        held_over = False
        for r in range(q, end):
            held_over = held_over or order[r] < carried
        if end - q == dp or not defer or held_over:
            for r in range(q, end):
                group[r] = g
            g += 1
        q = end
    return group


@njit(cache=True)
def strided(group, order, h, buf, lens, lin, quad, k, cap, density, p, give):  # type: ignore[no-untyped-def]
    """The groups dealt across their cost range: the ``j``-th grouped heavy sample (costliest
    first) joins group ``j % G``, where that levels (else ``group`` as it is).

    Sorted groups level a step best, but with at most one group a step (``G <= p``) every step
    then holds one narrow band of the heavy lengths, and mixing suffers (RL rollouts at
    grad-accum 2: 0.16). From grad-accum 2 up a rank holding a lighter heavy sample takes more
    of the light ones. A strided group levels where its lightest member's slot, filled to its
    budget, reaches its costliest member's cost with room to spare, and where the budget its
    slots leave empty to meet that lightest slot's level (each member's cost above its tokens
    at the light ``density``, less the lightest member's) is at most ``give``, the fill a step
    may give up (``--balance-fill``; none with ``--pp``). Where one group does not, all stay
    sorted.

    >>> g = np.array([0, 0, 1, 1]); lens = np.array([40, 30, 20, 10]); o = np.arange(4)
    >>> strided(g, o, 4, o, lens, 1.0, 0.01, 2, 100, 1.0, 2, 50.0).tolist()
    [0, 1, 0, 1]
    >>> strided(g, o, 4, o, lens, 1.0, 0.01, 2, 100, 1.0, 2, 0.0).tolist()  # nothing to give
    [0, 0, 1, 1]
    >>> strided(g, o, 4, o, lens, 1.0, 0.01, 1, 100, 1.0, 2, 50.0).tolist()  # grad-accum 1
    [0, 0, 1, 1]
    """
    groups = 0
    for q in range(h):
        groups = max(groups, group[q] + 1)
    if k < 2 or groups < 2 or groups > p:
        return group
    out = group.copy()
    hi = np.zeros(groups, dtype=np.int64)
    lo = np.full(groups, np.int64(1) << 40)
    excess = np.zeros(groups)  # each group's cost above its tokens at the light density
    size = np.zeros(groups)
    j = 0
    for q in range(h):
        if group[q] < 0:
            continue
        g = j % groups
        j += 1
        out[q] = g
        x = lens[buf[order[q]]]
        hi[g] = max(hi[g], x)
        lo[g] = min(lo[g], x)
        excess[g] += cost(x, lin, quad) - x * density
        size[g] += 1
    for g in range(groups):
        if cost(hi[g], lin, quad) > cost(lo[g], lin, quad) + (k * cap - hi[g]) * density:
            return group
        base = cost(lo[g], lin, quad) - lo[g] * density
        if (excess[g] - size[g] * base) / density > give:
            return group
    return out
