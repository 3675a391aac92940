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
from typing import NamedTuple

import numpy as np
from numba import njit

from varpack.errors import ConfigError
from varpack.plan.config import PlanConfig
from varpack.plan.cost import (
    linear_flops_per_token,
    micro_cost,
    model_dims,
    segment_cost_sums,
)
from varpack.plan.rules import LAYOUT_CODE, fits, pad_to
from varpack.plan.segments import segment_max, segment_sums
from varpack.plan.shapes import round_up_to


def oversize_mask(lens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Samples that do not fit the budget even alone (always none for fixed batching)."""
    if cfg.batching != "budget":
        return np.zeros(len(lens), dtype=bool)
    assert cfg.max_tokens is not None
    code = LAYOUT_CODE[cfg.layout]
    top = int(lens.max()) if len(lens) else 0
    if fits(1, top, top, code, cfg.pad_multiple, cfg.max_tokens):  # the rule grows with the length
        return np.zeros(len(lens), dtype=bool)
    one = np.ones(len(lens), dtype=np.int64)
    return ~fits(one, lens, lens, code, cfg.pad_multiple, cfg.max_tokens)


@njit(cache=True)
def _fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """May sample ``x`` join a micro-batch of ``cnt`` samples, ``tok`` tokens, longest ``mx``?"""
    if fixed:
        return cnt + 1 <= bsize
    return fits(cnt + 1, tok + x, max(mx, x), layout, multiple, budget)


@njit(cache=True)
def _greedy(lens, alone, buf, m, cap, fixed, bsize, layout, multiple, budget, out):  # type: ignore[no-untyped-def]
    """Pack ``buf[:m]`` greedily into at most ``cap`` micro-batches (0: no cap).

    Writes the local start of each micro-batch to ``out``; returns (micro-batches, items packed).
    """
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
        i += 1
        while i < m and not lone and not alone[buf[i]]:
            x = np.int64(lens[buf[i]])
            if not _fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget):
                break
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
def _pack_steps(lens, alone, bounds, cap, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """Pack each segment into exactly ``cap`` micro-batches (carrying the overflow forward)."""
    n = len(lens)
    perm = np.empty(n, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    buf = np.empty(n, dtype=np.int64)
    carry = np.empty(n, dtype=np.int64)
    local = np.empty(n + 2, dtype=np.int64)
    nc = 0
    k = 0
    p = 0
    nseg = len(bounds) - 1
    for s in range(nseg + 1):
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
        last = s >= nseg - 1
        nmb, used = _greedy(
            lens, alone, buf, m, 0 if last else cap, fixed, bsize, layout, multiple, budget, local
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
    starts[k] = n
    return perm, starts[: k + 1]


@njit(cache=True)
def _pack_free(lens, alone, bounds, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """No cap: greedy over each segment in place (no re-ordering, no buffers)."""
    n = len(lens)
    starts = np.empty(n + 1, dtype=np.int64)
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
            or not _fits_more(cnt, tok, mx, x, fixed, bsize, layout, multiple, budget)
        ):
            cnt = np.int64(0)
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
    lens: np.ndarray, bounds: np.ndarray, alone: np.ndarray, cfg: PlanConfig, cap: int = 0
) -> tuple[np.ndarray | None, np.ndarray]:
    """Micro-batches of a stream: ``(perm, offsets)``.

    The stream is re-ordered by ``perm`` (a permutation of its positions; ``None`` when packing
    keeps the order, always so without ``cap``); micro-batch ``i`` is
    re-ordered positions ``offsets[i]:offsets[i+1]``. Segments ``bounds[j]:bounds[j+1]`` pack on
    their own. With ``cap`` > 0 every segment but the last becomes exactly ``cap`` micro-batches
    (one step): what does not fit moves on to the next segment, a short one is split (the
    micro-batches with the most tokens, at their token midpoint) or, with too few samples, joins
    the next. ``alone[i]`` gives sample ``i`` a micro-batch of its own (``--oversize alone``).

    >>> from varpack.plan.config import PlanConfig
    >>> lens = np.array([3] * 10 + [7] * 4)
    >>> perm, off = pack(lens, np.array([0, 14]), np.zeros(14, bool), PlanConfig(max_tokens=30))
    >>> off.tolist()
    [0, 10, 14]
    """
    n = len(lens)
    if n == 0:
        return None, np.zeros(1, dtype=np.int64)
    if cap == 0:  # the stream order stands (perm None: the identity)
        return None, _pack_free(
            lens,
            np.ascontiguousarray(alone, dtype=np.bool_),
            np.ascontiguousarray(bounds, dtype=np.int64),
            cfg.batching == "fixed",
            np.int64(cfg.batch_size or 0),
            LAYOUT_CODE[cfg.layout],
            np.int64(cfg.pad_multiple),
            np.int64(cfg.max_tokens or 0),
        )
    return _pack_steps(
        np.ascontiguousarray(lens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        np.ascontiguousarray(bounds, dtype=np.int64),
        np.int64(cap),
        cfg.batching == "fixed",
        np.int64(cfg.batch_size or 0),
        LAYOUT_CODE[cfg.layout],
        np.int64(cfg.pad_multiple),
        np.int64(cfg.max_tokens or 0),
    )


class Micro(NamedTuple):
    """Per micro-batch figures (arrays of equal length) that costs, rules and stats need.

    ``rows``: rows of the shape (padded layout: samples + ``pad_rows``; blocks: blocks per
    micro-batch; packed: 1), so a micro-batch's shape is ``(rows, pad_to)``.
    """

    samples: np.ndarray
    tokens: np.ndarray
    max_len: np.ndarray
    pad_to: np.ndarray
    cost: np.ndarray
    rows: np.ndarray


def shape_rule(
    count: np.ndarray,
    tokens: np.ndarray,
    longest: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """``pad_to`` of micro-batches by the shape rule (the planner's and validate's one rule).

    :func:`varpack.plan.rules.pad_to` (the longest or the total, rounded to ``--pad-multiple``),
    then up to the smallest of the chosen ``lengths`` (``--max-shapes`` / ``--pack-to``); with
    ``--batching blocks`` it is the block length.

    >>> from varpack.plan.config import PlanConfig
    >>> cfg = PlanConfig(max_tokens=64, layout="padded", pad_multiple=4).resolved()
    >>> shape_rule(np.array([2, 1]), np.array([8, 9]), np.array([5, 9]), cfg, np.array([8, 16])).tolist()
    [8, 16]
    """
    if cfg.batching == "blocks":
        assert cfg.block_len is not None
        return np.full(len(count), cfg.block_len, dtype=np.int64)
    base = np.asarray(
        pad_to(count, tokens, longest, LAYOUT_CODE[cfg.layout], cfg.pad_multiple), dtype=np.int64
    )
    if lengths is None:
        return base
    return round_up_to(base, lengths)


def summarize(
    offsets: np.ndarray,
    lens: np.ndarray,
    cfg: PlanConfig,
    *,
    lengths: np.ndarray | None = None,
    pad_to: np.ndarray | None = None,
    pad_rows: np.ndarray | None = None,
) -> Micro:
    """Count, real tokens, longest, ``pad_to``, cost and rows of every micro-batch.

    Micro-batch ``i`` holds ``lens[offsets[i]:offsets[i+1]]`` (never empty). ``pad_to`` is the
    shape rule (:func:`shape_rule`, with the chosen ``lengths``) unless given (a pipeline step's
    common shape, read from a manifest); ``pad_rows`` adds empty rows to the padded shape.

    >>> from varpack.plan.config import PlanConfig
    >>> cfg = PlanConfig(max_tokens=16, pad_multiple=4)
    >>> m = summarize(np.array([0, 2, 3]), np.array([3, 5, 9]), cfg)
    >>> m.samples.tolist(), m.tokens.tolist(), m.pad_to.tolist()
    ([2, 1], [8, 9], [8, 12])
    """
    lens64 = np.asarray(lens, dtype=np.int64)
    count = np.diff(offsets).astype(np.int64)
    tokens = segment_sums(offsets, lens64)
    longest = segment_max(offsets, lens64)
    if pad_to is None:
        padded = shape_rule(count, tokens, longest, cfg, lengths)
    else:
        padded = np.asarray(pad_to, dtype=np.int64)
    if cfg.batching == "blocks":
        assert cfg.blocks_per_batch is not None
        rows = np.full(len(count), cfg.blocks_per_batch, dtype=np.int64)
    elif cfg.layout == "padded":
        rows = count if pad_rows is None else count + np.asarray(pad_rows, dtype=np.int64)
    else:
        rows = np.ones(len(count), dtype=np.int64)
    flops = None
    if cfg.cost == "flops" and (cfg.layout == "packed" or cfg.batching == "blocks"):
        flops = segment_cost_sums(offsets, lens64, cfg)
    if cfg.batching == "blocks" and cfg.cost == "flops":
        # Samples never attend across a reset: their own FLOPs plus the linear part of the padding.
        assert flops is not None
        cost = flops + linear_flops_per_token(model_dims(cfg)) * (rows * padded - tokens)
    else:
        cost = micro_cost(rows, tokens, padded, flops, cfg)
    return Micro(count, tokens, longest, padded, cost, rows)


def complete(
    offsets: np.ndarray,
    lens: np.ndarray,
    multiple: int,
    cost_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    where: str = "the data",
    min_size: int = 1,
) -> np.ndarray:
    """Split micro-batches until their number is a multiple of ``multiple`` (ROLL's way).

    The costliest micro-batches with two or more samples (``2 * min_size``: both halves keep
    ``min_size``) are split at their token midpoint, taken
    from the tail (the last partial step, widened by whole steps only while it holds too few
    samples), so earlier steps stay as packed. Splitting only shrinks micro-batches, so budgets
    still hold. ``cost_of(offsets, lens)`` scores micro-batches. Raises :class:`ConfigError` when
    even single-sample micro-batches cannot make up the count.

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
    first = m - m % multiple
    while spare[first] < need:
        first = max(first - multiple, 0)
    head, tail = offsets[: first + 1], offsets[first:] - offsets[first]
    tail_lens = lens[offsets[first] :]
    cum = np.concatenate(([0], np.cumsum(tail_lens, dtype=np.int64)))
    while need > 0:
        counts = np.diff(tail)
        cand = np.flatnonzero(counts >= 2 * min_size)
        cost = cost_of(tail, tail_lens)[cand]
        take = cand[np.lexsort((cand, -cost))[:need]]
        a, b = tail[take], tail[take + 1]
        mid = np.searchsorted(cum, (cum[a] + cum[b]) / 2.0)
        cut = np.clip(mid, a + min_size, b - min_size)
        tail = np.sort(np.concatenate((tail, cut)))
        need -= len(take)
    return np.concatenate((head[:-1], tail + offsets[first]))
