"""Cost-aware composition of shuffled steps: each window's samples dealt to (step, rank) slots.

A shuffled epoch is a permutation cut into windows of ``--shuffle-window`` steps' worth of
tokens (as in :mod:`varpack.plan.kernels.order`). Composing by tokens fills every micro-batch to the
budget, so with attention's quadratic cost a micro-batch holding one long sample costs several
times one of short samples, and at small grad-accum its rank carries it while the others wait.
Composing by cost deals each window to its ``P`` steps x ``dp`` ranks (*slots*, ``grad_accum``
micro-batches each) so that every rank of a step carries the same cost:

1. **heavy samples** (cost above a slot's mean share of the window) are sorted, costliest first,
   and cut into groups of ``dp`` (the last one completed by the next costliest samples): each
   group is the backbone of one step, one sample per rank, so a step holds either none or one
   per rank, of similar cost. The groups are spread evenly over the window's steps;
2. **the rest**, costliest first (samples carried from the last window before all others), are
   dealt to the steps by count in proportion to each step's free tokens (a weighted round
   robin), so every step gets a stratified share of every length range. Inside its step a
   sample goes to the slot with the least cost that has room, into that slot's micro-batch with
   the fewest tokens (longest-processing-time first under the budget): a rank that carries a
   heavy sample gets lighter micro-batches. A sample above ``SMALL`` of a slot's mean share
   does not lift a backbone step above its costliest backbone while another step can take it;
3. a sample that fits nowhere moves on to the next window, where it is placed first; the
   epoch's last window gets as many steps as it needs.

Steps keep the dataset's mix (like the snake of :func:`varpack.plan.kernels.order.snake`) and a
sample trains within about one window of its random position. Pure NumPy in, a numba kernel
(:func:`compose_epoch`) for the sequential part; the packed layout's budget rule
(:func:`varpack.plan.rules.fits`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.order import _sort_by_length
from varpack.plan.rules import PACKED, fits

_CLOSED = np.int64(1) << 62  # tokens of a micro-batch that takes nothing more (oversize alone)
#: A sample costing at most this share of a slot's mean cost goes where the deal says, even
#: above its step's level: small samples keep every step's mix, LPT inside the step levels them.
SMALL = 0.1


@njit(cache=True, inline="always")
def _cost(x, lin, quad):  # type: ignore[no-untyped-def]
    """A sample's cost: ``lin * x + quad * x^2`` (tokens: 1, 0; flops: its two parts)."""
    return lin * x + quad * x * x


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
def _room(x, lone, bin_tok, j, cap):  # type: ignore[no-untyped-def]
    """Does sample ``x`` (``lone``: it needs an empty micro-batch) join micro-batch ``j``?

    ``cap`` (:func:`_cap`): the most tokens a packed micro-batch may hold under the budget rule.
    """
    if lone:
        return bin_tok[j] == 0
    return bin_tok[j] + x <= cap


