"""One window of the cost composition: its samples dealt to ``p`` steps x ``dp`` slots.

A *slot* is one rank's share of a step, ``k`` (grad-accum) micro-batches. :func:`compose_window`
places a window (see :mod:`varpack.plan.kernels.compose` for the whole algorithm):

1. **backbones**: the heavy samples (:mod:`.heavy`), costliest first, in groups of up to ``dp``
   (one per slot) spread evenly over the steps, or dealt to them in a snake where there are
   more groups than steps (with at most one a step, strided over their costs where that
   levels: :func:`~varpack.plan.kernels.heavy.strided`);
2. **ceilings** (:func:`_ceilings`): a step with backbones lasts at least its costliest slot;
   above the level every slot can still reach filled to its budget a slot only makes the others
   wait. Its ceiling is the larger of the two, raised until the step keeps ``fill`` of its budget
   (``--balance-fill``); the budget a slot leaves empty below it is the compensation, and the
   samples it does not take go to other steps or move on (a stratified share of the rest as
   large as what exceeds the steps' room, :func:`_move_on`, not the lightest);
3. **the deal**: the rest, costliest first (samples carried from the last window first), by
   count in proportion to the tokens each step can take (a weighted round robin, so every step
   gets a stratified share of every length range; in a blend, to the step holding least of the
   sample's source against its share of the step's tokens, so every step keeps the weights),
   each into its step's lightest slot that has room, into that slot's micro-batch with the
   fewest tokens (longest-processing-time first).
   A step without backbones refuses a sample that would lift a slot above both its costliest
   slot and the level its other slots can still reach. A step of backbones whose other slots
   cannot catch up (*hungry*) takes the costliest light samples first (the top
   :data:`HUNGRY_SHARE` of them, a bounded price in mixing). Samples that need a micro-batch of
   their own (more than half the budget) are dealt before the others, so one is still empty;
4. an empty micro-batch takes one sample from a micro-batch of two or more;
5. moves and swaps lower each step's costliest slot (:mod:`.steplevel`; grad-accum 1: :mod:`.level`).

State: ``bin_tok``/``bin_cnt`` tokens and samples of each micro-batch; ``load``/``stok`` cost
and tokens of each slot, ``reach`` the cost it reaches filled at the light density; ``least``
each slot's micro-batch with the fewest tokens; ``spare`` each step's fewest tokens in a
micro-batch (a step none of whose micro-batches can take a sample is passed over at once);
``ceil``, ``peak``, ``due``, ``room`` each step's ceiling, costliest slot, next due position, room.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost, strided
from varpack.plan.kernels.level import level_window
from varpack.plan.kernels.shares import repair_shares
from varpack.plan.kernels.steplevel import level_steps
from varpack.plan.tuning import HUNGRY_SHARE, STEP_MOVES

CLOSED = np.int64(1) << 62  # tokens of a micro-batch that takes nothing more (oversize alone)


@njit(cache=True, inline="always")
def _least(bin_tok, base, k):  # type: ignore[no-untyped-def]
    """Index (in ``base .. base+k``) of the micro-batch with the fewest tokens."""
    best = base
    low = bin_tok[base]
    for j in range(base + 1, base + k):
        v = bin_tok[j]
        best = j if v < low else best
        low = v if v < low else low
    return best


@njit(cache=True, inline="always")
def has_room(x, lone, bin_tok, j, cap):  # type: ignore[no-untyped-def]
    """Does sample ``x`` (``lone``: it needs an empty micro-batch) join micro-batch ``j``?"""
    if lone:
        return bin_tok[j] == 0
    return bin_tok[j] + x <= cap


@njit(cache=True, inline="always")
def _lightest(s, x, lone, dp, load, bin_tok, least, cap):  # type: ignore[no-untyped-def]
    """The slot of step ``s`` with the least cost that has room for the sample (-1: none)."""
    best = -1
    low = np.inf
    for r in range(s * dp, s * dp + dp):
        v = load[r]
        ok = (v < low) & has_room(x, lone, bin_tok, least[r], cap)
        best = r if ok else best
        low = v if ok else low
    return best


@njit(cache=True, inline="always")
def _place(i, x, lone, c, s, r, dp, k, where, bin_tok, bin_cnt, load, stok, least, spare, peak):  # type: ignore[no-untyped-def]
    """Sample ``i`` (``x`` tokens, cost ``c``) into slot ``r`` of step ``s``: into its
    micro-batch with the fewest tokens."""
    j = least[r]
    was = bin_tok[j]
    where[i] = j
    bin_tok[j] = CLOSED if lone else bin_tok[j] + x
    bin_cnt[j] += 1
    load[r] += c
    stok[r] += x
    peak[s] = max(peak[s], load[r])
    least[r] = _least(bin_tok, r * k, k)
    if was == spare[s]:  # the step's emptiest micro-batch filled up a little
        low = bin_tok[least[s * dp]]
        for q in range(s * dp + 1, s * dp + dp):
            low = min(low, bin_tok[least[q]])
        spare[s] = low


@njit(cache=True, inline="always")
def _takes(s, r, c, dp, load, reach, ceil, peak, density):  # type: ignore[no-untyped-def]
    """Does slot ``r`` of step ``s`` take a sample of cost ``c`` (see module doc, 2 and 3)?
    ``reach``: the level each slot can still reach (:func:`_reach`), where ``density`` > 0."""
    after = load[r] + c
    if ceil[s] < np.inf or after <= peak[s] or density <= 0.0:
        return after <= ceil[s]
    for q in range(s * dp, s * dp + dp):  # the level every other slot can still reach
        if q != r and reach[q] < after:
            return False
    return True


@njit(cache=True, inline="always")
def _reach(r, k, cap, load, stok, level):  # type: ignore[no-untyped-def]
    """The cost slot ``r`` reaches filled to its budget at the light samples' ``level`` (kept
    for every slot as it fills: reading it in :func:`_takes` rather than computing it there
    makes the deal 5-7 % quicker)."""
    return load[r] + max(k * cap - stok[r], 0.0) * level


@njit(cache=True, inline="always")
def _choose(x, c, lone, p, dp, cap, bin_tok, load, reach, least, spare, ceil, peak, due, density):  # type: ignore[no-untyped-def]
    """``(step, slot)``: the step due first that takes the sample (``slot`` -1: none does).

    A step at its ceiling refuses every costly sample until the deal reaches lighter ones, and
    stays due first meanwhile (composing one micro-batch per rank, about 40 % of samples): the
    step due next takes nearly all it refuses, so it is tried before the others are scanned.
    (Written out rather than through a helper: numba's inlined copies of one cost 15-20 %.)"""
    t = 0
    low = due[0]
    for s in range(1, p):
        v = due[s]
        t = s if v < low else t
        low = v if v < low else low
    if lone or has_room(x, lone, spare, t, cap):  # the common case: the step due first takes it
        r = _lightest(t, x, lone, dp, load, bin_tok, least, cap)
        if r >= 0 and _takes(t, r, c, dp, load, reach, ceil, peak, density):
            return t, r
    u = -1  # the step due next
    for s in range(p):
        if s != t and (u < 0 or due[s] < due[u]):
            u = s
    if u >= 0 and (lone or has_room(x, lone, spare, u, cap)):
        r = _lightest(u, x, lone, dp, load, bin_tok, least, cap)
        if r >= 0 and _takes(u, r, c, dp, load, reach, ceil, peak, density):
            return u, r
    best_s, best = -1, -1
    for s in range(p):
        if s == t or s == u or (best_s >= 0 and due[s] >= due[best_s]):
            continue
        if not lone and not has_room(x, lone, spare, s, cap):
            continue
        r = _lightest(s, x, lone, dp, load, bin_tok, least, cap)
        if r >= 0 and _takes(s, r, c, dp, load, reach, ceil, peak, density):
            best_s, best = s, r
    return best_s, best


@njit(cache=True)
def _hungry_slot(x, c, lone, p, dp, cap, bin_tok, load, least, spare, ceil, peak, hungry):  # type: ignore[no-untyped-def]
    """``(step, slot)``: the first hungry step's lightest slot below its costliest that takes
    the sample within the ceiling (``slot`` -1: none)."""
    for s in range(p):
        if not hungry[s] or (not lone and not has_room(x, lone, spare, s, cap)):
            continue
        r = _lightest(s, x, lone, dp, load, bin_tok, least, cap)
        if r >= 0 and load[r] < peak[s] and load[r] + c <= ceil[s]:
            return s, r
    return -1, -1


@njit(cache=True)
def _given_up(s, dp, k, cap, load, stok, density, ceil):  # type: ignore[no-untyped-def]
    """Tokens of step ``s``'s free budget that a ceiling keeps empty (at ``density``)."""
    out = 0.0
    for r in range(s * dp, s * dp + dp):
        free = max(k * cap - stok[r], 0.0)
        out += max(free - max(ceil - load[r], 0.0) / density, 0.0)
    return out


@njit(cache=True)
def _ceilings(p, dp, k, cap, load, stok, backbone, density, eps, give):  # type: ignore[no-untyped-def]
    """``(ceil, room, hungry)``: each step's ceiling, the tokens it can take below it, and
    whether its light slots cannot catch up with its costliest."""
    hungry = np.zeros(p, dtype=np.bool_)
    ceil = np.full(p, np.inf)
    rooms = np.zeros(p)
    for s in range(p):
        top = 0.0
        low = np.inf
        most = 0.0
        room = 0.0
        for r in range(s * dp, s * dp + dp):
            free = max(k * cap - stok[r], 0.0)
            room += free
            full = load[r] + free * density
            top = max(top, load[r])
            low = min(low, full)
            most = max(most, full)
        rooms[s] = room
        if not backbone[s]:
            continue
        hungry[s] = low < top
        c = max(top + (k - 1) * eps, low)
        hi = max(c, most)
        if _given_up(s, dp, k, cap, load, stok, density, c) > give:
            for _ in range(50):  # the lowest ceiling that gives up at most `give`
                mid = 0.5 * (c + hi)
                if _given_up(s, dp, k, cap, load, stok, density, mid) <= give:
                    hi = mid
                else:
                    c = mid
            c = hi
        ceil[s] = c
        room = 0.0
        for r in range(s * dp, s * dp + dp):
            free = max(k * cap - stok[r], 0.0)
            room += min(free, max(c - load[r], 0.0) / density)
        rooms[s] = room
    return ceil, rooms, hungry


@njit(cache=True)
def _move_on(order, lo, carried, done, lens, buf, room):  # type: ignore[no-untyped-def]
    """Mark as moved on (``done``) a stratified share of the samples ``order[lo:]`` not yet
    placed, as many tokens as they exceed the steps' ``room``, none carried in. (The deal goes
    costliest first: what finds no room at its end is the window's lightest samples, and they
    crowd the next window's first steps; heavy tail, dp 32, grad-accum 2: mixing 0.21.)"""
    rest = 0.0
    for q in range(lo, len(order)):
        if not done[order[q]]:
            rest += lens[buf[order[q]]]
    total = 0.0
    for s in range(len(room)):
        total += room[s]
    if not rest > total > 0.0:
        return
    share = (rest - total) / rest
    acc = 0.5
    for q in range(lo, len(order)):
        i = order[q]
        if done[i] or i < carried:
            continue
        acc += share
        if acc >= 1.0:
            acc -= 1.0
            done[i] = True


@njit(cache=True)
def _donor(order, where, bin_cnt, lo, hi):  # type: ignore[no-untyped-def]
    """The lightest placed sample of a micro-batch in ``lo .. hi`` that holds two or more."""
    for q in range(len(order) - 1, -1, -1):
        b = where[order[q]]
        if lo <= b < hi and bin_cnt[b] >= 2:
            return order[q]
    return -1


@njit(cache=True)
def fill_empty(order, where, bin_cnt, k):  # type: ignore[no-untyped-def]
    """Give every empty micro-batch one sample from a micro-batch with two or more.

    Preferably from the same slot (its rank's cost does not change), else from any slot of the
    window. Returns False when no micro-batch can spare one.
    """
    nbins = len(bin_cnt)
    for j in range(nbins):
        if bin_cnt[j] > 0:
            continue
        base = (j // k) * k
        donor = _donor(order, where, bin_cnt, base, base + k)
        if donor < 0:
            donor = _donor(order, where, bin_cnt, 0, nbins)
        if donor < 0:
            return False
        bin_cnt[where[donor]] -= 1
        where[donor] = j
        bin_cnt[j] = 1
    return True


@njit(cache=True, inline="always")
def _step_of(g, groups, p):  # type: ignore[no-untyped-def]
    """The step of group ``g`` (costliest first): spread evenly where there are at most ``p``
    groups; else dealt in a snake, so that every step gets groups of every cost, not a run.

    >>> [_step_of(g, 2, 4) for g in range(2)], [_step_of(g, 6, 3) for g in range(6)]
    ([0, 2], [0, 1, 2, 2, 1, 0])
    """
    if groups <= p:
        return g * p // groups
    lap, pos = g // p, g % p
    return pos if lap % 2 == 0 else p - 1 - pos


@njit(cache=True)
def compose_window(
    buf,
    order,
    carried,
    wait,
    group,
    density,
    lens,
    alone,
    lin,
    quad,
    p,
    dp,
    k,
    cap,
    where,
    fill,
    last,
    src,
    wshare,
    tol,
    passes,
):  # type: ignore[no-untyped-def]
    """Deal the window ``buf[:m]`` to ``p`` steps x ``dp`` slots x ``k`` micro-batches.

    A blend (``wshare``: each source's weight; ``src``: each sample's source, by permuted
    position; both empty otherwise) deals the rest to the step that holds least of its
    sample's source against that source's share of the step's tokens, so that every step
    keeps the blend's weights, then swaps like-sized samples between steps until each is
    within ``tol`` of them (:func:`~varpack.plan.kernels.shares.repair_shares`); a plan without
    a blend deals by count.

    ``order``: the window's positions, costliest first, the heavy ones ``order[:h]`` (those
    flagged in ``wait`` move on); ``buf[:carried]`` came from the last window and are dealt
    first; ``density``: the light samples' cost per token; ``fill``: the budget fill a step
    with backbones keeps at least; ``last``: the epoch's last window, which places every sample. Writes each sample's micro-batch ``(step * dp + slot) * k +
    j`` to ``where`` (-1: it moves on). Returns False when some micro-batch stays empty.
    """
    m = len(order)
    slots = p * dp
    bin_tok = np.zeros(slots * k, dtype=np.int64)
    bin_cnt = np.zeros(slots * k, dtype=np.int64)
    load = np.zeros(slots)
    stok = np.zeros(slots)
    least = np.arange(slots, dtype=np.int64) * k
    spare = np.zeros(p, dtype=np.int64)
    peak = np.zeros(p)
    where[:m] = -1
    done = wait[:m].copy()
    backbone = np.zeros(p, dtype=np.bool_)
    h = len(group)
    groups = 0
    for q in range(h):
        groups = max(groups, group[q] + 1)
    give = (1.0 - fill) * dp * k * cap
    group = strided(group, order, h, buf, lens, lin, quad, k, cap, density, p, give)
    members = np.zeros(groups + 1, dtype=np.int64)
    for q in range(h):  # backbones: one per rank, groups spread evenly over the steps
        i = order[q]
        if group[q] < 0:
            continue
        s = _step_of(group[q], groups, p)
        r = s * dp + members[group[q]]
        members[group[q]] += 1
        x = lens[buf[i]]
        if not has_room(x, alone[buf[i]], bin_tok, least[r], cap):
            continue  # more groups than steps: this one is dealt with the rest
        _place(i, x, alone[buf[i]], cost(x, lin, quad), s, r, dp, k, where, bin_tok, bin_cnt,
               load, stok, least, spare, peak)  # fmt: skip
        backbone[s] = True
        done[i] = True
    eps = cost(lens[buf[order[m - 1]]], lin, quad)
    # a cost linear in tokens: every slot reaches the same level; fill 1: never underfill
    level = density if quad > 0 and fill < 1.0 else 0.0
    ceil, room, hungry = _ceilings(p, dp, k, cap, load, stok, backbone, density, eps, give)
    edge = min(m - 1, h + int(HUNGRY_SHARE[min(k, 2) - 1] * (m - h)))
    c_hungry = cost(lens[buf[order[edge]]], lin, quad)
    free = np.full(p, np.inf)  # no ceiling
    due = np.full(p, np.inf)  # when each step is next due, in dealt samples
    for s in range(p):
        if room[s] > 0:
            due[s] = 0.5 / room[s]
    blend = len(wshare) > 0
    nsrc = max(len(wshare), 1)
    held = np.zeros((p, nsrc))  # a blend: each step's tokens of each source, backbones included
    want = np.zeros((p, nsrc))  # ... and what the weights ask of it
    if blend:
        for i in range(m):
            if where[i] >= 0:
                held[(where[i] // k) // dp, src[buf[i]]] += lens[buf[i]]
        for s in range(p):
            tot = room[s] + held[s].sum()
            for c in range(nsrc):
                want[s, c] = max(wshare[c] * tot, 1.0)
    share_due = np.empty(p)
    reach = np.empty(slots)
    for r in range(slots):
        reach[r] = _reach(r, k, cap, load, stok, level)
    big = 0  # samples of more than half a micro-batch need an empty one: they go first
    while big < m and 2 * lens[buf[order[big]]] > cap:
        big += 1
    if not last:
        _move_on(order, big, carried, done, lens, buf, room)
    for phase in range(4):  # the big samples, then the rest; those carried over first in each
        lo, hi = (0, big) if phase < 2 else (big, m)
        for q in range(lo, hi):
            i = order[q]
            if done[i] or (i < carried) != (phase % 2 == 0):
                continue
            x, lone = lens[buf[i]], alone[buf[i]]
            c = cost(x, lin, quad)
            s, r = -1, -1
            if c >= c_hungry:
                s, r = _hungry_slot(x, c, lone, p, dp, cap, bin_tok, load, least, spare, ceil, peak,
                                    hungry)  # fmt: skip
            if r < 0:  # heavy samples dealt with the rest are not refused to stay level
                lv = level if q >= h else 0.0
                step_due = due
                if blend:
                    sc = src[buf[i]]
                    for t in range(p):
                        share_due[t] = (held[t, sc] + 0.5 * x) / want[t, sc]
                    step_due = share_due
                s, r = _choose(x, c, lone, p, dp, cap, bin_tok, load, reach, least, spare, ceil,
                               peak, step_due, lv)  # fmt: skip
            if r < 0 and (last or i < carried):  # last window, or carried in: placed whatever
                s, r = _choose(x, c, lone, p, dp, cap, bin_tok, load, reach, least, spare, free,
                               peak, due, 0.0)  # fmt: skip
            if r >= 0:
                if room[s] > 0:
                    due[s] += 1.0 / room[s]
                if blend:
                    held[s, src[buf[i]]] += x
                _place(i, x, lone, c, s, r, dp, k, where, bin_tok, bin_cnt, load, stok, least, spare,
                       peak)  # fmt: skip
                reach[r] = _reach(r, k, cap, load, stok, level)
    ok = fill_empty(order, where[:m], bin_cnt, k)
    if ok and k == 1 and not blend:  # slots cut by cost later: lower the runs' tops
        level_window(buf, m, where, lens, alone, slots, dp, cap, lin, quad, passes)
    if ok and k > 1 and not blend:  # a step lasts its costliest slot: lower it
        level_steps(buf, m, where, lens, alone, p, dp, k, cap, lin, quad, STEP_MOVES * (passes > 0))
    if ok and blend:
        repair_shares(buf, m, where, lens, alone, src, wshare, p, dp, k, cap, tol, lin, quad)
    return ok
