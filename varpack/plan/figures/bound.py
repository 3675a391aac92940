"""A lower bound on a plan's time: what no composition of its windows' samples can beat.

A plan's estimated time sums, over steps, its slowest rank's cost. Over a step's ``dp`` ranks
(*slots*, ``K`` micro-batches each) that is the step's cost over ``dp`` plus the time the other
ranks wait (*idle*) over ``dp``; so ``time = ideal + idle / dp`` exactly. The bound keeps each
window of ``--shuffle-window`` steps to its own samples and bounds the idle any composition of
them into steps must leave:

* a *long* sample (more than half of the most real tokens a micro-batch holds) takes a
  micro-batch of its own, and its step lasts at least its cost, plus ``K - 1`` micro-batches of
  at least the plan's cheapest sample on its rank;
* a rank without a long sample holds at most ``K`` budgets of the other samples, and costs at
  most those tokens priced at the longest of them (attention grows with the length, so the
  costliest tokens are the longest samples'); with ``K = 1`` a rank with a long sample carries
  at most the rest of its budget so;
* grouping the long samples into steps as sorted runs is optimal for this relaxation (swapping
  two samples out of order never lowers it), so a small DP over runs gives the least idle
  (:mod:`varpack.plan.kernels.runs`);
* that relaxation fills every rank from the costliest light tokens on its own, so ranks may
  count the same samples twice; at ``K = 1`` the light samples are also taken as one pool
  shared by every rank of the long samples' steps (:func:`~varpack.plan.kernels.runs.pooled`),
  and the larger of the two bounds holds.

``ideal + least idle / dp`` over the ideal is :func:`time_bound`. It holds in every layout (a
step lasts at least its real samples' costs) and needs only the samples of each step, so
``validate`` recomputes it from the manifests. At ``K = 1`` it depends on how many long samples a
window holds: a window holding a whole group of ``dp`` per step can be balanced, a few cannot.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from varpack.plan.figures.merge import WHOLE, Merge, length_histogram
from varpack.plan.kernels.runs import capacities, pooled, runs

_BINS_PER_OCTAVE = 16


def length_bins(lens: np.ndarray) -> np.ndarray:
    """Log-spaced bin of each length (16 per octave); :func:`bin_top` bounds a bin's lengths.

    >>> length_bins(np.array([1, 2, 3, 1024])).tolist()
    [0, 16, 25, 160]
    """
    x = np.asarray(lens, dtype=np.float64)
    return np.floor(np.log2(np.maximum(x, 1.0)) * _BINS_PER_OCTAVE + 1e-9).astype(np.int64)


def bin_top(b: np.ndarray) -> np.ndarray:
    """A length no sample of bin ``b`` exceeds.

    >>> bool((bin_top(length_bins(np.arange(1, 5000))) >= np.arange(1, 5000)).all())
    True
    """
    return np.ceil(2.0 ** ((np.asarray(b, dtype=np.float64) + 1) / _BINS_PER_OCTAVE))


@njit(cache=True)
def _window_idle(c_long, x_long, tok, top, low_tok, low_top, eps, dp, k, cap, lin, quad):  # type: ignore[no-untyped-def]
    """Least idle of one window (its long samples costliest first), by a DP over sorted runs."""
    if len(c_long) == 0:
        return 0.0
    full, beside = capacities(c_long, x_long, tok, top, low_tok, low_top, dp, k, cap, lin, quad)
    idle, _ = runs(c_long, full, beside, eps, dp, k, dp if k == 1 else dp * k)
    if k == 1:  # both relaxations hold: the larger bound
        idle = max(idle, pooled(c_long, x_long, tok, top, low_tok, low_top, dp, cap, lin, quad))
    return idle


@njit(cache=True)
def _all_windows(
    lo, c_long, x_long, lo_bin, b_tok, b_top, low_tok, low_top, eps, dp, k, cap, lin, quad
):  # type: ignore[no-untyped-def]
    """Sum of :func:`_window_idle` over windows; window ``w``'s long samples are
    ``lo[w]:lo[w+1]`` and its light bins ``lo_bin[w]:lo_bin[w+1]`` (longest first)."""
    total = 0.0
    for w in range(len(lo) - 1):
        a, b = lo[w], lo[w + 1]
        p, q = lo_bin[w], lo_bin[w + 1]
        total += _window_idle(c_long[a:b], x_long[a:b], b_tok[p:q], b_top[p:q], low_tok[w],
                              low_top, eps, dp, k, cap, lin, quad)  # fmt: skip
    return total


def window_of_steps(epochs: list[tuple[int, int]], num_steps: int, window: int) -> np.ndarray:
    """Each step's window: ``window`` consecutive steps, counted afresh in every epoch.

    >>> window_of_steps([(0, 5), (5, 3)], 8, 2).tolist()
    [0, 0, 1, 1, 2, 3, 3, 4]
    """
    out = np.zeros(num_steps, dtype=np.int64)
    base = 0
    for first, count in epochs:
        out[first : first + count] = base + np.arange(count, dtype=np.int64) // window
        base += -(-count // window)
    return out


def time_bound(
    *,
    sample_step: np.ndarray,
    sample_len: np.ndarray,
    step_tokens: np.ndarray,
    epochs: list[tuple[int, int]],
    window: int,
    dp: int,
    k: int,
    cap: int,
    coeffs: tuple[float, float],
    ideal_cost: float,
    merge: Merge = WHOLE,
    exact: Callable[[np.ndarray], np.ndarray] | None = None,
) -> float:
    """The bound over the ideal (1.0: no composition of these windows need leave a rank idle).

    ``epochs``: ``(first_step, num_steps)`` of each epoch; ``cap``: the most real tokens a
    micro-batch holds; ``coeffs``: a sample of ``x`` tokens costs ``lin * x + quad * x^2``;
    ``ideal_cost``: the plan's samples' cost (``dp`` times the ideal). ``exact``: the cost of
    samples of the given lengths, where ``coeffs`` only bound it from above (a model with
    sliding windows, :func:`varpack.plan.cost.bound_coefficients`): the long samples and the
    shortest one are then priced exactly, the light tokens others carry at most by ``coeffs``,
    so the bound still holds. With a ``merge``, of the
    samples of every share (the root's figure; 1.0 elsewhere): shares add up their light tokens
    per window and length bin, and send their long samples.

    One long sample (cost 100^2) among short ones (10^2 each), two ranks: the other rank of its
    step carries at most 100 short tokens, so the step waits; no plan reaches 1.0:

    >>> one = dict(epochs=[(0, 2)], window=2, dp=2, k=1, cap=100, coeffs=(0.0, 1.0))
    >>> lens = np.array([100, 10, 10, 10, 10, 10])
    >>> b = time_bound(sample_step=np.array([0, 0, 0, 1, 1, 1]), sample_len=lens,
    ...                step_tokens=np.array([120, 30]), ideal_cost=10500.0, **one)
    >>> round(b, 3)
    1.9
    """
    lin, quad = float(coeffs[0]), float(coeffs[1])
    num_steps = len(step_tokens)
    values, counts = merge.histogram(*length_histogram(np.asarray(sample_len)))
    if num_steps == 0 or ideal_cost <= 0 or len(values) == 0:
        return 1.0
    win = window_of_steps(epochs, num_steps, max(window, 1))
    nwin = int(win.max()) + 1
    low = _light_floor(values, counts, cap, window)
    light = values[(values > low) & (2 * values <= cap)]  # every share's, so bins agree
    b0 = int(length_bins(light).min()) if len(light) else 0
    nb = int(length_bins(light).max()) - b0 + 1 if len(light) else 1
    longs, mine = _priced(sample_step, sample_len, win, nwin, low, cap, b0, nb)
    xl, wl, tok = merge.join(longs[0]), merge.join(longs[1]), merge.total(mine)
    if tok is None or xl is None or wl is None:
        return 1.0
    tok = tok.reshape(nwin, nb)
    order = np.lexsort((-xl, wl))
    xl, wl = xl[order], wl[order]
    lo = np.searchsorted(wl, np.arange(nwin + 1))
    win_tok = np.bincount(win, weights=step_tokens, minlength=nwin)
    low_tok = win_tok - tok.sum(axis=1) - np.bincount(wl, weights=xl, minlength=nwin)
    tok = tok[:, ::-1]  # longest bin first
    top = np.minimum(bin_top(np.arange(b0 + nb - 1, b0 - 1, -1)), cap / 2)
    wi, bi = np.nonzero(tok > 0)
    lo_bin = np.searchsorted(wi, np.arange(nwin + 1))
    shortest = float(values[0])
    if exact is None:
        c_long, c_short = lin * xl + quad * xl * xl, lin * shortest + quad * shortest**2
    else:
        c_long = np.asarray(exact(xl), dtype=np.float64)
        c_short = float(exact(np.array([shortest]))[0])
    idle = _all_windows(lo, c_long, xl, lo_bin, tok[wi, bi], top[bi], np.maximum(low_tok, 0.0),
                        float(low), c_short, dp, k, float(cap), lin, quad)  # fmt: skip
    return 1.0 + float(idle) / ideal_cost


_PIECE = 1 << 20  # samples per piece of the sums below (bounded temporaries)


def _priced(
    sample_step: np.ndarray,
    sample_len: np.ndarray,
    win: np.ndarray,
    nwin: int,
    low: int,
    cap: int,
    b0: int,
    nb: int,
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The samples priced at their own length (longer than ``low``): the long ones' lengths and
    windows, and the others' tokens per (window, length bin), summed piece by piece (sums of
    integers: exact)."""
    tok = np.zeros(nwin * nb, dtype=np.float64)
    xl, wl = [np.zeros(0, np.float64)], [np.zeros(0, np.int64)]
    for a in range(0, len(sample_len), _PIECE):
        lens = sample_len[a : a + _PIECE]
        pick = np.flatnonzero(lens > low)
        x = np.asarray(lens[pick], dtype=np.float64)
        w = win[sample_step[a : a + _PIECE][pick]]
        is_long = 2 * x > cap
        xl.append(x[is_long])
        wl.append(w[is_long])
        xs, ws = x[~is_long], w[~is_long]
        if len(xs):
            tok += np.bincount(ws * nb + (length_bins(xs) - b0), weights=xs, minlength=nwin * nb)
    return (np.concatenate(xl), np.concatenate(wl)), tok


def _light_floor(values: np.ndarray, counts: np.ndarray, cap: int, window: int) -> int:
    """A length at which the shorter samples are priced (an upper bound on their cost per token):
    the lower edge of the octave of lengths where about three windows' worth of the longest
    tokens end. Any floor keeps the bound valid (it only loosens it); this one depends on the
    lengths alone (``values`` and their ``counts``), not their order, so the planner and
    ``validate`` agree.

    >>> _light_floor(np.array([3, 100, 1000]), np.array([1, 2, 1]), 4096, 8)  # 3/8: the 1000
    512
    """
    tokens = _octave_tokens(values, counts)
    from_top = np.cumsum(tokens[::-1])[::-1]  # tokens at this octave and above
    need = min(1.0, 3.0 / max(window, 1)) * from_top[0]
    e = int(np.flatnonzero(from_top >= need)[-1])
    return int(max(1, min(2 ** max(e - 1, 0), cap // 2)))


def _octave_tokens(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Tokens of the lengths in each octave ``e`` (``x`` in ``[2^(e-1), 2^e)``); sums of
    integers, exact as floats below 2^53.

    >>> _octave_tokens(np.array([1, 2, 3, 4]), np.ones(4, np.int64)).tolist()[:4]
    [0.0, 1.0, 5.0, 4.0]
    """
    v = np.asarray(values, dtype=np.int64)
    octave = np.zeros(len(v), dtype=np.int64)
    rest = v.copy()
    while (rest > 0).any():
        octave += rest > 0
        rest >>= 1
    out = np.zeros(65)
    np.add.at(out, octave, (v * np.asarray(counts, dtype=np.int64)).astype(np.float64))
    return out
