"""Cost-aware composition of shuffled steps: each window's samples dealt to (step, rank) slots.

A shuffled epoch is a permutation cut into windows of ``--shuffle-window`` steps' worth of
tokens (as in :mod:`varpack.plan.kernels.order`). Composing by tokens fills every micro-batch to
the budget, so with attention's quadratic cost a micro-batch holding one long sample costs several
times one of short samples, and at small grad-accum its rank carries it while the others wait.
Composing by cost deals each window to its ``P`` steps x ``dp`` ranks (*slots*, ``grad_accum``
micro-batches each) so that every rank of a step carries the same cost:

1. **heavy samples** (:mod:`.heavy`: those whose rank the others cannot catch up with by taking
   more of the window's other samples) are placed first, sorted, in groups of ``dp``: a step
   holds none of them or one per rank, of similar cost. A group that would stay short waits for
   the next window's heavy samples, once, so that short groups are rare;
2. **compensation**: a step of heavy samples has a cost ceiling, the larger of its costliest
   rank and the level every rank can still reach filled to its budget; a rank with a heavy
   sample gets lighter (underfilled) micro-batches, and what they do not take goes to other steps
   of the window or moves on. ``--balance-fill MIN`` bounds the budget a step gives up so;
3. **the deal**: the rest, costliest first, by count in proportion to the tokens each step can
   take, so every step gets a stratified share of every length range (its mix follows the
   window's); inside its step a sample goes to the rank with the least cost that has room
   (longest-processing-time first under the budget) (:mod:`.window`);
4. what fits nowhere moves on to the next window, where it is placed first, whatever the
   step's ceiling (it moves on again only where no micro-batch has room); the epoch's last
   window gets as many steps as it needs.

A sample trains within about one window of its random position (two for a heavy sample that
waited). Pure NumPy in, numba kernels for the sequential part, the packed layout's budget rule
(:func:`varpack.plan.rules.fits`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from varpack.plan.kernels.heavy import cost, grouping, heavy_prefix
from varpack.plan.kernels.lpt import mix_window
from varpack.plan.kernels.order import sort_by_length
from varpack.plan.kernels.window import compose_window
from varpack.plan.rules import capacity
from varpack.plan.tuning import PASSES, SLOTS_BY_COST


@njit(cache=True)
def _by_cost(buf, m, lens):  # type: ignore[no-untyped-def]
    """Positions ``0 .. m-1`` of ``buf``, costliest first (every cost grows with the length)."""
    keys = np.empty(m, dtype=np.int64)
    pos = np.empty(m, dtype=np.int64)
    for i in range(m):
        keys[i] = lens[buf[i]]
        pos[i] = i
    sort_by_length(keys, pos, np.empty(m, np.int64), np.empty(m, np.int64), m)
    return pos[::-1].copy()


@njit(cache=True)
def grow(a, size):  # type: ignore[no-untyped-def]
    """``a`` with room for ``size`` entries (doubling; contents kept)."""
    if size <= len(a):
        return a
    b = np.empty(max(size, 2 * len(a)), dtype=a.dtype)
    b[: len(a)] = a
    return b


@njit(cache=True)
def window_end(lens, a, cum, window_tok, total, tail_tok, n_after, per_step):  # type: ignore[no-untyped-def]
    """``(end, tokens)`` of the window that starts at position ``a`` of ``lens`` (``cum``
    tokens of the stream before it): the positions whose tokens before them fall in the same
    multiple of ``window_tok``; where what follows is a tail of fewer than ``tail_tok`` of the
    stream's ``total`` tokens, or of fewer than two steps' positions (``n_after`` more follow
    ``lens``), the tail joins it.

    >>> window_end(np.array([4, 4, 4, 4, 1]), 0, 0, 8, 17, 3, 0, 1)
    (2, 8)
    >>> window_end(np.array([4, 4, 4, 4, 1]), 2, 8, 8, 17, 3, 0, 1)
    (5, 9)
    """
    n = len(lens)
    b = a
    tot = np.int64(0)
    w = cum // window_tok
    while b < n and (cum + tot) // window_tok == w:
        tot += lens[b]
        b += 1
    if b < n and (total - cum - tot < tail_tok or n - b + n_after < 2 * per_step):
        while b < n:  # a short tail joins the last window
            tot += lens[b]
            b += 1
    return b, tot


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
def _slots_by_cost(buf, wait, m, lens, lin, quad, full, p0):  # type: ignore[no-untyped-def]
    """The window's step count: ``p0``, or the cost of its samples (those not waiting) over a
    full step's (``full``: its dp x k micro-batches filled to the budget at the light density)
    where that is below :data:`SLOTS_BY_COST` of it."""
    wc = 0.0
    for i in range(m):
        if not wait[i]:
            wc += cost(lens[buf[i]], lin, quad)
    by_cost = wc / full
    return max(1, np.int64(by_cost + 0.5)) if by_cost < SLOTS_BY_COST * p0 else p0


@njit(cache=True)
def _steps_of(
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
    p0,
    last,
    dp,
    k,
    cap,
    where,
    fill,
    src,
    wshare,
    tol,
    passes,
):  # type: ignore[no-untyped-def]
    """Compose a window into the most steps that leave no micro-batch empty, from ``p0`` down
    (the epoch's last window: the fewest from ``p0`` up that place every sample). 0: none."""
    m = len(order)
    most = m // (dp * k)
    p = min(p0, most)
    while 1 <= p <= most:
        ok = compose_window(buf, order, carried, wait, group, density, lens, alone, lin, quad, p,
                            dp, k, cap, where, fill, last, src, wshare, tol, passes)  # fmt: skip
        if ok and not last:
            return p
        if ok and np.all(where[:m] >= 0):
            return p
        p = p + 1 if last else p - 1
    return 0


@njit(cache=True, nogil=True)
def _compose_epoch(
    lens,
    alone,
    lin,
    quad,
    window_tok,
    step_tok,
    dp,
    k,
    cap,
    fill,
    src,
    wshare,
    tol,
    run,
    passes,
    mix,
):  # type: ignore[no-untyped-def]
    """The epoch's stream (positions in the permuted order) and micro-batch starts; ``lens``
    and ``alone`` are in the permuted order, so a window's samples are read in sequence.

    ``run`` places the positions in a longer stream: ``(carried, cum0, rest_tok, rest_n)``,
    items ``0 .. carried-1`` carried in from the run before (their held flags in ``held_in``,
    the last argument's fifth entry), ``cum0`` tokens before the run's first own position,
    ``rest_tok`` tokens and ``rest_n`` positions after its last. A run that does not end the
    stream hands on the items it could not place (and their held flags)."""
    n = len(lens)
    nc0, cum0, rest_tok, rest_n, held_in = run
    final = rest_n == 0
    per_step = dp * k
    total_tok = cum0 + rest_tok
    for i in range(nc0, n):
        total_tok += lens[i]
    stream = np.empty(n, dtype=np.int64)
    starts = np.empty(n // 16 + per_step + 1, dtype=np.int64)
    buf = np.empty(nc0, dtype=np.int64)
    carry = np.empty(0, dtype=np.int64)
    where = np.empty(0, dtype=np.int64)
    out = nmb = 0
    held = np.zeros(n, dtype=np.bool_)  # heavy samples waiting for the next window
    wide = np.zeros(n if mix else 0, dtype=np.bool_)  # each entry: its window dealt window-wide
    for i in range(nc0):
        buf[i] = i
        held[i] = held_in[i]
    nc = nc0
    a = nc0
    cum = cum0  # tokens of the permutation before position a
    while a < n or (final and nc > 0):
        b, tot = window_end(lens, a, cum, window_tok, total_tok, step_tok, rest_n, per_step)
        cum += tot
        m = nc + b - a
        buf = grow(buf, m)
        carry = grow(carry, m)
        where = grow(where, m)
        wtok = tot
        for i in range(nc):
            wtok += lens[buf[i]]
        for i in range(a, b):
            buf[nc + i - a] = i
        a = b
        order = _by_cost(buf, m, lens)
        last = a >= n and final
        h, density = heavy_prefix(buf, order, lens, lin, quad, cap, held, k)
        # heavy samples wait for a whole group only where their cost is not their length
        group = grouping(order, nc, h, dp, not last and quad > 0, lens, buf, lin, quad)
        wait = np.zeros(m, dtype=np.bool_)
        for q in range(h):
            wait[order[q]] = group[q] == -1
        for i in range(m):
            held[buf[i]] = wait[i]
            if wait[i]:
                wtok -= lens[buf[i]]
        p0 = max(1, np.int64(wtok / step_tok + 0.5))
        if quad > 0:  # steps: as many as the window's cost fills, where far fewer
            p0 = _slots_by_cost(buf, wait, m, lens, lin, quad, dp * k * cap * density, p0)
        p = _steps_of(buf, order, nc, wait, group, density, lens, alone, lin, quad, p0, last, dp,
                      k, cap, where, fill, src, wshare, tol, passes)  # fmt: skip
        dealt = False
        if mix and p > 0:  # grad-accum 1: a window-wide deal where its slots wait less
            dealt = mix_window(buf, order[:m], wait, lens, alone, lin, quad, p * dp, dp, cap, where,
                               last, passes)  # fmt: skip
        if p == 0:
            if last:
                return stream[:0], starts[:1], False, buf[:0], held[:0], wide[:0]
            for i in range(m):  # too few samples for a step: all of them wait for the next one
                carry[i] = buf[i]
            nc = m
        else:
            starts = grow(starts, nmb + p * per_step + 1)
            was = out
            out, nmb, nc = _emit(
                buf, order, where[:m], p * per_step, stream, out, starts, nmb, carry
            )
            if mix:
                wide[was:out] = dealt
        for i in range(nc):
            buf[i] = carry[i]
    starts[nmb] = out
    kept = np.empty(nc, dtype=np.bool_)
    for i in range(nc):
        kept[i] = held[buf[i]]
    return stream[:out], starts[: nmb + 1], True, buf[:nc].copy(), kept, wide[: out if mix else 0]


class Composed(NamedTuple):
    """A run of a permuted stream composed by cost (:func:`compose_run`): ``stream`` (positions
    in the run, carried items first) cut into micro-batches at ``starts``; the items it hands on
    to the next run (``carry``, positions) and whether each is a heavy sample held back;
    ``wide``: for each entry of ``stream``, whether its window was dealt window-wide
    (:mod:`.lpt`; empty without ``mix``)."""

    stream: np.ndarray
    starts: np.ndarray
    carry: np.ndarray
    held: np.ndarray
    wide: np.ndarray


def compose_run(
    plens: np.ndarray,
    alone: np.ndarray,
    coeffs: tuple[float, float],
    window_tokens: int,
    step_tokens: int,
    dp: int,
    k: int,
    multiple: int,
    budget: int,
    fill: float = 0.0,
    sources: tuple[np.ndarray, np.ndarray, float] | None = None,
    run: tuple[int, int, int, int, np.ndarray] | None = None,
    level: bool = True,
    mix: bool = False,
) -> Composed | None:
    """A run of the permuted stream composed by cost, or None where it cannot be.

    ``plens`` and ``alone`` are the samples in the epoch's permuted order (gathered once, so the
    kernel reads windows in sequence); the result's ``stream`` holds positions in that order,
    cut into micro-batches at ``starts``. ``coeffs``: the cost of a sample of ``x`` tokens as
    ``lin * x + quad * x^2``. Every ``dp * k`` consecutive micro-batches form a step, and every
    ``k`` consecutive ones of a step one rank's share (a *slot*). ``fill``: the budget fill a
    step of heavy samples keeps at least (``--balance-fill``). ``sources``: a blend's ``(source
    of each sample, in the permuted order; weight of each source; tolerance)``, whose shares
    every step keeps within the tolerance where like-sized swaps can reach it.

    ``run`` (default: the whole epoch) is ``(carried, cum0, rest_tok, rest_n, held)`` for a run
    that starts at a window: the first ``carried`` items come from the run before (``held``:
    their held flags), ``cum0`` tokens precede the run's own positions, ``rest_tok`` tokens in
    ``rest_n`` positions follow them (``rest_n`` 0: the run ends the epoch). Windows must not
    cross runs. None: the epoch's last window could not place every sample (too few samples
    for whole steps); the caller composes by tokens instead.
    ``level``: lower the runs' tops of windows composed one slot at a time (:mod:`.level`), and
    each step's costliest rank at grad-accum > 1 (:mod:`.steplevel`), by moves and swaps (False
    where the plan must be quick rather than levelled, ``plan_batch``, or where a rank's
    micro-batches are padded alike, ``--pp``).
    """
    if run is None:
        run = (0, 0, 0, 0, np.zeros(0, dtype=np.bool_))
    nc0, cum0, rest_tok, rest_n, held = run
    stream, starts, ok, carry, kept, wide = _compose_epoch(
        np.ascontiguousarray(plens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        float(coeffs[0]),
        float(coeffs[1]),
        np.int64(max(window_tokens, 1)),
        np.int64(max(step_tokens, 1)),
        np.int64(dp),
        np.int64(k),
        np.int64(capacity(multiple, budget)),
        float(fill),
        *(_no_blend() if sources is None else _blend(*sources)),
        (np.int64(nc0), np.int64(cum0), np.int64(rest_tok), np.int64(rest_n),
         np.ascontiguousarray(held, dtype=np.bool_)),
        np.int64(PASSES if level else 0),
        bool(mix),
    )  # fmt: skip
    return Composed(stream, starts, carry, kept, wide) if ok else None


def _no_blend() -> tuple[np.ndarray, np.ndarray, float]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64), 1.0


def _blend(
    src: np.ndarray, weights: np.ndarray, tol: float
) -> tuple[np.ndarray, np.ndarray, float]:
    src = np.ascontiguousarray(src, dtype=np.int64)
    return src, np.ascontiguousarray(weights, np.float64), float(tol)
