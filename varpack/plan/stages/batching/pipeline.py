"""Pipeline-parallel steps: one shape per (step, rank) and a micro-batch count that is a multiple of P.

With pipeline parallelism (``--pp P``) activations flow between stages with a fixed shape during a
step's gradient accumulation, so every micro-batch of a step on a rank must have the same shape
``(B, T)`` (the blog's rule), and the schedule wants a number of micro-batches that is a multiple
of P. The planner keeps exactly ``grad_accum`` micro-batches per step and rank (a multiple of P,
checked by the config) and, in the padded layout, forms (step, rank) *groups* of samples that fit
``grad_accum`` micro-batches of one shape (:func:`step_groups`), then cuts each group
(:func:`expand_groups`); :func:`check_pipeline_steps` is the rule ``validate`` applies.

As a batching strategy (:func:`build`): with ``--pp`` in the padded layout, per epoch the order
stage gives windows sorted by length, :func:`step_groups` cuts them into (step, rank) groups, a
shuffled order deals each window's groups to its steps in a snake, and the groups are cut into
``grad_accum`` micro-batches of the group's shape.

Arrays: micro-batches are described by ``offsets`` (``n_mb + 1``) into flat per-sample arrays in
execution order; a *group* is one (step, rank), its micro-batches contiguous. Lengths in tokens.
"""

from __future__ import annotations

import numba
import numpy as np

from varpack.errors import ConfigError
from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.order import snake
from varpack.plan.kernels.pack import complete
from varpack.plan.segments import gather_positions, segment_max, segment_sums
from varpack.plan.stages.batching.common import (
    EpochJoiner,
    effective_lengths,
    epoch_order,
    order_rule,
    tokens_per_micro,
)
from varpack.plan.stages.shaping import shape_rows


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
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(step, rank) groups of a stream for ``--pp``: ``(perm, starts, bounds)``.

    ``elens``: each sample's effective length (rounded to the pad multiple or to its chosen
    shape length), sorted within each segment ``bounds[j]:bounds[j+1]``. Every group fits
    ``k`` micro-batches of one shape (``ceil(count / k) * T <= budget``) and holds at least ``k``
    samples, so each of its ``k`` micro-batches gets one. A segment with too few samples joins
    the next one (the last joins the one before) and is re-sorted; ``perm`` (``None``: the
    identity) is that re-ordering of stream positions, ``bounds`` the segments after merging.
    Raises :class:`ConfigError` when the whole
    stream cannot give every group ``k`` samples.

    >>> perm, starts, _ = step_groups(np.array([2, 2, 2, 3, 8, 8, 8]), np.array([0, 7]), 2, 8)
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
            return perm, starts, b
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


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # always None: --oversize split is refused here
) -> Batches:
    """(step, rank) groups of ``grad_accum`` micro-batches of one shape, all epochs."""
    k, dp = cfg.grad_accum, cfg.dp
    eff = effective_lengths(lens, cfg, lengths)
    fixed = cfg.batching == "fixed"
    joined = EpochJoiner()
    orule = order_rule(cfg, tokens_per_micro(eff, np.zeros(len(lens), bool), cfg, cfg.pack_rule()))
    for epoch in range(cfg.epochs):
        idx, bounds = epoch_order(lens, cfg, epoch, "windows", orule)
        perm, starts, bounds = step_groups(
            eff[idx],
            bounds,
            k,
            None if fixed else cfg.max_tokens,
            cfg.batch_size if fixed else None,
        )
        if perm is not None:
            idx = idx[perm]
        if cfg.order == "shuffle":
            idx, starts = _deal_groups(idx, starts, bounds, dp)
        starts = complete(
            starts,
            lens[idx],
            dp,
            lambda o, v: segment_sums(o, v).astype(np.float64),
            f"epoch {epoch}",
            min_size=k,
        )
        joined.add(epoch, idx, starts, dp)  # a (step, rank) group per rank and step
    stream, goff, gstep = joined.join()
    t = segment_max(goff, eff[stream])
    rows_of = shape_rows(t, cfg) if cfg.max_shapes is not None else None
    offsets, pad_to, pad_rows = expand_groups(goff, t, k, rows_of)
    return Batches(stream, offsets, np.repeat(gstep, k), joined.epochs, pad_to, pad_rows, None, k)


def _deal_groups(
    idx: np.ndarray, starts: np.ndarray, bounds: np.ndarray, dp: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deal each window's groups (cut in length order) to its steps in a snake, ``dp`` per step.

    Groups keep their samples; only their order changes, so consecutive ``dp`` groups (a step)
    come from across the window's lengths.
    """
    g = len(starts) - 1
    win = np.searchsorted(bounds, starts[:-1], side="right") - 1
    j = np.arange(g) - np.searchsorted(win, win, side="left")
    per_win = np.bincount(win)[win]
    slot = snake(j, np.maximum(1, (per_win + dp // 2) // dp))
    go = np.lexsort((j, slot, win))
    pos, new_starts = gather_positions(starts[go], np.diff(starts)[go])
    return idx[pos], new_starts
