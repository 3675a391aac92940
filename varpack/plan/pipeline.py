"""Pipeline-parallel steps: one shape per (step, rank) and a micro-batch count that is a multiple of P.

With pipeline parallelism (``--pp P``) activations flow between stages with a fixed shape during a
step's gradient accumulation, so every micro-batch of a step on a rank must have the same shape
``(B, T)`` (the blog's rule), and the schedule wants a number of micro-batches that is a multiple
of P. Two ways to get there, both pure and vectorised or compiled:

* :func:`pipeline_rebatch` (padded layout, recommended): the samples a rank trains on in a step
  stay exactly the same; they are re-cut into micro-batches of one common shape ``T`` = the
  longest (rounded) sample, ``B`` = as many rows as the budget allows, with a count that is a
  multiple of P and equal on every rank. Step totals and LR factors do not change; the micro-batch
  count of a step may grow (and, unless ``uniform``, differ between steps).
* :func:`split_to_multiple` (ROLL's way, packed layout): split the largest micro-batches of each
  (step, rank) until the count is a multiple of P, then :func:`pipeline_shapes` pads every
  micro-batch of the (step, rank) to the largest ``pad_to``.

Arrays: micro-batches are described by ``offsets`` (``n_mb + 1``) into flat per-sample arrays in
execution order; a *group* is one (step, rank), its micro-batches contiguous. Lengths in tokens.
"""

from __future__ import annotations

import numba
import numpy as np

from varpack.errors import ConfigError
from varpack.plan.shapes import round_up


def _check_pp(pp: int) -> None:
    if pp < 1:
        raise ConfigError(f"--pp must be >= 1, got {pp}")


