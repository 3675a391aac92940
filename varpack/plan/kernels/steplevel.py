"""Levelling a composed window's steps by moves and swaps (grad-accum > 1, ``--sync step``).

Under ``--sync step`` (DDP ``no_sync``, Megatron) a step lasts its costliest rank's sum over
its ``grad_accum`` micro-batches. The deal (:mod:`.window`) fills each rank to a level with
whole samples, and where a rank holds a few chunky samples (RL rollouts: ten samples of
1-12 K tokens) the last one it took leaves it up to a sample's cost above the others: every
step about 1 % above its ideal, however many steps. :func:`level_steps` lowers each step's
costliest rank by moving one of its samples to the lightest rank of the step that can take
some of its work (into that rank's emptiest micro-batch with room), or by swapping it for a
cheaper sample there, the move that lowers the pair's higher sum most. Every move is checked
exactly on the two sums, so a step's time never rises, and samples stay in their step (mixing
and the shuffle window are untouched). Micro-batch counts and the budget hold; a sample that
must train alone never moves and no micro-batch is emptied. :func:`level_slots` does the same
for slots of ``dp`` micro-batches that meet (``--sync micro``, ``plan_batch``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost
from varpack.plan.tuning import LEVEL, STEP_MOVES


@njit(cache=True)
def _by_step(where, m, p, dp, k):  # type: ignore[no-untyped-def]
    """``(first, members)``: the window's placed samples grouped by step (``members`` from
    ``first[s]`` to ``first[s + 1]``), in window order inside each step."""
    first = np.zeros(p + 1, dtype=np.int64)
    for i in range(m):
        if where[i] >= 0:
            first[where[i] // (dp * k) + 1] += 1
    for s in range(p):
        first[s + 1] += first[s]
    fill = first[:-1].copy()
    members = np.empty(first[p], dtype=np.int64)
    for i in range(m):
        if where[i] >= 0:
            s = where[i] // (dp * k)
            members[fill[s]] = i
            fill[s] += 1
    return first, members


@njit(cache=True)
def _emptiest(r, k, x, tk, closed, cap):  # type: ignore[no-untyped-def]
    """Rank slot ``r``'s micro-batch of fewest tokens that can take ``x`` more (-1: none)."""
    best = -1
    for j in range(r * k, r * k + k):
        if not closed[j] and tk[j] + x <= cap and (best < 0 or tk[j] < tk[best]):
            best = j
    return best


