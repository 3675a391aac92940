"""Bounded shapes: at most K padded lengths, chosen to minimise padding for this dataset.

A *shape* is what the model sees. In the padded layout it is ``(B, T)``: ``T`` the length every
sample of the micro-batch is padded to, ``B`` the number of rows. In the packed layout it is the
padded total of the micro-batch (``pad_to``). Static ``torch.compile`` builds one graph per shape,
so ``--max-shapes K`` bounds the number of distinct shapes a rank meets.

The lengths are chosen by :func:`choose_lengths`: an exact dynamic programme over the histogram of
the lengths (rounded up to ``--pad-multiple``) that minimises the total padding
``sum(bucket_len - len)``. Every sample (or, in the packed layout, every micro-batch total) is then
rounded up to its bucket with :func:`round_up_to`. In the padded layout with a token budget the
row count of a shape is fixed by its length, ``B = max_tokens // T`` (:func:`shape_batch_rows`),
and a micro-batch with fewer samples gets empty rows (``pad_rows``, :func:`pad_rows_for`) that
count as padding.

All lengths are in tokens (frames for video), as ``int64`` NumPy arrays.
"""

from __future__ import annotations

import numba
import numpy as np

from varpack.errors import ConfigError
from varpack.plan import rules

#: Above this many distinct rounded lengths the DP runs on log-spaced candidate boundaries
#: (consecutive candidates differ by a factor < (max/min) ** (1 / max_candidates): with the
#: default and lengths up to 1 M the extra padding this allows is below 0.03 %).
MAX_CANDIDATES = 1 << 16
#: Histograms up to this many bins use ``np.bincount`` (fast, linear); beyond it ``np.unique``.
_BINCOUNT_LIMIT = 1 << 24


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Round each length up to a multiple of ``multiple``.

    >>> round_up(np.array([1, 64, 65]), 64).tolist()
    [64, 64, 128]
    """
    if multiple < 1:
        raise ConfigError(f"--pad-multiple must be >= 1, got {multiple}")
    a = np.asarray(lengths, dtype=np.int64)
    if multiple == 1:
        return a
    return np.asarray(rules.round_up(a, multiple), dtype=np.int64)  # the one rounding rule


def length_histogram(lengths: np.ndarray, pad_multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths rounded up to ``pad_multiple`` (ascending) and how many samples have each.

    Vectorised: one ``bincount`` over the raw lengths when their maximum is moderate, so that
    100 M samples take a fraction of a second.

    >>> v, c = length_histogram(np.array([3, 5, 5, 9]), 4)
    >>> v.tolist(), c.tolist()
    ([4, 8, 12], [1, 2, 1])
    """
    a = np.asarray(lengths, dtype=np.int64)
    if a.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if int(a.min()) < 1:
        raise ConfigError("lengths must be positive to choose shapes")
    top = int(a.max())
    if top <= _BINCOUNT_LIMIT:
        counts = np.bincount(a, minlength=top + 1).astype(np.int64)
        if pad_multiple > 1:
            # Fold each raw length onto its rounded value: bin of length l is ceil(l / m).
            q = (np.arange(top + 1, dtype=np.int64) + pad_multiple - 1) // pad_multiple
            counts = np.bincount(q, weights=counts).astype(np.int64)
            values = np.arange(counts.size, dtype=np.int64) * pad_multiple
        else:
            values = np.arange(counts.size, dtype=np.int64)
        keep = counts > 0
        return values[keep], counts[keep]
    values, counts = np.unique(round_up(a, pad_multiple), return_counts=True)
    return values.astype(np.int64), counts.astype(np.int64)


