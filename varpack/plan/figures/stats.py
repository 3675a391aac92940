"""Figures that score a plan; the planner stores them in plan.json, ``inspect`` shows them and
``validate`` recomputes them from the manifests with these same functions.

* padding: real tokens vs the tokens the model processes (micro-batch volumes).
* budget fill: real tokens / (micro-batches x the token budget of one micro-batch): how much of
  the budget the plan uses (padding and the budget left empty at the end of each micro-batch both
  count against it; a micro-batch of one oversize sample, ``--oversize alone``, can exceed it).
* imbalance per step: slowest rank's cost / mean rank cost (mean and max over steps).
* time vs ideal: ``sum over steps of the slowest rank's cost`` divided by the ideal
  ``sum(sample_cost) / dp`` (real samples, no padding, perfect balance). It counts padding,
  imbalance and (with ``flops``) attention's quadratic cost on padded rows.
* mixing: mean over steps of the Kolmogorov-Smirnov distance between the step's length
  distribution and the whole plan's, evaluated at up to 127 quantiles of the lengths (0: every
  step looks like the dataset; sorted batching is close to 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from varpack.plan.figures.merge import WHOLE, Merge, length_histogram
from varpack.plan.kernels.inputs import frozen
from varpack.plan.rules import LAYOUT_CODE, volume
from varpack.plan.sync import SYNC_MODELS

#: what the estimated time sums, by the synchronisation model the plan was balanced for
WAITS = {
    "step": "ranks wait once a step: the slowest rank's sum over each step, summed over the steps",
    "micro": "ranks wait at every micro-batch: the slowest rank of each slot (micro-batch j of a "
    "step on every rank), summed over the slots",
}


def time_vs_ideal_legend(sync: str) -> str:
    """The one-line meaning of "time vs ideal" for a plan balanced under ``sync`` (``step`` or
    ``micro``), printed wherever the figure is.

    >>> time_vs_ideal_legend("step")  # doctest: +ELLIPSIS
    "time vs ideal = estimated time (ranks wait once a step: the slowest rank's sum over ...
    >>> sorted(WAITS) == sorted(SYNC_MODELS)  # every model has its words
    True
    """
    return (
        f"time vs ideal = estimated time ({WAITS[sync]}) / the ideal (no padding, perfect "
        "balance over the ranks); 1.000 is ideal"
    )


_BINS = 128
_CELLS = 1 << 24  # histogram cells per pass of the mixing computation
_CHUNK = 1 << 22  # samples per chunk
_PIECE = 1 << 18  # samples per piece of a chunk (temporaries the allocator reuses)


def mixing(
    sample_step: np.ndarray, sample_len: np.ndarray, num_steps: int, merge: Merge = WHOLE
) -> float:
    """Mean KS distance between each step's lengths and all lengths (see module doc); with a
    ``merge``, of the samples of every share (the root's figure; 0.0 elsewhere).

    >>> lens = np.array([1, 2, 3, 4] * 2)
    >>> mixing(np.array([0, 0, 0, 0, 1, 1, 1, 1]), lens, 2)  # each step = the dataset
    0.0
    >>> mixing(np.array([0, 0, 1, 1, 0, 0, 1, 1]), lens, 2)  # sorted halves
    0.5
    """
    lens = np.asarray(sample_len)
    values, counts = merge.histogram(*length_histogram(lens))
    n = int(counts.sum())
    if n == 0 or num_steps == 0:
        return 0.0
    cum = np.cumsum(counts)
    picks = np.searchsorted(cum, np.arange(1, _BINS) * n / _BINS)  # quantile positions
    edges = np.unique(values[np.minimum(picks, len(values) - 1)])
    edges = edges[edges < values[-1]]  # at the maximum both CDFs are 1
    if len(edges) == 0:
        return 0.0
    cdf = cum[np.searchsorted(values, edges)] / n  # F(edge) = P(len <= edge)
    # Bin of every length value (edges[b-1] < len <= edges[b]) by table lookup where lengths
    # are small ints (a binary search per sample costs seconds at 100 M samples).
    top = int(values[-1])
    table = np.empty(0, dtype=np.int32)
    if values[0] >= 0 and top <= (1 << 24):
        table = np.searchsorted(edges, np.arange(top + 1), side="left").astype(np.int32)
    nb = len(edges) + 1
    per_pass = max(1, _CELLS // nb)
    total = 0.0
    for lo in range(0, num_steps, per_pass):
        hi = min(num_steps, lo + per_pass)
        hist = np.zeros((hi - lo) * nb, dtype=np.int64)
        _step_histogram(frozen(sample_step), frozen(lens), edges, table, lo, hi, nb, hist)
        merged = merge.total(hist)
        if merged is None:
            continue
        hist2 = merged.reshape(hi - lo, nb)
        size = hist2.sum(axis=1)
        ecdf = np.cumsum(hist2[:, :-1], axis=1) / np.maximum(size, 1)[:, None]
        ks = np.abs(ecdf - cdf[None, :]).max(axis=1)
        total += float(ks[size > 0].sum())
    return total / num_steps


@njit(cache=True)
def _step_histogram(step, lens, edges, table, lo, hi, nb, hist):  # type: ignore[no-untyped-def]
    """Add 1 to ``hist[(step - lo) * nb + bin(len)]`` for every sample of a step in [lo, hi)."""
    for i in range(len(step)):
        s = np.int64(step[i])
        if s < lo or s >= hi:
            continue
        x = lens[i]
        b = table[x] if len(table) > 0 else np.searchsorted(edges, x)
        hist[(s - lo) * nb + b] += 1


def budget_fill(real_tokens: int, micro_batches: int, budget: int | None) -> float | None:
    """Real tokens / (micro-batches x budget tokens); ``None`` when the plan has no token budget.

    >>> budget_fill(780, 10, 100), budget_fill(5, 0, 100), budget_fill(5, 1, None)
    (0.78, 0.0, None)
    """
    if budget is None:
        return None
    return real_tokens / (micro_batches * budget) if micro_batches else 0.0


def fill_given_up(
    step_tokens: np.ndarray, micro_per_step: int, budget: int, last_steps: np.ndarray
) -> dict[str, float]:
    """How far each step's budget fill falls below the plan's median step: ``mean`` and
    ``max`` over the steps (each epoch's last step, which takes the rest, left out).

    A step that levels its ranks by giving a rank with a heavy sample lighter micro-batches
    holds fewer tokens than a step filled to the budget; this is the fill it gave up
    (``--balance-fill``). What packing leaves in every step lowers the median, not this (where
    most steps are full, such as long documents split to the budget at grad-accum 1, the
    other steps' packing slack counts too).

    >>> fill_given_up(np.array([8, 8, 4, 8, 1]), 1, 16, np.array([4]))
    {'mean': 0.0625, 'max': 0.25}
    """
    inner = np.ones(len(step_tokens), dtype=bool)
    inner[last_steps] = False
    if not inner.any() or budget <= 0:
        return {"mean": 0.0, "max": 0.0}
    fill = np.asarray(step_tokens, dtype=np.float64)[inner] / (micro_per_step * budget)
    short = np.maximum(np.median(fill) - fill, 0.0)
    return {"mean": float(short.mean()), "max": float(short.max())}


def chunked_sum(values: np.ndarray, fn: Any, merge: Merge = WHOLE) -> float:
    """``sum(fn(values))`` computed over chunks (no full-size temporary); with a ``merge``, of
    the values of every share in their global order (the root's figure; 0.0 elsewhere).

    ``fn`` is elementwise. Each chunk's values are computed in small pieces into one reused
    buffer (fresh large temporaries cost page faults), then summed as a whole chunk.

    >>> chunked_sum(np.arange(5), lambda x: x * 2.0)
    20.0
    """
    buf = np.empty(0, dtype=np.float64)

    def chunk_sum(chunk: np.ndarray) -> float:
        nonlocal buf
        n = len(chunk)
        if n > len(buf):
            buf = np.empty(n, dtype=np.float64)
        for c in range(0, n, _PIECE):
            d = min(c + _PIECE, n)
            buf[c:d] = fn(chunk[c:d])
        return float(buf[:n].sum())

    total = 0.0
    for value in merge.chunked(values, _CHUNK, chunk_sum) or []:
        total += value
    return total


def rank_shapes(rank: np.ndarray, rows: np.ndarray, pad_to: np.ndarray, dp: int) -> list[list[Any]]:
    """Distinct shapes each rank sees, LARGEST FIRST, as ``[rows, pad_to]`` (plan.json's format).

    ``rows``: 1 in the packed layout, samples + ``pad_rows`` padded, blocks per micro-batch with
    blocks. Shapes are ordered as :func:`varpack.plan.stages.warmup.encode_shapes` orders them.

    >>> rank_shapes(np.array([0, 0, 1]), np.array([1, 1, 1]), np.array([8, 16, 8]), 2)
    [[[1, 16], [1, 8]], [[1, 8]]]
    """
    from varpack.plan.stages.warmup import encode_shapes

    ids, table = encode_shapes(rows, pad_to)
    s = len(table)
    present = np.zeros(dp * s, dtype=bool)
    present[np.asarray(rank, np.int64) * s + ids] = True
    present2 = present.reshape(dp, s)
    return [table[np.flatnonzero(present2[r])[::-1]].tolist() for r in range(dp)]


_SHAPES_SHOWN = 64


def shape_stats(
    *,
    rows: np.ndarray,
    pad_to: np.ndarray,
    samples: np.ndarray,
    tokens: np.ndarray,
    pad_rows: np.ndarray,
    own_pad_to: np.ndarray,
    layout: str,
    pp: int,
    blocks: tuple[int, int] | None,
) -> dict[str, Any]:
    """Shape figures of plan.json's stats: the padding each shape costs, pp and block padding.

    ``shapes``: the distinct shapes of the plan, largest first (at most 64, then the rest summed in
    ``shapes_not_shown``), each with its micro-batches, real and padded tokens and padding;
    ``pad_rows`` / ``pad_row_tokens``: empty rows (empty blocks) and what they cost. With ``pp > 1``:
    ``pp_extra_padding``, the tokens beyond each micro-batch's own shape rule (its own longest
    or total, no empty rows), i.e. what one shape per (step, rank) costs. With blocks
    ``(block_len, blocks_per_batch)``: used and empty blocks and the padding inside used blocks.
    """
    from varpack.plan.stages.warmup import encode_shapes

    code = LAYOUT_CODE[layout]
    vol = np.asarray(volume(rows, pad_to, code), dtype=np.int64)
    ids, table = encode_shapes(rows, pad_to)
    s = len(table)
    count = np.bincount(ids, minlength=s)
    real = np.bincount(ids, weights=tokens, minlength=s).astype(np.int64)
    padded = np.bincount(ids, weights=vol, minlength=s).astype(np.int64)
    order = np.arange(s)[::-1]
    shown = [
        {
            "shape": table[i].tolist(),
            "micro_batches": int(count[i]),
            "real_tokens": int(real[i]),
            "padded_tokens": int(padded[i]),
            "padding": int(padded[i] - real[i]),
        }
        for i in order[:_SHAPES_SHOWN]
    ]
    rest = order[_SHAPES_SHOWN:]
    empty = np.asarray(pad_rows, dtype=np.int64)
    out: dict[str, Any] = {
        "num_shapes": int(s),
        "shapes": shown,
        "shapes_not_shown": {
            "shapes": int(len(rest)),
            "micro_batches": int(count[rest].sum()),
            "padding": int((padded[rest] - real[rest]).sum()),
        },
        "pad_rows": int(empty.sum()),
        "pad_row_tokens": int((empty * pad_to).sum()),
    }
    if pp > 1:
        own = np.asarray(volume(samples, own_pad_to, code), dtype=np.int64)
        extra = int(vol.sum() - own.sum())
        out["pp_extra_padding"] = extra
        out["pp_extra_padding_ratio"] = extra / int(vol.sum()) if vol.sum() else 0.0
    if blocks is not None:
        t, per = blocks
        used = rows - empty
        inside = int(used.sum()) * t - int(tokens.sum())
        out["blocks"] = {
            "block_len": t,
            "blocks_per_batch": per,
            "blocks": int(used.sum()),
            "empty_blocks": int(empty.sum()),
            "block_padding": inside,
            "block_padding_ratio": inside / (int(used.sum()) * t) if used.sum() else 0.0,
        }
    return out


def plan_stats(
    *,
    step: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    count: np.ndarray,
    tokens: np.ndarray,
    padded_len: np.ndarray,
    cost: np.ndarray,
    mixing: float,
    ideal_cost: float,
    lr: np.ndarray,
    step_samples: np.ndarray,
    step_tokens: np.ndarray,
    num_steps: int,
    dp: int,
    grad_accum: int,
    sync: str,
    layout: str,
    shapes: list[list[Any]],
) -> dict[str, Any]:
    """The stats block of plan.json (plain JSON types). Time and imbalance are scored under
    the plan's synchronisation model ``sync`` (:mod:`varpack.plan.sync`), and
    ``time_vs_ideal_by_sync`` under each one; ``micro``: each micro-batch's place on its rank
    in its step."""
    real = int(tokens.sum())
    padded = int(volume(count, padded_len, LAYOUT_CODE[layout]).sum())
    ideal = ideal_cost / dp
    times = {
        n: fn(step, rank, micro, cost, num_steps, dp, grad_accum) for n, fn in SYNC_MODELS.items()
    }
    by_sync = {n: float(t.sum()) / ideal if ideal else 1.0 for n, t in times.items()}
    peak = times[sync]
    # a step's time over its ranks' mean: the slowest rank's share (step), or what the slots'
    # slowest ranks add up to (micro)
    imbalance = peak / np.maximum(np.bincount(step, weights=cost, minlength=num_steps) / dp, 1e-300)
    est = float(peak.sum())
    return {
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_ratio": (padded - real) / padded if padded else 0.0,
        "num_micro_batches": int(len(step)),
        "micro_batches_per_rank": int(len(step) // dp),
        "imbalance_mean": float(imbalance.mean()) if num_steps else 1.0,
        "imbalance_max": float(imbalance.max()) if num_steps else 1.0,
        "est_time": est,
        "ideal_time": ideal,
        "time_vs_ideal": est / ideal if ideal else 1.0,
        "time_vs_ideal_by_sync": by_sync,
        "lr_factor_min": float(lr.min()) if num_steps else 1.0,
        "lr_factor_max": float(lr.max()) if num_steps else 1.0,
        "step_samples_min": int(step_samples.min()) if num_steps else 0,
        "step_samples_max": int(step_samples.max()) if num_steps else 0,
        "step_tokens_min": int(step_tokens.min()) if num_steps else 0,
        "step_tokens_max": int(step_tokens.max()) if num_steps else 0,
        "mixing": mixing,
        "shapes_per_rank": [len(s) for s in shapes],
    }
