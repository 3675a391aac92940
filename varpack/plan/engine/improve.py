"""The engine's one improvement search: moves and swaps of samples, each judged by its exact
change of the window's time (the sum of its groups' costliest bins).

Round after round, each group's costliest bin tries, for each of its samples:

* a **move** to another bin of the group (where its micro-batches have room and the sample's
  own micro-batch keeps another);
* a **swap** with a cheaper sample of the group, taken near the cost that would level the
  bin with the group's cheapest (the group's samples sorted by cost, a few either side);
* a **trade** with one of its cheaper neighbours in the window's cost order held by another
  group: the two samples have about the same length, so each step keeps its mix of lengths,
  and the trade is taken where it lowers this group more than it raises the other.

The best of them is applied; a group none of them lowers is left. Bins are kept as linked
lists, so a change costs its two samples, and a round costs the costliest bins' samples.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.engine.fills import add, fills_tree, room
from varpack.plan.tuning import TRADE_NEIGHBOURS


@njit(cache=True, inline="always")
def _unlink(i, b, head, nxt, prv):  # type: ignore[no-untyped-def]
    if prv[i] >= 0:
        nxt[prv[i]] = nxt[i]
    else:
        head[b] = nxt[i]
    if nxt[i] >= 0:
        prv[nxt[i]] = prv[i]


@njit(cache=True, inline="always")
def _link(i, b, head, nxt, prv):  # type: ignore[no-untyped-def]
    prv[i] = -1
    nxt[i] = head[b]
    if head[b] >= 0:
        prv[head[b]] = i
    head[b] = i


@njit(cache=True)
def _tops(load, g, dp):  # type: ignore[no-untyped-def]
    """Group ``g``'s costliest bin, the bin after it, the load after that, and its cheapest."""
    hi = g * dp
    for b in range(g * dp, g * dp + dp):
        if load[b] > load[hi]:
            hi = b
    b2 = -1
    for b in range(g * dp, g * dp + dp):
        if b != hi and (b2 < 0 or load[b] > load[b2]):
            b2 = b
    t3 = 0.0
    lo = hi
    for b in range(g * dp, g * dp + dp):
        if b != hi and b != b2 and load[b] > t3:
            t3 = load[b]
        if load[b] < load[lo]:
            lo = b
    return hi, b2, t3, lo


@njit(cache=True)
def _group_top(load, g, dp):  # type: ignore[no-untyped-def]
    t = 0.0
    for b in range(g * dp, g * dp + dp):
        t = max(t, load[b])
    return t


@njit(cache=True)
def _move(i, b, j, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head, nxt, prv):  # type: ignore[no-untyped-def]
    """Sample ``i`` to micro-batch ``j`` of bin ``b``."""
    a = out_bin[i]
    add(fill, tree, a, kb, out_mb[i], -tok[i])
    cnt[a * kb + out_mb[i]] -= 1
    load[a] -= cost[i]
    _unlink(i, a, head, nxt, prv)
    out_bin[i], out_mb[i] = b, j
    add(fill, tree, b, kb, j, tok[i])
    cnt[b * kb + j] += 1
    load[b] += cost[i]
    _link(i, b, head, nxt, prv)


@njit(cache=True)
def _swap(i, k, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head, nxt, prv):  # type: ignore[no-untyped-def]
    """Samples ``i`` and ``k`` trade places (micro-batches included)."""
    a, b = out_bin[i], out_bin[k]
    ja, jb = out_mb[i], out_mb[k]
    _move(i, b, jb, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head, nxt, prv)
    _move(k, a, ja, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head, nxt, prv)


@njit(cache=True)
def _fits_swap(i, k, tok, out_bin, out_mb, fill, kb, cap):  # type: ignore[no-untyped-def]
    ei = out_bin[i] * kb + out_mb[i]
    ek = out_bin[k] * kb + out_mb[k]
    return fill[ei] - tok[i] + tok[k] <= cap and fill[ek] - tok[k] + tok[i] <= cap


@njit(cache=True)
def _cheapest_movable(a, z, cost, out_mb, cnt, kb, head, nxt):  # type: ignore[no-untyped-def]
    """The cheapest sample of bins ``a .. z-1`` whose micro-batch keeps another, or -1."""
    best, bc = -1, 0.0
    for c in range(a, z):
        i = head[c]
        while i >= 0:
            if cnt[c * kb + out_mb[i]] >= 2 and (best < 0 or cost[i] < bc):
                best, bc = i, cost[i]
            i = nxt[i]
    return best


@njit(cache=True)
def fill_empty(cost, tok, out_bin, out_mb, load, fill, tree, cnt, nb, dp, kb, head, nxt, prv):  # type: ignore[no-untyped-def]
    """Give every empty micro-batch one sample: from a fuller micro-batch of its bin (the
    bin's cost is unchanged), else the cheapest movable one of its group, else of any bin."""
    for e in range(nb * kb):
        if cnt[e] > 0:
            continue
        b, g = e // kb, e // kb // dp
        best = _cheapest_movable(b, b + 1, cost, out_mb, cnt, kb, head, nxt)
        if best < 0:
            best = _cheapest_movable(g * dp, g * dp + dp, cost, out_mb, cnt, kb, head, nxt)
        if best < 0:
            best = _cheapest_movable(0, nb, cost, out_mb, cnt, kb, head, nxt)
        if best >= 0:
            _move(best, b, e % kb, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head,
                  nxt, prv)  # fmt: skip