@njit(cache=True)
def _by_rank(mem, where, k, lo, dp, alone):  # type: ignore[no-untyped-def]
    """``(out, first)``: the samples of ``mem`` that may move, by rank slot (``lo + r``'s from
    ``first[r]`` to ``first[r + 1]``)."""
    first = np.zeros(dp + 1, dtype=np.int64)
    for s in mem:
        if not alone[s]:
            first[where[s] // k - lo + 1] += 1
    for r in range(dp):
        first[r + 1] += first[r]
    at = first[:-1].copy()
    out = np.empty(first[dp], dtype=np.int64)
    for s in mem:
        if not alone[s]:
            r = where[s] // k - lo
            out[at[r]] = s
            at[r] += 1
    return out, first


@njit(cache=True)
def _best_move(ina, inb, a, b, k, where, lens, cw, load, tk, cnt, closed, cap):  # type: ignore[no-untyped-def]
    """``(new, s, t, j)``: the move of sample ``s`` of ``ina`` from rank slot ``a`` to ``b``
    (into micro-batch ``j``; ``t`` -1) or its swap for ``t`` of ``inb`` that makes the pair's
    higher sum ``new`` least (``new`` is ``load[a]`` where nothing lowers it)."""
    best, bs, bt, bj = load[a], -1, -1, -1
    for s in ina:
        cs, xs, own = cw[s], lens[s], where[s]
        if cnt[own] > 1:  # a plain move leaves a micro-batch behind
            new = max(load[a] - cs, load[b] + cs)
            if new < best:
                j = _emptiest(b, k, xs, tk, closed, cap)
                if j >= 0:
                    best, bs, bt, bj = new, s, -1, j
        for t in inb:
            d = cs - cw[t]  # the cost grows with the length: d > 0 is a shorter sample
            if d <= 0.0:
                continue
            new = max(load[a] - d, load[b] + d)
            if new < best and tk[where[t]] - lens[t] + xs <= cap:
                best, bs, bt, bj = new, s, t, where[t]
    return best, bs, bt, bj


@njit(cache=True)
def level_steps(buf, m, where, lens, alone, p, dp, k, cap, lin, quad, moves):  # type: ignore[no-untyped-def]
    """Lower each step's costliest rank of a window composed at grad-accum ``k`` (``where[:m]``:
    each sample's micro-batch ``(step * dp + rank) * k + j``, -1: moved on) by at most
    ``moves`` moves or swaps a step (0: not levelled). At ``k`` 1 a "step" is a slot of ``dp``
    micro-batches that meet (``--sync micro``): its costliest micro-batch is lowered."""
    if moves <= 0 or dp < 2 or quad <= 0:
        return
    nb = p * dp * k
    tk = np.zeros(nb, dtype=np.int64)
    cnt = np.zeros(nb, dtype=np.int64)
    closed = np.zeros(nb, dtype=np.bool_)
    load = np.zeros(p * dp)
    x = np.empty(m, dtype=np.int64)  # the window's samples' lengths, costs and alone flags
    cw = np.empty(m)
    lone = np.empty(m, dtype=np.bool_)
    for i in range(m):
        x[i] = lens[buf[i]]
        cw[i] = cost(x[i], lin, quad)
        lone[i] = alone[buf[i]]
        b = where[i]
        if b >= 0:
            tk[b] += x[i]
            cnt[b] += 1
            closed[b] = closed[b] or lone[i]
            load[b // k] += cw[i]
    first, members = _by_step(where, m, p, dp, k)
    for s in range(p):
        mem = members[first[s] : first[s + 1]]
        lo = s * dp
        level = load[lo : lo + dp].mean() * (1.0 + LEVEL)  # moves keep the step's total
        for _ in range(moves):
            a = lo + np.argmax(load[lo : lo + dp])
            if load[a] <= level:
                break
            out, at = _by_rank(mem, where, k, lo, dp, lone)
            ina = out[at[a - lo] : at[a - lo + 1]]
            i = -1
            for b in lo + np.argsort(load[lo : lo + dp], kind="mergesort")[: dp - 1]:
                if b == a:  # all tied: nothing lowers the top
                    break
                inb = out[at[b - lo] : at[b - lo + 1]]
                new, i, t, j = _best_move(ina, inb, a, b, k, where, x, cw, load, tk, cnt, closed,
                                          cap)  # fmt: skip
                if i >= 0 and new < load[a] * (1.0 - 1e-12):
                    break  # the lightest rank that can take some of the top's work
                i = -1
            if i < 0:
                break
            d = cw[i] - (cw[t] if t >= 0 else 0.0)
            dx = x[i] - (x[t] if t >= 0 else 0)
            own = where[i]
            load[a] -= d
            load[b] += d
            tk[own] -= dx
            tk[j] += dx
            where[i] = j
            if t >= 0:
                where[t] = own
            else:
                cnt[own] -= 1
                cnt[j] += 1


def level_slots(
    slens: np.ndarray, starts: np.ndarray, alone: np.ndarray, dp: int, cap: int,
    coeffs: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``(pos, starts)``: micro-batches cut into slots (every ``dp`` consecutive ones meet, as
    ``--sync micro`` runs them) with each slot's costliest lowered by moves and swaps of
    samples between its micro-batches (:func:`level_steps` at grad-accum 1); ``pos`` reorders
    the stream (``slens``: its lengths; ``alone``: samples that never move), keeping each
    micro-batch's samples in stream order."""
    n = len(starts) - 1
    where = np.repeat(np.arange(n, dtype=np.int64), np.diff(starts))
    m = len(where)
    level_steps(np.arange(m, dtype=np.int64), m, where, np.ascontiguousarray(slens, np.int64),
                np.ascontiguousarray(alone, np.bool_), n // dp, dp, 1, cap, float(coeffs[0]),
                float(coeffs[1]), STEP_MOVES)  # fmt: skip
    pos = np.argsort(where, kind="stable")
    return pos, np.concatenate(([0], np.cumsum(np.bincount(where, minlength=n))))