@numba.njit(cache=True)
def _bucket_dp(values: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Exact minimum of sum(count * bucket_top) with k buckets (tops among ``values``).

    ``f[j][i]``: cheapest cover of the first i values with j buckets, the last topped by
    ``values[i-1]``; ``f[j][i] = min_p f[j-1][p] + values[i-1] * (C[i] - C[p])``. The bucket cost
    satisfies the quadrangle inequality ((v_c - v_d) * (C_b - C_a) <= 0), so the optimal split
    point is monotone in i and each layer is solved by divide and conquer in O(U log U).
    Returns the chosen tops' indices (ascending).
    """
    u = values.size
    cum = np.zeros(u + 1, np.int64)
    for i in range(u):
        cum[i + 1] = cum[i] + counts[i]
    big = np.iinfo(np.int64).max
    prev = np.full(u + 1, big, np.int64)
    for i in range(1, u + 1):
        prev[i] = values[i - 1] * cum[i]
    arg = np.zeros((k, u + 1), np.int64)
    cur = np.full(u + 1, big, np.int64)
    stack = np.zeros((4 * (u + 2), 4), np.int64)
    for j in range(1, k):
        cur[:] = big
        # Segments (lo, hi, opt_lo, opt_hi) of i to solve; i ranges over j+1..u.
        top = 0
        stack[0, 0] = j + 1
        stack[0, 1] = u
        stack[0, 2] = j
        stack[0, 3] = u - 1
        top = 1
        while top > 0:
            top -= 1
            lo = stack[top, 0]
            hi = stack[top, 1]
            olo = stack[top, 2]
            ohi = stack[top, 3]
            if lo > hi:
                continue
            mid = (lo + hi) // 2
            best = big
            bp = olo
            last = min(mid - 1, ohi)
            for p in range(olo, last + 1):
                if prev[p] == big:
                    continue
                c = prev[p] + values[mid - 1] * (cum[mid] - cum[p])
                if c < best:
                    best = c
                    bp = p
            cur[mid] = best
            arg[j, mid] = bp
            stack[top, 0] = lo
            stack[top, 1] = mid - 1
            stack[top, 2] = olo
            stack[top, 3] = bp
            top += 1
            stack[top, 0] = mid + 1
            stack[top, 1] = hi
            stack[top, 2] = bp
            stack[top, 3] = ohi
            top += 1
        prev[:] = cur
    tops = np.zeros(k, np.int64)
    i = u
    for j in range(k - 1, -1, -1):
        tops[j] = i - 1
        i = arg[j, i] if j > 0 else 0
    return tops


def _candidates(
    values: np.ndarray, counts: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Compress a histogram to at most ``limit`` log-spaced candidate tops (actual values)."""
    if values.size <= limit:
        return values, counts
    g = np.geomspace(float(values[0]), float(values[-1]), limit)
    idx = np.unique(np.searchsorted(values, g, side="right") - 1)
    idx = np.union1d(idx[idx >= 0], [values.size - 1])
    tops = values[idx]
    # Every value goes up to the next candidate; candidates are real values, so the ratio
    # candidate / value is below one geometric step.
    grp = np.searchsorted(tops, values, side="left")
    return tops, np.bincount(grp, weights=counts, minlength=tops.size).astype(np.int64)


def choose_lengths(
    lengths: np.ndarray,
    k: int,
    pad_multiple: int = 1,
    *,
    counts: np.ndarray | None = None,
    max_candidates: int = MAX_CANDIDATES,
) -> np.ndarray:
    """At most ``k`` padded lengths minimising the total padding ``sum(bucket_len - len)``.

    ``lengths``: every sample's length (tokens), or, with ``counts``, the distinct lengths of a
    histogram and their counts. Returns the chosen lengths, ascending, ``int64``: multiples of
    ``pad_multiple``, the largest equal to the longest length rounded up. Exact over the distinct
    rounded lengths (at most ``max_candidates`` of them; beyond that they are first compressed to
    log-spaced candidate boundaries, see :data:`MAX_CANDIDATES`). Deterministic: ties go to the
    smallest split point.

    >>> choose_lengths(np.array([1, 2, 3, 10, 11, 12]), 2).tolist()
    [3, 12]
    >>> choose_lengths(np.array([5, 70, 130]), 8, pad_multiple=64).tolist()
    [64, 128, 192]
    """
    if k < 1:
        raise ConfigError(f"--max-shapes must be >= 1, got {k}")
    if counts is None:
        values, cnt = length_histogram(lengths, pad_multiple)
    else:
        v = round_up(np.asarray(lengths, dtype=np.int64), pad_multiple)
        values, inv = np.unique(v, return_inverse=True)
        cnt = np.bincount(inv.ravel(), weights=np.asarray(counts, dtype=np.int64))
        values, cnt = values[cnt > 0], cnt[cnt > 0].astype(np.int64)
    if values.size == 0:
        raise ConfigError("cannot choose shapes for an empty input")
    if values.size <= k:
        return values.astype(np.int64)
    values, cnt = _candidates(values, cnt, max_candidates)
    if values.size <= k:
        return values.astype(np.int64)
    tops = _bucket_dp(values.astype(np.int64), cnt.astype(np.int64), int(k))
    return values[tops].astype(np.int64)


def round_up_to(lengths: np.ndarray, choices: np.ndarray) -> np.ndarray:
    """The smallest choice >= each length (``choices`` ascending).

    >>> round_up_to(np.array([1, 3, 4, 12]), np.array([3, 12])).tolist()
    [3, 3, 12, 12]
    """
    a = np.asarray(lengths, dtype=np.int64)
    c = np.asarray(choices, dtype=np.int64)
    if a.size == 0:
        return a.copy()
    if int(a.max()) > int(c[-1]):
        raise ConfigError(
            f"a length of {int(a.max())} exceeds the largest shape length {int(c[-1])}; "
            "choose the shapes from the same data"
        )
    if a.size > 4 * c[-1] and c[-1] <= _BINCOUNT_LIMIT and int(a.min()) >= 0:
        # A lookup table per length is ~30x faster than a binary search per sample.
        table = c[np.searchsorted(c, np.arange(c[-1] + 1, dtype=np.int64), side="left")]
        return table[a]
    return c[np.searchsorted(c, a, side="left")]


def padding_of(lengths: np.ndarray, choices: np.ndarray) -> int:
    """Total padding ``sum(round_up_to(len) - len)``, the objective :func:`choose_lengths` minimises.

    >>> padding_of(np.array([1, 2, 3, 10, 11, 12]), np.array([3, 12]))
    6
    """
    a = np.asarray(lengths, dtype=np.int64)
    return int(round_up_to(a, choices).sum() - a.sum())


def shape_batch_rows(t_choices: np.ndarray, max_tokens: int) -> np.ndarray:
    """Rows ``B = max_tokens // T`` of each padded shape under a token budget.

    >>> shape_batch_rows(np.array([512, 1000, 4096]), 4096).tolist()
    [8, 4, 1]
    """
    t = np.asarray(t_choices, dtype=np.int64)
    if t.size and int(t.max()) > max_tokens:
        raise ConfigError(
            f"shape length {int(t.max())} exceeds --max-tokens {max_tokens}; raise the budget "
            "or lower --pad-multiple (samples longer than the budget follow --oversize)"
        )
    return max_tokens // t


def pad_rows_for(pad_to: np.ndarray, n_rows: np.ndarray, max_tokens: int) -> np.ndarray:
    """Empty rows that fill each padded micro-batch to its shape ``(max_tokens // pad_to, pad_to)``.

    ``n_rows``: samples in each micro-batch. Returned as ``int32`` (the manifest's ``pad_rows``).

    >>> pad_rows_for(np.array([512, 512]), np.array([8, 3]), 4096).tolist()
    [0, 5]
    """
    rows = shape_batch_rows(pad_to, max_tokens)
    n = np.asarray(n_rows, dtype=np.int64)
    if np.any(n > rows):
        i = int(np.argmax(n > rows))
        raise ConfigError(
            f"micro-batch {i} has {int(n[i])} rows of {int(np.asarray(pad_to)[i])} tokens, "
            f"over the budget {max_tokens}"
        )
    return (rows - n).astype(np.int32)


def padded_tokens(
    pad_to: np.ndarray, n_rows: np.ndarray, pad_rows: np.ndarray | None = None
) -> int:
    """Tokens the model computes in the padded layout: ``sum((rows + pad_rows) * pad_to)``.

    >>> padded_tokens(np.array([512, 1024]), np.array([8, 3]), np.array([0, 1]))
    8192
    """
    rows = np.asarray(n_rows, dtype=np.int64)
    if pad_rows is not None:
        rows = rows + np.asarray(pad_rows, dtype=np.int64)
    return int((rows * np.asarray(pad_to, dtype=np.int64)).sum())


def pack_to(totals: np.ndarray, length: int) -> np.ndarray:
    """``--pack-to L``: every packed micro-batch is padded to exactly ``L`` tokens.

    ``totals``: real tokens of each packed micro-batch. Returns the ``pad_to`` column (all ``L``,
    ``int32``); the padding is ``L * n - sum(totals)``. A micro-batch over ``L`` is a planning
    error (the budget must be <= L).

    >>> pack_to(np.array([4000, 4096]), 4096).tolist()
    [4096, 4096]
    """
    t = np.asarray(totals, dtype=np.int64)
    if t.size and int(t.max()) > length:
        raise ConfigError(
            f"a packed micro-batch holds {int(t.max())} tokens, over --pack-to {length}; "
            "use --max-tokens <= --pack-to"
        )
    return np.full(t.size, length, dtype=np.int32)


@numba.njit(cache=True)
def _greedy_sorted(eff: np.ndarray, max_tokens: int) -> np.ndarray:
    starts = np.empty(eff.size + 1, np.int64)
    nb = 0
    i = 0
    n = eff.size
    while i < n:
        starts[nb] = i
        nb += 1
        j = i + 1
        # eff is non-decreasing: the micro-batch's T is its last sample's length.
        while j < n and (j + 1 - i) * eff[j] <= max_tokens:
            j += 1
        i = j
    starts[nb] = n
    return starts[: nb + 1].copy()


def curriculum_padded_batches(eff_sorted: np.ndarray, max_tokens: int) -> np.ndarray:
    """Micro-batch boundaries of consecutive sorted samples in the padded layout.

    ``eff_sorted``: padded lengths (``round_up`` or :func:`round_up_to`), non-decreasing. A
    micro-batch grows while ``rows * longest <= max_tokens``. Returns offsets (``n_mb + 1``).
    This is the curriculum-order reference used for the shape figures; the planner has its own.

    >>> curriculum_padded_batches(np.array([2, 2, 3, 3, 8]), 8).tolist()
    [0, 2, 4, 5]
    """
    e = np.asarray(eff_sorted, dtype=np.int64)
    if e.size and int(e.max()) > max_tokens:
        raise ConfigError(f"a length of {int(e.max())} exceeds the budget {max_tokens}")
    return _greedy_sorted(e, int(max_tokens))


def padded_layout_padding(
    lens_sorted: np.ndarray, max_tokens: int, pad_multiple: int = 1, max_shapes: int | None = None
) -> tuple[float, int]:
    """Padding ratio and shape count of a curriculum-order padded plan (sorted lengths).

    Unbounded (``max_shapes=None``): each micro-batch is ``rows x longest`` (rounded up to the
    pad multiple). Bounded: lengths go up to :func:`choose_lengths` buckets and every micro-batch
    is a full ``(max_tokens // T, T)`` shape, the missing rows counted as padding.

    >>> padded_layout_padding(np.array([2, 2, 3, 3, 8]), 8)[1]
    3
    """
    lens = np.asarray(lens_sorted, dtype=np.int64)
    if max_shapes is None:
        eff = round_up(lens, pad_multiple)
    else:
        eff = round_up_to(lens, choose_lengths(lens, max_shapes, pad_multiple))
    off = curriculum_padded_batches(eff, max_tokens)
    t = eff[off[1:] - 1]
    n = np.diff(off)
    pad_rows = None if max_shapes is None else pad_rows_for(t, n, max_tokens)
    total = padded_tokens(t, n, pad_rows)
    rows = n if pad_rows is None else n + pad_rows
    shapes = np.unique(np.stack([rows, t]), axis=1).shape[1]
    return 1.0 - float(lens.sum()) / total, int(shapes)


def check_shape_bound(
    rows: np.ndarray, pad_to: np.ndarray, max_shapes: int, rank: int | None = None
) -> list[str]:
    """Violations of ``--max-shapes`` on one rank: more than ``max_shapes`` distinct shapes.

    ``rows``: rows of each micro-batch (padded layout: samples + ``pad_rows``; packed: pass 1s);
    ``pad_to``: the manifest's ``pad_to``. Returns human-readable lines (empty if fine).

    >>> check_shape_bound(np.array([4, 4, 2]), np.array([8, 8, 16]), 2)
    []
    >>> check_shape_bound(np.array([4, 2, 1]), np.array([8, 16, 32]), 2, rank=3)
    ['rank 3: 3 distinct shapes, over --max-shapes 2']
    """
    where = "" if rank is None else f"rank {rank}: "
    if np.asarray(pad_to).size == 0:
        return []
    pairs = np.stack([np.asarray(rows, np.int64), np.asarray(pad_to, np.int64)])
    n = np.unique(pairs, axis=1).shape[1]
    if n > max_shapes:
        return [f"{where}{n} distinct shapes, over --max-shapes {max_shapes}"]
    return []


def check_fits_shape(
    offsets: np.ndarray,
    seq_lens: np.ndarray,
    pad_to: np.ndarray,
    layout: str,
    pad_rows: np.ndarray | None = None,
    max_tokens: int | None = None,
    rank: int | None = None,
) -> list[str]:
    """Violations of "every sample fits its shape" for one rank's micro-batches.

    ``offsets`` (``n_mb + 1``) cut ``seq_lens`` (flat, execution order) into micro-batches.
    Padded layout: every length <= its ``pad_to`` and, with ``max_tokens``,
    ``(rows + pad_rows) * pad_to <= max_tokens``. Packed: the sum of lengths <= ``pad_to``.

    >>> off = np.array([0, 2, 3])
    >>> check_fits_shape(off, np.array([3, 4, 9]), np.array([4, 8]), "padded")
    ['micro-batch 1: a sample of length 9 exceeds pad_to 8']
    >>> check_fits_shape(off, np.array([3, 4, 9]), np.array([7, 9]), "packed")
    []
    """
    where = "" if rank is None else f"rank {rank} "
    off = np.asarray(offsets, np.int64)
    lens = np.asarray(seq_lens, np.int64)
    t = np.asarray(pad_to, np.int64)
    n = np.diff(off)
    out: list[str] = []
    nonempty = n > 0
    starts = off[:-1][nonempty]
    if layout == "padded":
        longest = np.zeros(n.size, np.int64)
        if lens.size:
            longest[nonempty] = np.maximum.reduceat(lens, starts)
        for i in np.flatnonzero(longest > t)[:10]:
            out.append(
                f"{where}micro-batch {i}: a sample of length {longest[i]} exceeds pad_to {t[i]}"
            )
        if max_tokens is not None:
            rows = n + (0 if pad_rows is None else np.asarray(pad_rows, np.int64))
            for i in np.flatnonzero(rows * t > max_tokens)[:10]:
                out.append(
                    f"{where}micro-batch {i}: shape {rows[i]} x {t[i]} exceeds the budget "
                    f"{max_tokens}"
                )
    else:
        total = np.zeros(n.size, np.int64)
        if lens.size:
            total[nonempty] = np.add.reduceat(lens, starts)
        for i in np.flatnonzero(total > t)[:10]:
            out.append(f"{where}micro-batch {i}: {total[i]} tokens exceed pad_to {t[i]}")
    return out
