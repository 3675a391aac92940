"""An epoch composed by the balance engine: its permuted stream cut into windows, each window
composed (:func:`varpack.plan.engine.window.compose_window`), what a window cannot place moved
on to the next, and the micro-batches written out step by step.

A window is ``--shuffle-window`` steps' worth of the permuted stream's tokens (a short tail
joins the last one), so a sample trains within about a window of its random position (two for
a heavy sample that waited). The epoch's last window takes as many steps as it needs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.engine.window import compose_window
from varpack.plan.kernels.compose import Composed, grow, window_end
from varpack.plan.kernels.order import sort_by_length


@njit(cache=True)
def _costliest_first(buf, m, lens):  # type: ignore[no-untyped-def]
    """Positions ``0 .. m-1`` of ``buf``, longest first, ties in order: costliest first, as
    every cost model's cost grows with the length (a radix sort: a window's sort was a third
    of its composing)."""
    top = np.int64(0)
    for i in range(m):
        top = max(top, lens[buf[i]])
    keys = np.empty(m, dtype=np.int64)
    pos = np.empty(m, dtype=np.int64)
    for i in range(m):
        keys[i] = top + 1 - lens[buf[i]]
        pos[i] = i
    sort_by_length(keys, pos, np.empty(m, np.int64), np.empty(m, np.int64), m)
    return pos


@njit(cache=True)
def emit(buf, order, cost, out_bin, out_mb, p, dp, kb, gps, stream, out, starts, nmb):  # type: ignore[no-untyped-def]
    """Append a composed window's micro-batches, step by step: under step sync each rank's
    ``kb`` micro-batches in turn, costliest first (each slot then holds alike ones, should the
    ranks meet at every micro-batch after all); with slots (``gps`` a step) slot ``j`` of step
    ``s`` is group ``j * p + s`` (so heavy groups, the first, spread over the steps). Inside a
    micro-batch its samples costliest first. Returns the new stream length and micro-batch
    count."""
    nmbw = p * gps * dp * kb
    load = np.zeros(nmbw)
    for i in range(len(order)):
        if out_bin[i] >= 0:
            load[out_bin[i] * kb + out_mb[i]] += cost[i]
    slot_of = np.empty(nmbw, dtype=np.int64)  # micro-batch (bin, mb) -> its place in the window
    at = 0
    for s in range(p):
        for j in range(gps):
            g = j * p + s
            for r in range(dp):
                e = (g * dp + r) * kb
                by = np.argsort(-load[e : e + kb], kind="mergesort")
                for u in range(kb):
                    slot_of[e + by[u]] = at
                    at += 1
    first = np.zeros(nmbw + 1, dtype=np.int64)
    m = len(order)
    for i in range(m):
        if out_bin[i] >= 0:
            first[slot_of[out_bin[i] * kb + out_mb[i]] + 1] += 1
    for t in range(nmbw):
        first[t + 1] += first[t]
    for t in range(nmbw):
        starts[nmb + t] = out + first[t]
    for q in range(m):
        i = order[q]
        if out_bin[i] >= 0:
            t = slot_of[out_bin[i] * kb + out_mb[i]]
            stream[out + first[t]] = buf[i]
            first[t] += 1
    return out + first[nmbw - 1], nmb + nmbw


@njit(cache=True, nogil=True)
def compose_epoch(lens, alone, price, costs, window_tok, dp, kb, gps, cap, fill_to, passes, run):  # type: ignore[no-untyped-def]
    """``(stream, starts, ok, carry, held)``: a run of the epoch's positions (in the permuted
    order of ``lens``) cut into micro-batches at ``starts``, ``dp x kb x gps`` a step; ``ok``
    False where the epoch has too few samples for whole steps. ``price``: the cost of a sample
    of each length (the plan's cost model, indexed by length), or, where lengths are too long
    for such a table, ``costs``: each sample's (in the permuted order).

    ``run`` is ``(carried, cum0, rest_tok, rest_n, held)``: the first ``carried`` positions come
    from the run before (``held``: whether each is a heavy sample that waited), ``cum0`` tokens
    of the epoch precede the run's own positions, ``rest_tok`` tokens in ``rest_n`` positions
    follow them (``rest_n`` 0: the run ends the epoch, whose last window takes every sample
    left). What a run does not place is handed on: ``carry`` (positions) and its held flags."""
    nc0, cum0, rest_tok, rest_n, held_in = run
    final = rest_n == 0
    n = len(lens)
    per_step = dp * kb * gps
    total = cum0 + rest_tok
    for i in range(nc0, n):
        total += lens[i]
    stream = np.empty(n, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    held = np.zeros(n, dtype=np.bool_)
    buf = np.empty(nc0, dtype=np.int64)
    carry = np.empty(0, dtype=np.int64)
    for i in range(nc0):
        buf[i] = i
        held[i] = held_in[i]
    out = nmb = 0
    nc = nc0
    a = nc0
    cum = cum0
    while a < n or (final and nc > 0):
        b, tot = window_end(lens, a, cum, window_tok, total, window_tok // 2, rest_n, per_step)
        cum += tot
        m = nc + b - a
        buf = grow(buf, m)
        carry = grow(carry, m)
        for i in range(a, b):
            buf[nc + i - a] = i
        a = b
        last = a >= n and final
        cost = np.empty(m)
        tok = np.empty(m, dtype=np.int64)
        hw = np.empty(m, dtype=np.bool_)
        for i in range(m):
            cost[i] = costs[buf[i]] if len(costs) else price[lens[buf[i]]]
            tok[i] = cap if alone[buf[i]] else lens[buf[i]]
            hw[i] = held[buf[i]]
        order = _costliest_first(buf, m, lens)
        out_bin = np.empty(m, dtype=np.int64)
        out_mb = np.empty(m, dtype=np.int64)
        wait = np.zeros(m, dtype=np.bool_)
        nmax = 0
        while True:
            p = compose_window(cost, tok, order, hw, nmax, dp, kb, gps, cap, fill_to, last,
                               passes, out_bin, out_mb, wait)  # fmt: skip
            if not last or p == 0:
                break
            left = False
            for i in range(m):
                left = left or out_bin[i] < 0
            if not left or p >= m // per_step:
                break
            nmax = p + 1  # the last window takes the steps it needs
        if p == 0:
            if last:
                return stream[:0], starts[:1], False, buf[:0], held[:0]
            for i in range(m):  # too few samples for a step: all move on
                carry[i] = buf[i]
            nc = m
        else:
            starts = grow(starts, nmb + p * per_step + 1)
            out, nmb = emit(buf, order, cost, out_bin, out_mb, p, dp, kb, gps, stream, out, starts,
                            nmb)  # fmt: skip
            nc = 0
            for i in range(m):
                if out_bin[i] < 0:
                    carry[nc] = buf[i]
                    held[buf[i]] = wait[i]
                    nc += 1
            if last and nc > 0:
                return stream[:0], starts[:1], False, buf[:0], held[:0]
        for i in range(nc):
            buf[i] = carry[i]
    starts[nmb] = out
    kept = np.empty(nc, dtype=np.bool_)
    for i in range(nc):
        kept[i] = held[buf[i]]
    return stream[:out], starts[: nmb + 1], True, buf[:nc].copy(), kept


def compose_run(
    arrays: tuple[np.ndarray, ...],
    run: tuple[int, int, int, int, np.ndarray],
    price: np.ndarray,
    window_tok: int,
    dp: int,
    kb: int,
    gps: int,
    cap: int,
    fill_to: float,
    passes: int,
) -> Composed | None:
    """A run of the permuted epoch composed by the engine (the shape the threaded runner calls,
    :func:`varpack.plan.kernels.compose_threads.threaded`): ``arrays`` the run's lengths, lone
    flags and, where priced sample by sample, costs; None where the epoch's last window cannot
    place every sample."""
    lens, alone, *rest = arrays
    nc0, cum0, rest_tok, rest_n, held = run
    stream, starts, ok, carry, kept = compose_epoch(
        np.ascontiguousarray(lens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        price, rest[0] if rest else price[:0],
        np.int64(max(window_tok, 1)), np.int64(dp), np.int64(kb), np.int64(gps), np.int64(cap),
        float(fill_to), np.int64(passes),
        (np.int64(nc0), np.int64(cum0), np.int64(rest_tok), np.int64(rest_n),
         np.ascontiguousarray(held, dtype=np.bool_)),
    )  # fmt: skip
    return Composed(stream, starts, carry, kept, price[:0].astype(np.bool_)) if ok else None