@njit(cache=True)
def _near(gm, a, z, cost, target):  # type: ignore[no-untyped-def]
    """The first place in ``gm[a:z]`` (costliest first) whose cost is at most ``target``."""
    lo, hi = a, z
    while lo < hi:
        mid = (lo + hi) // 2
        if cost[gm[mid]] > target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def improve(cost, tok, order, out_bin, out_mb, load, fill, cnt, groups, dp, kb, cap, passes, tol):  # type: ignore[no-untyped-def]
    """Lower each group's costliest bin (see the module doc); every micro-batch keeps a
    sample and its budget. A group whose costliest bin is within ``tol`` of its bins' mean
    is level enough."""
    m = len(order)
    nb = groups * dp
    head = np.full(nb, -1, dtype=np.int64)
    nxt = np.full(m, -1, dtype=np.int64)
    prv = np.full(m, -1, dtype=np.int64)
    for q in range(m - 1, -1, -1):
        i = order[q]
        if out_bin[i] >= 0:
            _link(i, out_bin[i], head, nxt, prv)
    tree = fills_tree(fill, kb)
    fill_empty(cost, tok, out_bin, out_mb, load, fill, tree, cnt, nb, dp, kb, head, nxt, prv)
    at = np.empty(m, dtype=np.int64)  # each sample's place in the costliest-first order
    gstart = np.zeros(groups + 1, dtype=np.int64)
    for q in range(m):
        at[order[q]] = q
        if out_bin[order[q]] >= 0:
            gstart[out_bin[order[q]] // dp + 1] += 1
    for g in range(groups):
        gstart[g + 1] += gstart[g]
    gm = np.empty(gstart[groups], dtype=np.int64)  # each group's samples, costliest first
    gpos = np.full(m, -1, dtype=np.int64)
    put = gstart[:-1].copy()
    for q in range(m):
        i = order[q]
        if out_bin[i] >= 0:
            g = out_bin[i] // dp
            gm[put[g]] = i
            gpos[i] = put[g]
            put[g] += 1
    top = np.empty(groups)
    for g in range(groups):
        top[g] = _group_top(load, g, dp)
    stuck = np.zeros(groups, dtype=np.bool_)
    for _ in range(passes):
        changed = False
        for g in range(groups):
            if stuck[g]:
                continue
            hi, b2, t3, lo = _tops(load, g, dp)
            mx = load[hi]
            second = load[b2] if b2 >= 0 else 0.0
            mean = 0.0
            for b in range(g * dp, g * dp + dp):
                mean += load[b] / dp
            if mx - mean <= tol * mean:  # level enough: no change pays here
                stuck[g] = True
                continue
            best, bi, bk, bb, bj = 0.0, -1, -1, -1, -1
            i = head[hi]
            while i >= 0:
                if cost[i] <= best:  # no change of it gains more than its cost
                    i = nxt[i]
                    continue
                if cnt[hi * kb + out_mb[i]] >= 2:  # moves
                    for b in range(g * dp, g * dp + dp):
                        if b == hi or load[b] + cost[i] >= mx:
                            continue
                        rest = t3 if b == b2 else second
                        gain = mx - max(mx - cost[i], load[b] + cost[i], rest)
                        if gain > best:
                            j = room(fill, tree, b, kb, cap, tok[i])
                            if j >= 0:
                                best, bi, bk, bb, bj = gain, i, -1, b, j
                # swaps inside the group, near the cost that levels hi with lo
                target = cost[i] - 0.5 * (mx - load[lo])
                c = _near(gm, gstart[g], gstart[g + 1], cost, target)
                for u in range(max(gstart[g], c - TRADE_NEIGHBOURS),
                               min(gstart[g + 1], c + TRADE_NEIGHBOURS)):  # fmt: skip
                    k = gm[u]
                    b = out_bin[k]
                    d = cost[i] - cost[k]
                    if b == hi or d <= 0.0 or load[b] + d >= mx:
                        continue
                    rest = t3 if b == b2 else second
                    gain = mx - max(mx - d, load[b] + d, rest)
                    if gain > best and _fits_swap(i, k, tok, out_bin, out_mb, fill, kb, cap):
                        best, bi, bk, bb, bj = gain, i, k, b, -1
                for d_ in range(1, TRADE_NEIGHBOURS + 1):  # trades with other groups
                    q = at[i] + d_
                    if q >= m:
                        break
                    k = order[q]
                    b = out_bin[k]
                    if b < 0 or b // dp == g:
                        continue
                    d = cost[i] - cost[k]
                    if d <= 0.0:
                        continue
                    h = b // dp
                    gain = (mx - max(mx - d, second)) - max(0.0, load[b] + d - top[h])
                    if gain > best and _fits_swap(i, k, tok, out_bin, out_mb, fill, kb, cap):
                        best, bi, bk, bb, bj = gain, i, k, b, -1
                i = nxt[i]
            # nothing lowers it; or, where a bin is one micro-batch, by less than the
            # tolerance: the slot cut after the window sorts its micro-batches anew, and such
            # rounds were most of a plan's time under --sync micro (2 M samples 1.08 -> 0.47 s)
            if bi < 0 or best <= (tol * mean if kb == 1 else 0.0):
                stuck[g] = True
                continue
            if bk < 0:
                _move(
                    bi,
                    bb,
                    bj,
                    cost,
                    tok,
                    out_bin,
                    out_mb,
                    load,
                    fill,
                    tree,
                    cnt,
                    kb,
                    head,
                    nxt,
                    prv,
                )
            else:
                h = bb // dp
                _swap(bi, bk, cost, tok, out_bin, out_mb, load, fill, tree, cnt, kb, head, nxt, prv)
                if h != g:  # each keeps the other's place in its group's cost order
                    pi, pk = gpos[bi], gpos[bk]
                    gm[pi], gm[pk] = bk, bi
                    gpos[bi], gpos[bk] = pk, pi
                    top[h] = _group_top(load, h, dp)
                    stuck[h] = False
            top[g] = _group_top(load, g, dp)
            changed = True
        if not changed:
            return