def pipeline_rebatch(
    lens: np.ndarray,
    group_offsets: np.ndarray,
    group_step: np.ndarray,
    max_tokens: int,
    pp: int,
    pad_multiple: int = 1,
    uniform: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Re-cut each (step, rank)'s samples into micro-batches of one shape, a multiple of P of them.

    ``lens``: sample lengths in execution order; ``group_offsets`` (``n_groups + 1``): where each
    (step, rank) group's samples start; ``group_step``: each group's step (non-decreasing). In a
    group with ``n`` samples, ``T`` = its longest length rounded up to ``pad_multiple`` and at most
    ``max_tokens // T`` rows fit. The micro-batch count ``m`` of a step is the most any of its
    groups needs, rounded up to a multiple of ``pp``, so it can differ between steps (with
    ``uniform``: the most over all steps, one count for the whole plan; on curriculum long-tail
    data that costs ~36 % more padding, as steps of a few long samples get all-padding
    micro-batches). Each group is cut, in order,
    into ``m`` micro-batches of ``n // m`` or ``n // m + 1`` samples, all with shape
    ``(ceil(n / m), T)``; the missing rows are ``pad_rows`` (a group with fewer than ``m`` samples
    gets all-padding micro-batches: unavoidable without splitting samples).

    Returns ``(offsets, mb_group, pad_to, pad_rows)``: ``offsets`` (``n_mb + 1``) into ``lens``,
    each micro-batch's group, and its ``pad_to`` / ``pad_rows`` (``int32``). Samples keep their
    order, group and step, so step totals and LR factors are unchanged.

    >>> off, grp, t, pr = pipeline_rebatch(np.array([3, 4, 4, 8, 2]), np.array([0, 4, 5]),
    ...                                    np.array([0, 0]), max_tokens=16, pp=2)
    >>> off.tolist(), grp.tolist(), t.tolist(), pr.tolist()
    ([0, 2, 4, 5, 5], [0, 0, 1, 1], [8, 8, 2, 2], [0, 0, 0, 1])
    """
    _check_pp(pp)
    lens = np.asarray(lens, np.int64)
    goff = np.asarray(group_offsets, np.int64)
    gstep = np.asarray(group_step, np.int64)
    n = np.diff(goff)
    if np.any(n < 1):
        raise ValueError("every (step, rank) group needs at least one sample")
    longest = np.maximum.reduceat(lens, goff[:-1])
    t = round_up(longest, pad_multiple)
    cap = max_tokens // t
    if np.any(cap < 1):
        g = int(np.argmax(cap < 1))
        raise ConfigError(
            f"a sample of {int(longest[g])} tokens does not fit --max-tokens {max_tokens} "
            "(samples over the budget follow --oversize)"
        )
    need = -(-n // cap)
    if np.any(np.diff(gstep) < 0):
        raise ValueError("group_step must be non-decreasing")
    step_start = np.flatnonzero(np.r_[True, np.diff(gstep) != 0])
    per_step = np.maximum.reduceat(need, step_start)
    if uniform:
        per_step[:] = per_step.max()
    per_step = -(-per_step // pp) * pp
    m = np.repeat(per_step, np.diff(np.r_[step_start, n.size]))
    rows = -(-n // m)
    mb_group = np.repeat(np.arange(n.size), m)
    j = np.arange(mb_group.size) - np.repeat(np.cumsum(m) - m, m)  # index within the group
    ng, mg = n[mb_group], m[mb_group]
    size = ng // mg + (j < ng % mg)
    offsets = np.zeros(size.size + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    pad_rows = (rows[mb_group] - size).astype(np.int32)
    return offsets, mb_group, t[mb_group].astype(np.int32), pad_rows


@numba.njit(cache=True)
def _split_kernel(
    offsets: np.ndarray, gstart: np.ndarray, cum: np.ndarray, pp: int
) -> tuple[np.ndarray, np.ndarray, int]:
    ng = gstart.size - 1
    extra = 0
    for g in range(ng):
        c = gstart[g + 1] - gstart[g]
        extra += (-(-c // pp)) * pp - c
    n_mb = offsets.size - 1
    out = np.empty(n_mb + extra + 1, np.int64)
    out_group = np.empty(n_mb + extra, np.int64)
    k = 0
    for g in range(ng):
        a, b = gstart[g], gstart[g + 1]
        c = b - a
        target = (-(-c // pp)) * pp
        cuts = np.empty(target + 1, np.int64)
        for i in range(c + 1):
            cuts[i] = offsets[a + i]
        m = c
        while m < target:
            best = -1
            best_tok = -1
            for i in range(m):
                if cuts[i + 1] - cuts[i] >= 2:
                    tok = cum[cuts[i + 1]] - cum[cuts[i]]
                    if tok > best_tok:
                        best_tok = tok
                        best = i
            if best < 0:
                return out, out_group, g
            lo, hi = cuts[best], cuts[best + 1]
            half = cum[lo] + (cum[hi] - cum[lo] + 1) // 2
            s = lo + 1
            while s < hi - 1 and cum[s] < half:  # token midpoint, both halves non-empty
                s += 1
            for i in range(m, best, -1):
                cuts[i + 1] = cuts[i]
            cuts[best + 1] = s
            m += 1
        for i in range(target):
            out[k + i] = cuts[i]
            out_group[k + i] = g
        k += target
    out[k] = offsets[n_mb]
    return out, out_group, -1


def split_to_multiple(
    offsets: np.ndarray, group: np.ndarray, lens: np.ndarray, pp: int
) -> tuple[np.ndarray, np.ndarray]:
    """ROLL's way: split the largest micro-batches until each group's count is a multiple of P.

    ``offsets`` (``n_mb + 1``) into ``lens`` (execution order); ``group``: each micro-batch's
    (step, rank) group id, contiguous runs. In a group of ``c`` micro-batches, the one with the
    most tokens among those with >= 2 samples is cut at its token midpoint (order kept), again
    and again, until there are ``ceil(c / P) * P``. No sample moves, so steps, totals and LR
    factors stay; every piece stays within the budget of the micro-batch it came from. Returns
    ``(offsets, group)`` of the new micro-batches. Raises :class:`ConfigError` if a group has too
    few samples to split (then choose ``--grad-accum`` as a multiple of ``--pp``).

    >>> off, g = split_to_multiple(np.array([0, 3, 4, 6]), np.array([0, 0, 1]),
    ...                            np.array([5, 5, 9, 1, 2, 2]), 2)
    >>> off.tolist(), g.tolist()
    ([0, 3, 4, 5, 6], [0, 0, 1, 1])
    """
    _check_pp(pp)
    off = np.asarray(offsets, np.int64)
    grp = np.asarray(group, np.int64)
    if grp.size == 0:
        return off.copy(), grp.copy()
    gstart = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1], True]).astype(np.int64)
    cum = np.zeros(np.asarray(lens).size + 1, np.int64)
    np.cumsum(np.asarray(lens, np.int64), out=cum[1:])
    out, out_group, bad = _split_kernel(off, gstart, cum, int(pp))
    if bad >= 0:
        raise ConfigError(
            f"step group {int(grp[gstart[bad]])} has too few samples to split into a multiple "
            f"of --pp {pp} micro-batches; choose --grad-accum as a multiple of --pp"
        )
    return out, grp[gstart[:-1]][out_group]


def pipeline_shapes(
    group: np.ndarray, rows: np.ndarray, pad_to: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The common shape of each (step, rank) group and the padding it adds.

    ``group``: each micro-batch's group (contiguous runs); ``rows``: its rows (padded: samples +
    ``pad_rows``; packed: 1s); ``pad_to``: its padded length. The group's shape is
    ``(max rows, max pad_to)``; the extra padding (tokens) is
    ``sum(B * T - rows * pad_to)`` over its micro-batches. Returns per group
    ``(rows, pad_to, extra_tokens)``. In the padded layout check ``B * T`` against the budget
    (:func:`check_pipeline_steps`); :func:`pipeline_rebatch` never exceeds it.

    >>> pipeline_shapes(np.array([0, 0, 1]), np.array([1, 1, 1]), np.array([90, 100, 70]))
    (array([1, 1]), array([100,  70]), array([10,  0]))
    """
    g = np.asarray(group, np.int64)
    r = np.asarray(rows, np.int64)
    t = np.asarray(pad_to, np.int64)
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    b = np.maximum.reduceat(r, start)
    tt = np.maximum.reduceat(t, start)
    counts = np.diff(np.r_[start, g.size])
    extra = b * tt * counts - np.add.reduceat(r * t, start)
    return b, tt, extra


def check_pipeline_steps(
    step: np.ndarray,
    rows: np.ndarray,
    pad_to: np.ndarray,
    pp: int,
    max_tokens: int | None = None,
    rank: int | None = None,
) -> list[str]:
    """Violations of the pipeline rules on one rank's micro-batches (execution order).

    Each step: one shape ``(rows, pad_to)`` for all its micro-batches, a count that is a multiple
    of ``pp`` and, with ``max_tokens`` (padded layout), ``rows * pad_to <= max_tokens``.
    ``rows``: samples + ``pad_rows`` (packed: 1s).

    >>> check_pipeline_steps(np.array([0, 0, 1, 1]), np.array([2, 2, 1, 1]),
    ...                      np.array([8, 8, 16, 16]), 2, max_tokens=16)
    []
    >>> check_pipeline_steps(np.array([0, 0, 0]), np.array([2, 2, 1]), np.array([8, 8, 16]), 2)
    ['step 0: 3 micro-batches, not a multiple of --pp 2', 'step 0: 2 shapes, the pipeline needs one']
    """
    where = "" if rank is None else f"rank {rank} "
    s = np.asarray(step, np.int64)
    r = np.asarray(rows, np.int64)
    t = np.asarray(pad_to, np.int64)
    out: list[str] = []
    if s.size == 0:
        return out
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    counts = np.diff(np.r_[start, s.size])
    for i in np.flatnonzero(counts % pp)[:10]:
        out.append(
            f"{where}step {s[start[i]]}: {counts[i]} micro-batches, not a multiple of --pp {pp}"
        )
    differ = (r != np.repeat(r[start], counts)) | (t != np.repeat(t[start], counts))
    bad = np.add.reduceat(differ.astype(np.int64), start) > 0
    for i in np.flatnonzero(bad)[:10]:
        a, b = start[i], start[i] + counts[i]
        n = np.unique(np.stack([r[a:b], t[a:b]]), axis=1).shape[1]
        out.append(f"{where}step {s[a]}: {n} shapes, the pipeline needs one")
    if max_tokens is not None:
        for i in np.flatnonzero(r * t > max_tokens)[:10]:
            out.append(f"{where}step {s[i]}: shape {r[i]} x {t[i]} exceeds the budget {max_tokens}")
    return out


# ---- the planner's pipeline grouping: K micro-batches of one shape per (step, rank) --------------


@numba.njit(cache=True)
def _group_kernel(elens, bounds, k, fixed, bsize, budget):  # type: ignore[no-untyped-def]
    """Greedy groups per sorted segment, then each segment's tail topped up to ``k`` samples.

    A group takes consecutive samples while ``count <= k * rows(T)`` with ``T`` its longest
    effective length and ``rows(T) = budget // T`` (``bsize`` for fixed batching). Groups closed by
    that rule hold at least ``k`` samples; a segment's last group may hold fewer, so the group
    boundaries of the segment are shifted left (``start_j = min(start_j, start_{j+1} - k)``): in a
    sorted segment a group then only loses its longest samples or gains shorter ones, so every
    group still fits. Returns ``(starts, failed)``: ``failed`` is the first segment too small to
    give every group ``k`` samples (-1 if none).
    """
    n = elens.size
    starts = np.empty(n + 1, np.int64)
    g = 0
    for s in range(bounds.size - 1):
        a = bounds[s]
        b = bounds[s + 1]
        if a == b:
            continue
        first = g
        i = a
        while i < b:
            starts[g] = i
            g += 1
            cnt = 1
            t = elens[i]
            i += 1
            while i < b:
                t2 = max(t, elens[i])
                cap = k * (bsize if fixed else budget // t2)
                if cnt + 1 > cap:
                    break
                cnt += 1
                t = t2
                i += 1
        nxt = b
        for j in range(g - 1, first - 1, -1):
            if starts[j] > nxt - k:
                starts[j] = nxt - k
            nxt = starts[j]
        if starts[first] < a:
            return starts[: g + 1], s
    starts[g] = n
    return starts[: g + 1].copy(), -1


def step_groups(
    elens: np.ndarray,
    bounds: np.ndarray,
    k: int,
    budget: int | None,
    batch_size: int | None = None,
) -> tuple[np.ndarray | None, np.ndarray]:
    """(step, rank) groups of a stream for ``--pp``: ``(perm, starts)``.

    ``elens``: each sample's effective length (rounded to the pad multiple or to its chosen
    shape length), sorted within each segment ``bounds[j]:bounds[j+1]``. Every group fits
    ``k`` micro-batches of one shape (``ceil(count / k) * T <= budget``) and holds at least ``k``
    samples, so each of its ``k`` micro-batches gets one. A segment with too few samples joins
    the next one (the last joins the one before) and is re-sorted; ``perm`` (``None``: the
    identity) is that re-ordering of stream positions. Raises :class:`ConfigError` when the whole
    stream cannot give every group ``k`` samples.

    >>> perm, starts = step_groups(np.array([2, 2, 2, 3, 8, 8, 8]), np.array([0, 7]), 2, 8)
    >>> starts.tolist()  # greedy [2 2 2 3] [8 8] [8]: the short tail shifts the cuts left
    [0, 3, 5, 7]
    """
    e = np.ascontiguousarray(elens, dtype=np.int64)
    b = np.ascontiguousarray(bounds, dtype=np.int64)
    perm: np.ndarray | None = None
    fixed = batch_size is not None
    while True:
        starts, failed = _group_kernel(
            e, b, np.int64(k), fixed, np.int64(batch_size or 0), np.int64(budget or 0)
        )
        if failed < 0:
            return perm, starts
        if b.size <= 2:
            raise ConfigError(
                f"{e.size} samples cannot fill (step, rank) groups of --grad-accum {k} micro-batches "
                "of one shape each (--pp needs one sample per micro-batch); lower --grad-accum or "
                "raise --max-tokens"
            )
        # Merge the failing segment with its neighbour and sort the merged segment by length.
        drop = failed + 1 if failed + 1 < b.size - 1 else failed
        lo, hi = b[drop - 1], b[drop + 1]
        local = np.argsort(e[lo:hi], kind="stable") + lo
        step_perm = np.arange(e.size, dtype=np.int64)
        step_perm[lo:hi] = local
        e = e[step_perm]
        perm = step_perm if perm is None else perm[step_perm]
        b = np.delete(b, drop)


def expand_groups(
    group_offsets: np.ndarray,
    group_len: np.ndarray,
    k: int,
    rows_of: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each group into ``k`` micro-batches of one shape: ``(offsets, pad_to, pad_rows)``.

    A group of ``n >= k`` samples gives micro-batches of ``n // k`` or ``n // k + 1`` samples (the
    larger first), all with shape ``(rows, T)``: ``rows = ceil(n / k)`` or, with ``rows_of``
    (``--max-shapes``: rows fixed by the length), ``rows_of[g]``; the missing rows are ``pad_rows``.

    >>> off, t, pr = expand_groups(np.array([0, 5, 7]), np.array([8, 16]), 2)
    >>> off.tolist(), t.tolist(), pr.tolist()
    ([0, 3, 5, 6, 7], [8, 8, 16, 16], [0, 1, 0, 0])
    """
    goff = np.asarray(group_offsets, np.int64)
    n = np.diff(goff)
    g = np.repeat(np.arange(n.size), k)
    j = np.tile(np.arange(k, dtype=np.int64), n.size)
    size = n[g] // k + (j < n[g] % k)
    offsets = np.zeros(size.size + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    rows = -(-n // k) if rows_of is None else np.asarray(rows_of, np.int64)
    return offsets, np.asarray(group_len, np.int64)[g], (rows[g] - size).astype(np.int32)
