"""Forming micro-batches from an ordered stream of samples.

A micro-batch is always a run of consecutive samples of the stream (the stream is the curriculum
order, or a shuffled order sorted within windows), so a plan is a stream plus ``offsets``: micro-batch
``i`` holds stream positions ``offsets[i]:offsets[i+1]``. Packing never crosses a segment start
(an epoch or a shuffle window), so each segment packs on its own.

Budget filling is sequential (whether a sample fits depends on what is already in the micro-batch),
so it runs in a small numba kernel: about 10 ns per sample. Everything else is vectorised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from varpack.errors import ConfigError
from varpack.plan.kernels.inputs import frozen
from varpack.plan.rules import LAYOUT_CODE, fits


@dataclass(frozen=True)
class PackRule:
    """What decides whether a sample joins a micro-batch: a sample count (``batch_size``, fixed
    batching) or the budget rule (:func:`varpack.plan.rules.fits`: layout, multiple, budget)."""

    layout: str = "packed"
    pad_multiple: int = 1
    max_tokens: int | None = None  # the budget; None with fixed batching
    batch_size: int | None = None  # fixed batching

    @property
    def fixed(self) -> bool:
        return self.batch_size is not None

    def kernel_args(self) -> tuple[bool, np.int64, int, np.int64, np.int64]:
        """The scalars the compiled kernels take, in their order."""
        return (
            self.fixed,
            np.int64(self.batch_size or 0),
            LAYOUT_CODE[self.layout],
            np.int64(self.pad_multiple),
            np.int64(self.max_tokens or 0),
        )


def oversize_mask(lens: np.ndarray, rule: PackRule) -> np.ndarray:
    """Samples that do not fit the budget even alone (always none for fixed batching).

    >>> oversize_mask(np.array([5, 50, 6]), PackRule(max_tokens=20)).tolist()
    [False, True, False]
    """
    if rule.fixed or rule.max_tokens is None:
        return np.zeros(len(lens), dtype=bool)
    code = LAYOUT_CODE[rule.layout]
    top = int(lens.max()) if len(lens) else 0
    if fits(1, top, top, code, rule.pad_multiple, rule.max_tokens):  # grows with the length
        return np.zeros(len(lens), dtype=bool)
    one = np.ones(len(lens), dtype=np.int64)
    return ~fits(one, lens, lens, code, rule.pad_multiple, rule.max_tokens)


@njit(cache=True)
def fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """May sample ``x`` join a micro-batch of ``cnt`` samples, ``tok`` tokens, longest ``mx``?"""
    if fixed:
        return cnt + 1 <= bsize
    return fits(cnt + 1, tok + x, max(mx, x), layout, multiple, budget)


@njit(cache=True)
def _clash(group, q, seen, ns):  # type: ignore[no-untyped-def]
    """Is item ``q`` a piece of a document that has a piece among ``seen[:ns]`` already?"""
    g = group[q]
    if g < 0:
        return False
    for j in range(ns):
        if seen[j] == g:
            return True
    return False


@njit(cache=True)
def _note(group, q, seen, ns):  # type: ignore[no-untyped-def]
    """Record item ``q``'s document in ``seen`` if it is a piece; the new count."""
    if group[q] >= 0:
        seen[ns] = group[q]
        return ns + 1
    return ns


@njit(cache=True)
def _greedy(lens, alone, group, buf, m, cap, fixed, bsize, layout, multiple, budget, out):  # type: ignore[no-untyped-def]
    """Pack ``buf[:m]`` greedily into at most ``cap`` micro-batches (0: no cap).

    Writes the local start of each micro-batch to ``out``; returns (micro-batches, items packed).
    ``group`` (empty: none) numbers split documents, whose pieces never share a micro-batch.
    """
    grouped = len(group) > 0
    seen = np.empty(m if grouped else 0, dtype=np.int64)
    nmb = 0
    i = 0
    while i < m:
        if cap > 0 and nmb == cap:
            break
        out[nmb] = i
        nmb += 1
        x = np.int64(lens[buf[i]])
        cnt = np.int64(1)
        tok = x
        mx = x
        lone = alone[buf[i]]
        ns = _note(group, buf[i], seen, 0) if grouped else 0
        i += 1
        while i < m and not lone and not alone[buf[i]]:
            x = np.int64(lens[buf[i]])
            if not fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget):
                break
            if grouped:
                if _clash(group, buf[i], seen, ns):
                    break
                ns = _note(group, buf[i], seen, ns)
            cnt += 1
            tok += x
            mx = max(mx, x)
            i += 1
    out[nmb] = i
    return nmb, i


@njit(cache=True)
def _split_to(lens, buf, starts, nmb, want):  # type: ignore[no-untyped-def]
    """Split the micro-batches with the most tokens (two samples or more) until ``want`` exist."""
    while nmb < want:
        best = -1
        best_tok = np.int64(-1)
        for j in range(nmb):
            if starts[j + 1] - starts[j] < 2:
                continue
            tok = np.int64(0)
            for q in range(starts[j], starts[j + 1]):
                tok += lens[buf[q]]
            if tok > best_tok:
                best_tok = tok
                best = j
        if best < 0:
            return nmb
        a = starts[best]
        b = starts[best + 1]
        acc = np.int64(0)
        cut = a + 1
        for q in range(a, b - 1):  # first cut whose prefix reaches half the tokens
            acc += lens[buf[q]]
            cut = q + 1
            if 2 * acc >= best_tok:
                break
        for j in range(nmb, best, -1):
            starts[j + 1] = starts[j]
        starts[best + 1] = cut
        nmb += 1
    return nmb


