"""One window composed by the balance engine: its samples dealt to groups of ``dp`` bins.

A *bin* is what one rank carries between two meetings of the ranks: under ``--sync step`` its
share of a step (``kb = grad_accum`` micro-batches), under ``--sync micro`` (and at grad-accum 1)
one micro-batch (``kb = 1``). A *group* is the ``dp`` bins the ranks meet over: a step, or a slot
(``gps = grad_accum`` slots a step). The plan's time is the sum over groups of their costliest
bin, so the engine makes each group's bins cost alike:

1. **heavy samples**: a sample costs more than a bin filled with the window's lighter samples can
   (``bin tokens x their cost per token``): its group's other bins cannot catch it up, so heavy
   samples go ``dp`` to a group, sorted (one per bin, of similar cost). A short last group waits
   for the next window's heavy samples, once;
2. **targets**: a heavy group's bins aim at its costliest; every other bin at the one level
   (``level``) the rest of the window's cost fills;
3. **the deal**: the rest, costliest first, each to the bin furthest below its target that has
   room (in its least-filled micro-batch): every group draws from every cost range in turn, so
   steps mix, and bins end near their targets; what fits nowhere moves on to the next window;
4. **levelling**: in each group, a sample moved (or two swapped) between its costliest and its
   cheapest bin wherever that lowers the group's cost: the objective's exact change.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.engine.fills import add, fills_tree, least, room
from varpack.plan.engine.improve import improve
from varpack.plan.tuning import LEVEL_TOLERANCE, MICRO_COST


@njit(cache=True, inline="always")
def _above(key, a, b, rank):  # type: ignore[no-untyped-def]
    """Bin ``a`` comes before ``b`` in the heap: larger key, then earlier in the deal order,
    which takes one bin of every group in turn (rank 0 of each group, then rank 1, ...), so
    that a run of alike samples spreads over the groups rather than filling one."""
    if key[a] != key[b]:
        return key[a] > key[b]
    return rank[a] < rank[b]


@njit(cache=True)
def _push(heap, n, key, b, rank):  # type: ignore[no-untyped-def]
    i = n
    heap[i] = b
    while i > 0:
        up = (i - 1) // 2
        if not _above(key, heap[i], heap[up], rank):
            break
        heap[i], heap[up] = heap[up], heap[i]
        i = up
    return n + 1


@njit(cache=True)
def _sift(heap, n, key, rank, i):  # type: ignore[no-untyped-def]
    """Move ``heap[i]`` down to its place (its key fell, or it was put at the root)."""
    while True:
        left, best = 2 * i + 1, i
        if left < n and _above(key, heap[left], heap[best], rank):
            best = left
        if left + 1 < n and _above(key, heap[left + 1], heap[best], rank):
            best = left + 1
        if best == i:
            return
        heap[i], heap[best] = heap[best], heap[i]
        i = best


@njit(cache=True)
def _pop(heap, n, key, rank):  # type: ignore[no-untyped-def]
    top = heap[0]
    n -= 1
    heap[0] = heap[n]
    _sift(heap, n, key, rank, 0)
    return top, n


@njit(cache=True)
def _level(load, group_top, heavy_bins, light_cost):  # type: ignore[no-untyped-def]
    """The level every bin outside the heavy groups aims at: the ``x`` at which the cost to
    bring every bin up to ``max(x, its group's top)`` equals ``light_cost``."""
    nb = len(load)
    lo, hi = 0.0, light_cost + 1.0
    for b in range(nb):
        hi = max(hi, group_top[b] + light_cost)
    for _ in range(60):
        x = 0.5 * (lo + hi)
        need = 0.0
        for b in range(nb):
            t = max(x, group_top[b]) if heavy_bins[b] else x
            need += max(0.0, t - load[b])
        if need > light_cost:
            hi = x
        else:
            lo = x
    return lo


@njit(cache=True)
def _regroup(out_bin, load, fill, cnt, p, gps, dp, kb):  # type: ignore[no-untyped-def]
    """Each step's bins renumbered costliest first over its groups (slot ``j`` of step ``s`` is
    group ``j * p + s``), so that each of its slots holds bins of alike cost: of every cut of
    a step into slots, the one of the least time. A step keeps its samples."""
    nb = p * gps * dp
    new = np.empty(nb, dtype=np.int64)
    mine = np.empty(gps * dp, dtype=np.int64)
    for s in range(p):
        for j in range(gps):
            for r in range(dp):
                mine[j * dp + r] = (j * p + s) * dp + r
        by = np.argsort(-load[mine], kind="mergesort")
        for u in range(gps * dp):
            new[mine[by[u]]] = mine[u]
    for i in range(len(out_bin)):
        if out_bin[i] >= 0:
            out_bin[i] = new[out_bin[i]]
    old_load, old_fill, old_cnt = load.copy(), fill.copy(), cnt.copy()
    for b in range(nb):
        load[new[b]] = old_load[b]
        for j in range(kb):
            fill[new[b] * kb + j] = old_fill[b * kb + j]
            cnt[new[b] * kb + j] = old_cnt[b * kb + j]


@njit(cache=True)
def _density(cost, tok, order, cap):  # type: ignore[no-untyped-def]
    """The cost per token of the samples of at most half a micro-batch (the light ones)."""
    ct = 0.0
    xt = 0.0
    for i in range(len(cost)):
        if 2 * tok[i] <= cap:
            ct += cost[i]
            xt += tok[i]
    return ct / xt if xt > 0 else cost[order[0]] / max(tok[order[0]], 1)


@njit(cache=True)
def _heavy(cost, order, held, above, dp, last, wait):  # type: ignore[no-untyped-def]
    """How many of the costliest samples are heavy: those costing more than ``above``, and
    any that waited in the last window, with every costlier one. A short last group waits for
    the next window (``wait``), unless one of it waited already or the window is the last."""
    m = len(order)
    h = 0
    while h < m and cost[order[h]] > above:
        h += 1
    for q in range(h, m):
        if held[order[q]]:
            h = q + 1
    for i in range(m):
        wait[i] = False
    rem = h % dp
    if rem and not last:
        waited = False
        for q in range(h - rem, h):
            waited = waited or held[order[q]]
        if not waited:
            for q in range(h - rem, h):
                wait[order[q]] = True
            h -= rem
    return h


@njit(cache=True)
def _steps(cost, tok, order, wait, h, density, nmax, dp, kb, gps, cap, fill_to):  # type: ignore[no-untyped-def]
    """The window's step counts to try: enough for its tokens (and a micro-batch for each
    sample of over half of one), and enough for the cost of what is not heavy in bins of its
    lighter samples (where such bins must reach the level within their tokens); each at least
    ``nmax``, at most what leaves no micro-batch empty."""
    m = len(order)
    tokens = 0.0
    rest = 0.0
    placed = 0
    big = 0  # samples of over half a micro-batch: one micro-batch each
    for q in range(m):
        i = order[q]
        if not wait[i]:
            tokens += tok[i]
            placed += 1
            big += 2 * tok[i] > cap
            if q >= h:
                rest += cost[i]
    step_tok = dp * kb * gps * cap * fill_to
    by_cost = rest / (step_tok * density) + (-(-h // dp)) / gps
    most = placed // (dp * kb * gps)
    need = max(np.int64(np.ceil(tokens / step_tok)), -(-big // (dp * kb * gps)))
    p_tok = min(max(need, nmax, 1), most)
    p_cost = min(max(np.int64(np.ceil(by_cost)), p_tok), most)
    return p_tok, p_cost


@njit(cache=True)
def compose_window(
    cost, tok, order, held, nmax, dp, kb, gps, cap, fill_to, last, passes, out_bin, out_mb, wait
):  # type: ignore[no-untyped-def]
    """Compose one window of ``m = len(cost)`` samples into groups (see the module doc).

    ``cost``, ``tok``: each sample's cost and tokens (a sample alone in its micro-batch counts
    ``cap``); ``order``: the samples costliest first; ``held``: it waited in the last window;
    ``nmax``: the fewest steps to use (0: no bound); ``fill_to``: the share of the budget the
    step count is sized for; ``last``: the epoch's last window (nothing waits). Writes
    ``out_bin`` / ``out_mb`` (-1: moves on) and ``wait`` (a heavy sample held for the next
    window). Returns the number of steps (0: the window is too small for one step).

    The window is composed at the steps its tokens need and, where its lighter samples' cost
    asks for more, at that count too; the one of lower time over its samples' ideal is kept,
    each micro-batch counted at :data:`~varpack.plan.tuning.MICRO_COST` of a full one (more
    steps only where they gain more than that and :data:`LEVEL_TOLERANCE`)."""
    m = len(cost)
    density = _density(cost, tok, order, cap)
    reach = cap * kb * density
    h, p = _choose(False, cost, tok, order, held, reach, density, nmax, dp, kb, gps, cap, fill_to,
                   last, wait)  # fmt: skip
    wt = np.empty(m, np.bool_)
    hq, q = _choose(True, cost, tok, order, held, reach, density, nmax, dp, kb, gps, cap, fill_to,
                    last, wt)  # fmt: skip
    best, p = _compose_down(p, h, cost, tok, order, dp, kb, gps, cap, passes, out_bin, out_mb,
                            wait)  # fmt: skip
    # each micro-batch a rank runs costs MICRO_COST of a full one: more steps must pay for theirs
    share = 0.0
    for i in range(m):
        share += cost[i] / dp
    per_step = MICRO_COST * cap * density * kb * gps / max(share, 1e-300)
    # more steps are not asked for, or cannot pay for theirs (no time is below the ideal)
    if q <= p or best + p * per_step <= 1.0 + q * per_step:
        return p
    ob, om = np.empty(m, np.int64), np.empty(m, np.int64)
    other, q = _compose_down(q, hq, cost, tok, order, dp, kb, gps, cap, passes, ob, om, wt)
    if q > p and other + q * per_step < (best + p * per_step) * (1.0 - LEVEL_TOLERANCE):
        out_bin[:], out_mb[:], wait[:] = ob, om, wt
        return q
    return p


@njit(cache=True)
def _compose_down(p, h, cost, tok, order, dp, kb, gps, cap, passes, out_bin, out_mb, wait):  # type: ignore[no-untyped-def]
    """``(time over the ideal, steps)`` of the window composed at ``p`` steps, or fewer where
    these leave a micro-batch empty; ``(inf, 0)`` where none will do."""
    while p >= 1:
        t = _compose_at(p, h, cost, tok, order, dp, kb, gps, cap, passes, out_bin, out_mb, wait,
                        LEVEL_TOLERANCE)  # fmt: skip
        if t < np.inf:
            return t, p
        p -= 1
    return np.inf, 0


@njit(cache=True)
def _choose(
    by_cost,
    cost,
    tok,
    order,
    held,
    reach,
    density,
    nmax,
    dp,
    kb,
    gps,
    cap,
    fill_to,
    last,
    wait,
):  # type: ignore[no-untyped-def]
    """``(heavy samples, steps)`` of the window at the steps its tokens need (``by_cost``: or
    more, as its lighter samples' cost asks), the heavy samples those above the level the rest
    fills every bin to at that count (writing ``wait``); 0 steps where none will do."""
    m = len(cost)
    h = _heavy(cost, order, held, reach, dp, last, wait)
    p_tok, p_cost = _steps(cost, tok, order, wait, h, density, nmax, dp, kb, gps, cap, fill_to)
    p = p_cost if by_cost else p_tok
    if p < 1:
        return h, 0
    full = min(-(-h // dp), p * gps)
    rest = 0.0
    for q in range(h, m):
        if not wait[order[q]]:
            rest += cost[order[q]]
    light_bins = (p * gps - full) * dp
    if light_bins > 0:
        h = _heavy(cost, order, held, rest / light_bins, dp, last, wait)
        p_tok, p_cost = _steps(cost, tok, order, wait, h, density, nmax, dp, kb, gps, cap,
                               fill_to)  # fmt: skip
        groups = (h + dp - 1) // dp  # of heavy samples, and the steps they need
        heavy_steps = (groups + gps - 1) // gps
        p = p_cost if by_cost else max(p_tok, min(heavy_steps, p_cost))
        if p < 1:  # what waits would leave a micro-batch empty: none waits
            h = _heavy(cost, order, held, rest / light_bins, dp, True, wait)
            p_tok, p_cost = _steps(cost, tok, order, wait, h, density, nmax, dp, kb, gps, cap,
                                   fill_to)  # fmt: skip
            p = p_cost if by_cost else p_tok
    return h, max(p, 0)


@njit(cache=True)
def _compose_at(p, h, cost, tok, order, dp, kb, gps, cap, passes, out_bin, out_mb, wait, tol):  # type: ignore[no-untyped-def]
    """The window composed into ``p`` steps, its ``h`` costliest samples heavy (writing
    ``out_bin``, ``out_mb``; ``wait`` is given); its time (the sum of its groups' costliest
    bins) over its placed samples' ideal; infinite where a micro-batch is left empty."""
    m = len(cost)
    full = -(-h // dp)
    g_count = p * gps
    full = min(full, g_count)
    nb = g_count * dp
    load = np.zeros(nb)
    fill = np.zeros(nb * kb)
    top = np.zeros(nb)
    heavy_bin = np.zeros(nb, dtype=np.bool_)
    for i in range(m):
        out_bin[i] = -1
        out_mb[i] = -1
    light = 0.0
    hq = 0
    for q in range(m):
        i = order[q]
        if wait[i]:
            continue
        if q < h and hq < full * dp:
            b = hq  # heavy: group hq // dp, one per bin
            hq += 1
            out_bin[i], out_mb[i] = b, 0
            load[b] += cost[i]
            fill[b * kb] += tok[i]
        else:
            light += cost[i]
    for g in range(full):
        t = load[g * dp]
        for r in range(dp):
            top[g * dp + r] = t
            heavy_bin[g * dp + r] = True
    cnt = np.zeros(nb * kb, dtype=np.int64)
    for i in range(m):
        if out_bin[i] >= 0:
            cnt[out_bin[i] * kb + out_mb[i]] += 1
    level = _level(load, top, heavy_bin, light)
    key = np.empty(nb)  # how far each bin is below its target
    for b in range(nb):
        key[b] = (max(level, top[b]) if heavy_bin[b] else level) - load[b]
    rank = np.empty(nb, dtype=np.int64)  # each bin's place in the deal order (see _above)
    for b in range(nb):
        rank[b] = (b % dp) * g_count + b // dp
    heap = np.empty(nb, dtype=np.int64)
    n = 0
    for b in range(nb):
        n = _push(heap, n, key, b, rank)
    # bins without room for the sample at hand are parked, by their room (which only shrinks),
    # and come back once the samples are that short: a sample's search pops only bins that
    # are too full for it (each parked once for them) or the one it goes to
    parked = np.empty(nb, dtype=np.int64)
    free = np.empty(nb)
    npk = 0
    fits_none = cap + 1  # the fewest tokens no micro-batch had room for (room only shrinks)
    tree = fills_tree(fill, kb)
    for q in range(m):
        i = order[q]
        if wait[i] or out_bin[i] >= 0 or tok[i] >= fits_none:
            continue
        while npk > 0 and free[parked[0]] >= tok[i]:
            b, npk = _pop(parked, npk, free, rank)
            n = _push(heap, n, key, b, rank)
        while n > 0:
            b = heap[0]  # the bin furthest below its target (a total order: any heap's first)
            j = room(fill, tree, b, kb, cap, tok[i])
            if j >= 0:
                out_bin[i], out_mb[i] = b, j
                load[b] += cost[i]
                add(fill, tree, b, kb, j, tok[i])
                cnt[b * kb + j] += 1
                key[b] -= cost[i]
                _sift(heap, n, key, rank, 0)
                break
            b, n = _pop(heap, n, key, rank)
            free[b] = cap - fill[b * kb + least(tree, kb, b)]
            npk = _push(parked, npk, free, b, rank)
        if out_bin[i] < 0:
            fits_none = min(fits_none, tok[i])
    if gps > 1:
        _regroup(out_bin, load, fill, cnt, p, gps, dp, kb)
    improve(cost, tok, order, out_bin, out_mb, load, fill, cnt, g_count, dp, kb, cap, passes, tol)
    for e in range(nb * kb):
        if cnt[e] == 0:
            return np.inf
    time = 0.0
    for g in range(g_count):
        t = 0.0
        for b in range(g * dp, g * dp + dp):
            t = max(t, load[b])
        time += t
    ideal = 0.0
    for b in range(nb):
        ideal += load[b]
    return time / max(ideal / dp, 1e-300)


@njit(cache=True)
def compose_steps(cost, tok, order, p, dp, kb, gps, cap, passes, tol, out_bin, out_mb):  # type: ignore[no-untyped-def]
    """Every sample composed into exactly ``p`` steps, nothing waiting (a batch planned in
    memory, each of its steps on its own): the heavy samples and the deal as for a window
    (:func:`compose_window`) at that count, each group levelled to ``tol``. Returns the time
    over the ideal; infinite where a sample fits nowhere or a micro-batch is left empty."""
    m = len(cost)
    held = np.zeros(m, dtype=np.bool_)
    wait = np.zeros(m, dtype=np.bool_)
    density = _density(cost, tok, order, cap)
    h = _heavy(cost, order, held, cap * kb * density, dp, True, wait)
    full = min(-(-h // dp), p * gps)
    rest = 0.0
    for q in range(h, m):
        rest += cost[order[q]]
    light_bins = (p * gps - full) * dp
    if light_bins > 0:
        h = _heavy(cost, order, held, rest / light_bins, dp, True, wait)
    t = _compose_at(p, h, cost, tok, order, dp, kb, gps, cap, passes, out_bin, out_mb, wait, tol)
    for i in range(m):
        if out_bin[i] < 0:
            return np.inf
    return t