def _cap(multiple: int, budget: int) -> int:
    """The most real tokens a packed micro-batch holds: the largest ``t`` that
    :func:`varpack.plan.rules.fits` (the total rounded up to ``multiple`` within ``budget``).

    >>> _cap(1, 100), _cap(8, 100), _cap(64, 100)
    (100, 96, 64)
    """
    t = (budget // multiple) * multiple
    assert fits(1, t, t, PACKED, multiple, budget)
    assert not fits(1, t + 1, t + 1, PACKED, multiple, budget)
    return t


@njit(cache=True, inline="always")
def _lightest(s, x, lone, dp, load, bin_tok, least, cap):  # type: ignore[no-untyped-def]
    """The slot of step ``s`` with the least cost that has room for the sample (-1: none)."""
    best = -1
    low = np.inf
    for slot in range(s * dp, s * dp + dp):
        v = load[slot]
        ok = (v < low) & _room(x, lone, bin_tok, least[slot], cap)
        best = slot if ok else best
        low = v if ok else low
    return best


@njit(cache=True, inline="always")
def _choose(x, c, small, lone, due, level, p, dp, load, bin_tok, least, spare, cap):  # type: ignore[no-untyped-def]
    """``(step, slot)`` for the next sample of cost ``c``: the step due first whose lightest
    slot with room stays within the step's level with it; else the step due first with room
    at all; ``slot`` -1 where none has room."""
    top = 0
    low = due[0]
    for s in range(1, p):
        v = due[s]
        top = s if v < low else top
        low = v if v < low else low
    slot = -1
    if lone or _room(x, lone, spare, top, cap):
        slot = _lightest(top, x, lone, dp, load, bin_tok, least, cap)
    if slot >= 0 and (c <= small or load[slot] + c <= level[top]):
        return top, slot  # the common case: small samples go where they are due
    best_s, best = -1, -1  # within its level
    any_s, anyslot = -1, -1  # room only
    for s in range(p):
        if best_s >= 0 and due[s] >= due[best_s]:
            continue
        if not lone and not _room(x, lone, spare, s, cap):
            continue
        slot = _lightest(s, x, lone, dp, load, bin_tok, least, cap)
        if slot < 0:
            continue
        if c <= small or load[slot] + c <= level[s]:
            best_s, best = s, slot
        elif any_s < 0 or due[s] < due[any_s]:
            any_s, anyslot = s, slot
    if best_s >= 0:
        return best_s, best
    return any_s, anyslot


@njit(cache=True, inline="always")
def _place(i, x, lone, c, s, slot, dp, k, where, bin_tok, bin_cnt, load, least, spare):  # type: ignore[no-untyped-def]
    """Sample ``i`` of the window (``x`` tokens, cost ``c``; ``lone``: it needs an empty
    micro-batch) into ``slot`` (of step ``s``): its micro-batch with the fewest tokens."""
    j = least[slot]
    was = bin_tok[j]
    _put(i, x, lone, c, slot, j, where, bin_tok, bin_cnt, load)
    least[slot] = _least(bin_tok, slot * k, k)
    if was == spare[s]:  # the step's emptiest micro-batch filled up a little
        _spare_of(s, dp, spare, bin_tok, least)


@njit(cache=True, inline="always")
def _spare_of(s, dp, spare, bin_tok, least):  # type: ignore[no-untyped-def]
    """``spare[s]``: the fewest tokens in a micro-batch of step ``s``, so that a step none of
    whose slots can take a sample is passed over at once."""
    low = bin_tok[least[s * dp]]
    for slot in range(s * dp + 1, s * dp + dp):
        low = min(low, bin_tok[least[slot]])
    spare[s] = low


@njit(cache=True, inline="always")
def _put(i, x, lone, c, slot, j, where, bin_tok, bin_cnt, load):  # type: ignore[no-untyped-def]
    where[i] = j
    bin_tok[j] = _CLOSED if lone else bin_tok[j] + x
    bin_cnt[j] += 1
    load[slot] += c


@njit(cache=True)
def _donor(order, where, bin_cnt, lo, hi):  # type: ignore[no-untyped-def]
    """The lightest placed sample of a micro-batch in ``lo .. hi`` that holds two or more."""
    for q in range(len(order) - 1, -1, -1):
        b = where[order[q]]
        if lo <= b < hi and bin_cnt[b] >= 2:
            return order[q]
    return -1


@njit(cache=True)
def _fill_empty(order, where, bin_cnt, k):  # type: ignore[no-untyped-def]
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


@njit(cache=True)
def _by_cost(buf, m, lens):  # type: ignore[no-untyped-def]
    """Positions ``0 .. m-1`` of ``buf``, costliest first (every cost grows with the length)."""
    keys = np.empty(m, dtype=np.int64)
    pos = np.empty(m, dtype=np.int64)
    for i in range(m):
        keys[i] = lens[buf[i]]
        pos[i] = i
    _sort_by_length(keys, pos, np.empty(m, np.int64), np.empty(m, np.int64), m)
    return pos[::-1].copy()


@njit(cache=True)
def _compose_window(buf, order, carried, lens, alone, lin, quad, p, dp, k, cap, where):  # type: ignore[no-untyped-def]
    """Deal ``buf[:m]`` to ``p`` steps x ``dp`` slots x ``k`` micro-batches (see module doc).

    ``order``: the window's positions, costliest first; ``buf[:carried]`` moved on from the
    last window and are placed first, so that none waits for more than a window. Writes each sample's micro-batch
    ``(step * dp + slot) * k + j`` to ``where`` (-1: it fits nowhere and moves on). Returns
    False when some micro-batch stays empty.
    """
    m = len(order)
    slots = p * dp
    nbins = slots * k
    total = 0.0
    for i in range(m):
        total += _cost(lens[buf[i]], lin, quad)
    mean = total / slots
    heavy = 0
    while heavy < m and _cost(lens[buf[order[heavy]]], lin, quad) > mean:
        heavy += 1
    groups = (heavy + dp - 1) // dp
    bin_tok = np.zeros(nbins, dtype=np.int64)
    bin_cnt = np.zeros(nbins, dtype=np.int64)
    load = np.zeros(slots)
    where[:m] = -1
    least = np.arange(slots, dtype=np.int64) * k  # each slot's micro-batch with fewest tokens
    spare = np.zeros(p, dtype=np.int64)  # each step's micro-batch with fewest tokens
    lead = min(m, groups * dp)  # the last group is completed by the next costliest samples
    for q in range(lead):  # backbones: one per rank, groups spread evenly over the steps
        i = order[q]
        s = (q // dp) * p // groups
        x = lens[buf[i]]
        c = _cost(x, lin, quad)
        slot = s * dp + q % dp
        _place(i, x, alone[buf[i]], c, s, slot, dp, k, where, bin_tok, bin_cnt, load, least, spare)
    # Each step takes a share of the rest in proportion to its free tokens, dealt costliest
    # first by count (weighted round robin): every step gets a stratified share of every
    # length range, so its mix follows the window's (low mixing).
    room = np.zeros(p)
    for j in range(nbins):
        room[j // (dp * k)] += max(cap - bin_tok[j], 0)
    due = np.full(p, np.inf)  # when each step is next due, in dealt samples
    for s in range(p):
        if room[s] > 0:
            due[s] = 0.5 / room[s]
    level = np.full(p, np.inf)  # a step with backbones: its costliest one; the others none
    for g in range(groups):
        level[(g * p) // groups] = _cost(lens[buf[order[g * dp]]], lin, quad)
    for q in range(lead, 2 * m - lead):  # samples carried from the last window first
        i = order[q if q < m else q - m + lead]
        if (i < carried) != (q < m):
            continue
        x, lone = lens[buf[i]], alone[buf[i]]
        c = _cost(x, lin, quad)
        s, slot = _choose(
            x, c, SMALL * mean, lone, due, level, p, dp, load, bin_tok, least, spare, cap
        )
        if slot >= 0:
            due[s] += 1.0 / room[s]
            _place(i, x, lone, c, s, slot, dp, k, where, bin_tok, bin_cnt, load, least, spare)
    return _fill_empty(order, where[:m], bin_cnt, k)


@njit(cache=True)
def _grow(a, size):  # type: ignore[no-untyped-def]
    """``a`` with room for ``size`` entries (doubling; contents kept)."""
    if size <= len(a):
        return a
    b = np.empty(max(size, 2 * len(a)), dtype=a.dtype)
    b[: len(a)] = a
    return b


@njit(cache=True)
def _emit(buf, order, where, nbins, stream, out, starts, nmb, carry):  # type: ignore[no-untyped-def]
    """Append the placed samples micro-batch by micro-batch (costliest first inside each);
    the others go to ``carry``. Returns the new stream length, micro-batch count, carry count."""
    m = len(order)
    first = np.zeros(nbins + 1, dtype=np.int64)
    nc = 0
    for i in range(m):
        if where[i] >= 0:
            first[where[i] + 1] += 1
        else:
            carry[nc] = buf[i]
            nc += 1
    for j in range(nbins):
        first[j + 1] += first[j]
    for j in range(nbins):
        starts[nmb + j] = out + first[j]
    for q in range(m):
        i = order[q]
        b = where[i]
        if b >= 0:
            stream[out + first[b]] = buf[i]
            first[b] += 1
    return out + first[nbins - 1], nmb + nbins, nc


@njit(cache=True)
def _steps_of(buf, order, carried, lens, alone, lin, quad, p0, last, dp, k, cap, where):  # type: ignore[no-untyped-def]
    """Compose a window into the most steps that leave no micro-batch empty, from ``p0`` down
    (the epoch's last window: the fewest from ``p0`` up that place every sample). 0: none."""
    m = len(order)
    most = m // (dp * k)
    p = min(p0, most)
    while 1 <= p <= most:
        ok = _compose_window(buf, order, carried, lens, alone, lin, quad, p, dp, k, cap, where)
        if ok and not last:
            return p
        if ok and np.all(where[:m] >= 0):
            return p
        p = p + 1 if last else p - 1
    return 0


@njit(cache=True)
def _compose_epoch(lens, alone, lin, quad, window_tok, step_tok, dp, k, cap):  # type: ignore[no-untyped-def]
    """The epoch's stream (positions in the permuted order) and micro-batch starts; ``lens``
    and ``alone`` are in the permuted order, so a window's samples are read in sequence."""
    n = len(lens)
    per_step = dp * k
    total_tok = np.int64(0)
    for i in range(n):
        total_tok += lens[i]
    stream = np.empty(n, dtype=np.int64)
    starts = np.empty(n // 16 + per_step + 1, dtype=np.int64)
    buf = np.empty(0, dtype=np.int64)
    carry = np.empty(0, dtype=np.int64)
    where = np.empty(0, dtype=np.int64)
    out = nmb = nc = 0
    a = 0
    cum = np.int64(0)  # tokens of the permutation before position a
    while a < n or nc > 0:
        b = a
        tot = np.int64(0)
        w = cum // window_tok
        while b < n and (cum + tot) // window_tok == w:
            tot += lens[b]
            b += 1
        if b < n and (total_tok - cum - tot < step_tok or n - b < 2 * per_step):
            while b < n:  # a short tail joins the last window
                tot += lens[b]
                b += 1
        cum += tot
        m = nc + b - a
        buf = _grow(buf, m)
        carry = _grow(carry, m)
        where = _grow(where, m)
        wtok = tot
        for i in range(nc):
            wtok += lens[buf[i]]
        for i in range(a, b):
            buf[nc + i - a] = i
        a = b
        order = _by_cost(buf, m, lens)
        p0 = max(1, np.int64(wtok / step_tok + 0.5))
        last = a >= n
        p = _steps_of(buf, order, nc, lens, alone, lin, quad, p0, last, dp, k, cap, where)
        if p == 0:
            if last:
                return stream, starts[:1], False
            for i in range(m):  # too few samples for a step: all of them wait for the next one
                carry[i] = buf[i]
            nc = m
        else:
            starts = _grow(starts, nmb + p * per_step + 1)
            out, nmb, nc = _emit(
                buf, order, where[:m], p * per_step, stream, out, starts, nmb, carry
            )
        for i in range(nc):
            buf[i] = carry[i]
    starts[nmb] = out
    return stream, starts[: nmb + 1], True


def compose_epoch(
    plens: np.ndarray,
    alone: np.ndarray,
    coeffs: tuple[float, float],
    window_tokens: int,
    step_tokens: int,
    dp: int,
    k: int,
    multiple: int,
    budget: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """One epoch composed by cost: ``(stream, offsets)``, or None where it cannot be.

    ``plens`` and ``alone`` are the samples in the epoch's permuted order (gathered once, so the
    kernel reads windows in sequence); ``stream`` holds positions in that order. ``coeffs``:
    the cost of a sample of ``x`` tokens as ``lin * x + quad * x^2``. Every ``dp * k``
    consecutive micro-batches form a step, and every ``k`` consecutive ones of a step one rank's
    share (a *slot*). None: the last window could not place every sample (too few samples for
    whole steps); the caller composes by tokens instead.
    """
    stream, starts, ok = _compose_epoch(
        np.ascontiguousarray(plens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        float(coeffs[0]),
        float(coeffs[1]),
        np.int64(max(window_tokens, 1)),
        np.int64(max(step_tokens, 1)),
        np.int64(dp),
        np.int64(k),
        np.int64(_cap(multiple, budget)),
    )
    return (stream, starts) if ok else None