@njit(cache=True)
def _pack_steps(
    lens, alone, group, bounds, cap, nc0, final, fixed, bsize, layout, multiple, budget
):  # type: ignore[no-untyped-def]
    """Pack each segment into exactly ``cap`` micro-batches (carrying the overflow forward).

    Items ``0 .. nc0-1`` are carried in (a run of the stream packed before this one); with
    ``final`` the last segment takes everything left, else what is left is carried out."""
    n = len(lens)
    perm = np.empty(n, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    buf = np.empty(n, dtype=np.int64)
    carry = np.empty(n, dtype=np.int64)
    local = np.empty(n + 2, dtype=np.int64)
    for j in range(nc0):
        carry[j] = j
    nc = nc0
    k = 0
    p = 0
    nseg = len(bounds) - 1
    for s in range(nseg + 1 if final else nseg):
        m = 0
        for j in range(nc):  # carried samples first, so none waits more than a step or two
            buf[m] = carry[j]
            m += 1
        if s < nseg:
            for i in range(bounds[s], bounds[s + 1]):
                buf[m] = i
                m += 1
        nc = 0
        if m == 0:
            continue
        last = final and s >= nseg - 1
        nmb, used = _greedy(
            lens,
            alone,
            group,
            buf,
            m,
            0 if last else cap,
            fixed,
            bsize,
            layout,
            multiple,
            budget,
            local,
        )
        if not last and nmb < cap:
            nmb = _split_to(lens, buf, local, nmb, cap)
            if nmb < cap:  # too few samples for a whole step: all of them wait for the next one
                for j in range(m):
                    carry[j] = buf[j]
                nc = m
                continue
        for j in range(nmb):
            starts[k] = p + local[j]
            k += 1
        for j in range(used):
            perm[p + j] = buf[j]
        for j in range(used, m):
            carry[j - used] = buf[j]
        nc = m - used
        p += used
    starts[k] = p
    return perm[:p], starts[: k + 1], carry[:nc]


@njit(cache=True)
def _pack_free(lens, alone, group, bounds, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """No cap: greedy over each segment in place (no re-ordering, no buffers)."""
    n = len(lens)
    starts = np.empty(n + 1, dtype=np.int64)
    grouped = len(group) > 0
    seen = np.empty(n if grouped else 0, dtype=np.int64)
    ns = 0
    k = 0
    seg = 1
    cnt = np.int64(0)
    tok = np.int64(0)
    mx = np.int64(0)
    lone = False
    for i in range(n):
        x = np.int64(lens[i])
        if seg < len(bounds) and i == bounds[seg]:
            seg += 1
            cnt = np.int64(0)
        if cnt > 0 and (
            lone
            or alone[i]
            or not fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget)
            or (grouped and _clash(group, i, seen, ns))
        ):
            cnt = np.int64(0)
        if grouped:
            ns = _note(group, i, seen, 0 if cnt == 0 else ns)
        if cnt == 0:
            starts[k] = i
            k += 1
            cnt = np.int64(1)
            tok = x
            mx = x
            lone = alone[i]
        else:
            cnt += 1
            tok += x
            mx = max(mx, x)
    starts[k] = n
    return starts[: k + 1]


def pack(
    lens: np.ndarray,
    bounds: np.ndarray,
    alone: np.ndarray,
    rule: PackRule,
    cap: int = 0,
    group: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray]:
    """Micro-batches of a stream: ``(perm, offsets)``.

    The stream is re-ordered by ``perm`` (a permutation of its positions; ``None`` when packing
    keeps the order, always so without ``cap``); micro-batch ``i`` is
    re-ordered positions ``offsets[i]:offsets[i+1]``. Segments ``bounds[j]:bounds[j+1]`` pack on
    their own. With ``cap`` > 0 every segment but the last becomes exactly ``cap`` micro-batches
    (one step): what does not fit moves on to the next segment, a short one is split (the
    micro-batches with the most tokens, at their token midpoint) or, with too few samples, joins
    the next. ``alone[i]`` gives sample ``i`` a micro-batch of its own (``--oversize alone``).
    ``group[i]`` >= 0 numbers the split document sample ``i`` is a piece of: two pieces of one
    document never share a micro-batch (``--oversize split``).

    >>> lens = np.array([3] * 10 + [7] * 4)
    >>> perm, off = pack(lens, np.array([0, 14]), np.zeros(14, bool), PackRule(max_tokens=30))
    >>> off.tolist()
    [0, 10, 14]
    """
    n = len(lens)
    if n == 0:
        return None, np.zeros(1, dtype=np.int64)
    groups = np.zeros(0, np.int64) if group is None else np.ascontiguousarray(group, np.int64)
    if cap == 0:  # the stream order stands (perm None: the identity)
        return None, _pack_free(
            frozen(lens),
            np.ascontiguousarray(alone, dtype=np.bool_),
            groups,
            np.ascontiguousarray(bounds, dtype=np.int64),
            *rule.kernel_args(),
        )
    perm, starts, _ = pack_steps(lens, bounds, alone, rule, cap, groups)
    return perm, starts


def pack_steps(
    lens: np.ndarray,
    bounds: np.ndarray,
    alone: np.ndarray,
    rule: PackRule,
    cap: int,
    group: np.ndarray | None = None,
    carried: int = 0,
    final: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pack` with a cap, over a run of the stream: ``(perm, offsets, carry)``.

    Items ``0 .. carried-1`` come carried from the run before (they go first, as the overflow
    of a step does); segments ``bounds`` cover the rest. ``final``: the run ends the stream
    (its last segment takes every item left); else the items left are returned as ``carry``
    (positions), to be carried into the next run, and ``perm`` covers only those packed.

    >>> lens = np.array([4, 4, 4, 4, 4])
    >>> rule = PackRule(max_tokens=8)
    >>> perm, off, carry = pack_steps(lens, np.array([0, 3, 5]), np.zeros(5, bool), rule, 1,
    ...                               final=False)
    >>> perm.tolist(), off.tolist(), carry.tolist()
    ([0, 1, 2, 3], [0, 2, 4], [4])
    """
    groups = np.zeros(0, np.int64) if group is None else np.ascontiguousarray(group, np.int64)
    return _pack_steps(
        np.ascontiguousarray(lens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        groups,
        np.ascontiguousarray(bounds, dtype=np.int64),
        np.int64(cap),
        np.int64(carried),
        final,
        *rule.kernel_args(),
    )


def complete(
    offsets: np.ndarray,
    lens: np.ndarray,
    multiple: int,
    cost_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    where: str = "the data",
    min_size: int = 1,
    widen: int | None = None,
) -> np.ndarray:
    """Split micro-batches until their number is a multiple of ``multiple`` (ROLL's way).

    The costliest micro-batches with two or more samples (``2 * min_size``: both halves keep
    ``min_size``) are split at their token midpoint, taken
    from the tail (the last partial step, widened by whole steps only while it holds too few
    samples), so earlier steps stay as packed. Splitting only shrinks micro-batches, so budgets
    still hold. ``cost_of(offsets, lens)`` scores micro-batches. Raises :class:`ConfigError` when
    even single-sample micro-batches cannot make up the count. ``widen``: the first micro-batch of
    the tail, where midpoint cuts left too little to split (internal).

    >>> lens = np.array([1, 1, 1, 1, 4])
    >>> complete(np.array([0, 4, 5]), lens, 4, lambda o, v: np.add.reduceat(v, o[:-1]) * 1.0).tolist()
    [0, 1, 2, 4, 5]
    """
    m = len(offsets) - 1
    need = (-m) % multiple
    if need == 0:
        return offsets
    counts = np.diff(offsets)
    spare = np.cumsum((counts // min_size - 1)[::-1])[::-1]  # extra pieces from i on
    if spare[0] < need:
        raise ConfigError(
            f"{where}: {len(lens)} samples form {m} micro-batches, which cannot be split into a multiple of "
            f"dp x grad_accum = {multiple} (every rank needs the same number of micro-batches per step); "
            "lower --dp or --grad-accum, or raise --max-tokens"
        )
    # Tail: the partial step, widened by whole steps until it has enough spare samples.
    first = m - m % multiple if widen is None else widen
    while spare[first] < need:
        first = max(first - multiple, 0)
    head, tail = offsets[: first + 1], offsets[first:] - offsets[first]
    tail_lens = lens[offsets[first] :]
    cum = np.concatenate(([0], np.cumsum(tail_lens, dtype=np.int64)))
    while need > 0:
        counts = np.diff(tail)
        cand = np.flatnonzero(counts >= 2 * min_size)
        if len(cand) == 0:  # midpoint cuts left no piece to split: widen the tail, or give up
            if first == 0:
                raise ConfigError(
                    f"{where}: {len(lens)} samples cannot be split into whole steps of "
                    f"dp x grad_accum = {multiple} micro-batches; lower --dp or --grad-accum"
                )
            return complete(
                np.concatenate((head[:-1], tail + offsets[first])), lens, multiple, cost_of,
                where, min_size, max(first - multiple, 0),
            )  # fmt: skip
        cost = cost_of(tail, tail_lens)[cand]
        take = cand[np.lexsort((cand, -cost))[:need]]
        a, b = tail[take], tail[take + 1]
        mid = np.searchsorted(cum, (cum[a] + cum[b]) / 2.0)
        # the left piece a multiple of min_size, so the right one can still be split (by count)
        cut = np.clip(a + min_size * np.rint((mid - a) / min_size).astype(np.int64), a + min_size,
                      b - min_size)  # fmt: skip
        tail = np.sort(np.concatenate((tail, cut)))
        need -= len(take)
    return np.concatenate((head[:-1], tail + offsets[first]))
