"""The order samples are consumed in: curriculum or windowed shuffle, one stream per epoch.

* ``curriculum``: the input order (sorted by length, ties by sample id) every epoch; steps walk
  from short to long samples (the blog's curriculum).
* ``shuffle``: each epoch a permutation drawn from ``(seed, epoch)``, cut into windows of
  ``shuffle_window`` steps' worth of samples (tokens for budget batching, samples for fixed).
  Each window is sorted by length and its samples are dealt, in a snake (0, 1, .., P-1, P-1, ..,
  0, ..), to the window's ``P`` steps: every step receives a stratified share of the window, so
  its length mix follows the dataset (low mixing), and its samples stay sorted so micro-batches
  pack tightly. A sample is trained within about one window of its random position: a small
  window is close to a plain shuffle, a large one spreads lengths most evenly.

Orders are chosen by name from :data:`ORDERS`; each returns an epoch's stream as indices into the
input arrays, plus the segment bounds where packing restarts. What a segment is depends on the
batching strategy that asks (``segments``): ``"steps"`` (one segment per step of each window; the
packer makes each exactly one step of micro-batches), ``"windows"`` (one segment per window, sorted
by length; pipeline groups are cut from it) or ``"none"`` (a plain permutation, one segment; blocks
are packed by best fit). Curriculum order is always the input order in one segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from varpack.plan.kernels.inputs import frozen
from varpack.plan.kernels.permute import permutation, permuted


def step_size(
    micro_per_step: int,
    batch_size: int | None,
    max_tokens: int | None,
    tokens_per_micro: float | None = None,
) -> int:
    """Size of one step: samples (fixed batching: ``batch_size``) or real tokens (a budget).

    ``tokens_per_micro`` is the real tokens a micro-batch holds on average (the planner measures
    it by packing the sorted data); steps are sized 2% below it so that packing rarely overflows
    a step (an overflow moves on to the next step, a shortfall is split).

    >>> step_size(4, 8, None), step_size(4, None, 100), step_size(4, None, 100, 50.0)
    (32, 392, 196)
    """
    if batch_size is not None:
        return micro_per_step * batch_size
    assert max_tokens is not None
    per = max_tokens if tokens_per_micro is None else tokens_per_micro
    return max(1, int(0.98 * micro_per_step * per))


@dataclass(frozen=True)
class OrderRule:
    """What an order needs: the seed, the window (in steps), the size of a step and its unit."""

    seed: int = 0
    window: int = 8
    step: int = 1  # samples (by_samples) or real tokens in one step
    by_samples: bool = False


def snake(rank: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Deal positions 0, 1, 2, .. to ``width`` slots as 0, 1, .., w-1, w-1, .., 0, 0, 1, ..

    >>> snake(np.arange(7), np.full(7, 3)).tolist()
    [0, 1, 2, 2, 1, 0, 0]
    """
    lap, j = np.divmod(rank, width)
    return np.where(lap % 2 == 0, j, width - 1 - j)


def curriculum(
    lens: np.ndarray, epoch: int, rule: OrderRule, segments: str
) -> tuple[np.ndarray, np.ndarray]:
    """The input order (sorted by length), one segment, every epoch.

    >>> idx, bounds = curriculum(np.array([1, 2, 3]), 0, OrderRule(), "steps")
    >>> idx.tolist(), bounds.tolist()
    ([0, 1, 2], [0, 3])
    """
    n = len(lens)
    return np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64)


def shuffle(
    lens: np.ndarray, epoch: int, rule: OrderRule, segments: str
) -> tuple[np.ndarray, np.ndarray]:
    """A permutation from ``(seed, epoch)``, cut into ``segments`` (see the module doc)."""
    if len(lens) == 0:
        return curriculum(lens, epoch, rule, segments)
    return _SEGMENTS[segments](lens, epoch, rule)


def _step_segments(lens: np.ndarray, epoch: int, rule: OrderRule) -> tuple[np.ndarray, np.ndarray]:
    """Windows sorted and dealt to their steps (:func:`_regroup`): one segment per step."""
    n = len(lens)
    perm = permutation(rule.seed, epoch, n)
    return regroup(perm, lens, rule)


def regroup(
    perm: np.ndarray, lens: np.ndarray, rule: OrderRule, cum0: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(index, bounds)``: the run ``perm`` of a permuted stream (indices into ``lens``) cut
    into windows, each sorted and dealt to its steps (:func:`_regroup`); ``cum0``: the weight
    (tokens, or samples) of the stream before the run, which starts a window.

    >>> idx, bounds = regroup(np.array([0, 1, 2, 3]), np.array([4, 1, 3, 2]), OrderRule(0, 1, 5))
    >>> idx.tolist(), bounds.tolist()
    ([1, 0, 3, 2], [0, 2, 4])
    """
    idx, new_seg = _regroup(
        frozen(perm, np.int64),
        frozen(lens, np.int64),
        np.int64(rule.step),
        np.int64(rule.window * rule.step),
        rule.by_samples,
        np.int64(cum0),
    )
    return idx, np.append(np.flatnonzero(new_seg), len(perm))


def _plain(lens: np.ndarray, epoch: int, rule: OrderRule) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's permutation as it is, one segment."""
    n = len(lens)
    return permutation(rule.seed, epoch, n), np.array([0, n], np.int64)


def _window_segments(
    lens: np.ndarray, epoch: int, rule: OrderRule
) -> tuple[np.ndarray, np.ndarray]:
    """One segment per window, sorted by length.

    For ``--pp``: (step, rank) groups are cut from a whole sorted window (narrow length ranges,
    little padding) and then dealt to the window's steps (:func:`snake`), so each step still mixes
    lengths from the whole window.

    >>> idx, bounds = shuffle(np.array([5, 1, 4, 2, 3]), 0, OrderRule(0, 1, 7), "windows")
    >>> sorted(idx.tolist()), int(bounds[0]), int(bounds[-1])
    ([0, 1, 2, 3, 4], 0, 5)
    """
    n = len(lens)
    perm, plens = permuted(rule.seed, epoch, lens)
    weight = np.ones(n, dtype=np.int64) if rule.by_samples else plens
    window = (np.cumsum(weight, dtype=np.int64) - weight) // (rule.window * rule.step)
    order = np.lexsort((plens, window))  # windows are consecutive; each sorted by length
    win = window[order]
    return perm[order], np.append(np.flatnonzero(np.r_[True, win[1:] != win[:-1]]), n)


_SEGMENTS: dict[str, Callable[[np.ndarray, int, OrderRule], tuple[np.ndarray, np.ndarray]]] = {
    "steps": _step_segments,
    "windows": _window_segments,
    "none": _plain,
}

#: order name -> ``fn(lens, epoch, rule, segments) -> (index, bounds)``
ORDERS: dict[str, Callable[[np.ndarray, int, OrderRule, str], tuple[np.ndarray, np.ndarray]]] = {
    "curriculum": curriculum,
    "shuffle": shuffle,
}


@njit(cache=True)
def sort_by_length(keys, pos, tmp_k, tmp_p, m):  # type: ignore[no-untyped-def]
    """Stable LSD radix sort (8-bit digits) of ``keys[:m]`` > 0, carrying ``pos`` along."""
    top = np.int64(0)
    for i in range(m):
        top = max(top, keys[i])
    count = np.empty(257, dtype=np.int64)
    shift = 0
    while (top >> shift) > 0:
        count[:] = 0
        for i in range(m):
            count[((keys[i] >> shift) & 255) + 1] += 1
        for d in range(256):
            count[d + 1] += count[d]
        for i in range(m):
            d = (keys[i] >> shift) & 255
            tmp_k[count[d]] = keys[i]
            tmp_p[count[d]] = pos[i]
            count[d] += 1
        for i in range(m):
            keys[i] = tmp_k[i]
            pos[i] = tmp_p[i]
        shift += 8


@njit(cache=True)
def _regroup(perm, lens, step, window_size, fixed, cum0):  # type: ignore[no-untyped-def]
    """Cut the permutation into windows, sort each by length, deal it to its steps (snake).

    A window holds the samples whose preceding weight (tokens, or samples with ``fixed``) in the
    permuted stream falls in ``[w*window_size, (w+1)*window_size)``; it has
    ``P = max(1, round(weight / step))`` steps. Its samples, sorted by length (ties by stream
    position), go to steps 0, 1, .., P-1, P-1, .., 0, 0, .. (:func:`snake`), each step's samples
    in length order. Returns the new stream (input rows) and where each step's segment starts.
    """
    n = len(perm)
    idx = np.empty(n, dtype=np.int64)
    new_seg = np.zeros(n, dtype=np.bool_)
    keys = np.empty(0, dtype=np.int64)
    pos = np.empty(0, dtype=np.int64)
    tmp_k = np.empty(0, dtype=np.int64)
    tmp_p = np.empty(0, dtype=np.int64)
    start = np.empty(0, dtype=np.int64)
    a = 0
    cum = cum0  # weight before position a
    while a < n:
        w = cum // window_size
        b = a
        total = np.int64(0)
        while b < n and (cum + total) // window_size == w:
            total += 1 if fixed else lens[perm[b]]
            b += 1
        cum += total
        m = b - a
        if m > len(keys):  # scratch grows to the largest window
            size = max(m, 2 * len(keys))
            keys = np.empty(size, dtype=np.int64)
            pos = np.empty(size, dtype=np.int64)
            tmp_k = np.empty(size, dtype=np.int64)
            tmp_p = np.empty(size, dtype=np.int64)
            start = np.empty(size + 1, dtype=np.int64)
        for i in range(m):
            keys[i] = lens[perm[a + i]]
            pos[i] = i
        sort_by_length(keys, pos, tmp_k, tmp_p, m)
        p = max(np.int64(1), (total + step // 2) // step)
        # Slot s gets one sample per lap of the snake (in length order): its size is the number
        # of full laps plus one if the last, partial lap reaches it.
        full, rest = m // p, m % p
        slots = p if full > 0 else rest
        start[0] = 0
        for s in range(slots):
            if full % 2 == 0:
                extra = 1 if s < rest else 0
            else:
                extra = 1 if s >= p - rest else 0
            start[s + 1] = start[s] + full + extra
            if start[s + 1] > start[s]:
                new_seg[a + start[s]] = True
        for j in range(m):
            lap = j // p
            s = j % p
            if lap % 2 == 1:
                s = p - 1 - s
            idx[a + start[s] + lap] = perm[a + pos[j]]
        a = b
    return idx, new_seg


MOVED_PIECE = 1 << 22  # samples per piece of the moved figures (small temporaries)


def input_rows(
    sample_len: np.ndarray, sample_id: np.ndarray, sample_offset: np.ndarray | None = None
) -> np.ndarray:
    """Each sample's row in the input order (by length, ties by id, then by offset: the pieces
    of ``--oversize split``) among the samples given.

    >>> input_rows(np.array([5, 2, 5]), np.array([1, 9, 0])).tolist()
    [2, 0, 1]
    """
    keys = (
        (sample_id, sample_len) if sample_offset is None else (sample_offset, sample_id, sample_len)
    )
    order = np.lexsort(keys)
    rows = np.empty(len(order), dtype=np.int64)
    rows[order] = np.arange(len(order), dtype=np.int64)
    return rows


class MovedTally:
    """Distances (in steps) of samples from their random positions, summed up as plan.json's
    ``moved_*`` stats: mean, 99th percentile (whole steps), max, and max in windows."""

    def __init__(self) -> None:
        self.total = 0.0
        self.top = 0.0
        self.hist = np.zeros(1, dtype=np.int64)

    def add(self, step: np.ndarray, pos2: np.ndarray, first_step: int, per: float) -> None:
        """Samples trained at ``step`` whose middle token sits at ``pos2 / 2`` of the epoch's
        permuted stream; ``per``: the epoch's steps per half token."""
        d = np.abs(step - (first_step + pos2 * per))
        self.merge(float(d.sum()), float(d.max()), np.bincount(d.astype(np.int64)))

    def add_epoch(
        self, pos: np.ndarray, starts: np.ndarray, plens: np.ndarray, per_step: int
    ) -> None:
        """One epoch's micro-batches (``starts``; ``per_step`` make a step) of the samples at
        ``pos`` in the epoch's permuted stream of lengths ``plens``."""
        if len(pos):
            self.merge(*_epoch_moved(pos, starts, plens, np.int64(per_step)))

    def merge(self, total: float, top: float, whole: np.ndarray) -> None:
        """Add distances summed up as ``total``, their ``top`` and whole-step counts ``whole``."""
        self.total += total
        self.top = max(self.top, top)
        if len(whole) > len(self.hist):
            self.hist = np.concatenate((self.hist, np.zeros(len(whole) - len(self.hist), np.int64)))
        self.hist[: len(whole)] += whole

    def figures(self, window: int) -> dict[str, float]:
        count = int(self.hist.sum())
        p99 = int(np.searchsorted(np.cumsum(self.hist), 0.99 * count)) if count else 0
        return {
            "moved_steps_mean": self.total / count if count else 0.0,
            "moved_steps_p99": p99,
            "moved_steps_max": self.top,
            "moved_windows_max": self.top / window,
        }


@njit(cache=True)
def _epoch_moved(pos, starts, plens, per_step):  # type: ignore[no-untyped-def]
    """``(total, top, whole)`` of :meth:`MovedTally.add` for one epoch, in one pass."""
    pos2 = np.empty(len(plens), dtype=np.int64)
    run = np.int64(0)
    for i in range(len(plens)):
        pos2[i] = 2 * run + plens[i]
        run += plens[i]
    nmb = len(starts) - 1
    steps = nmb // per_step
    per = steps / (2.0 * run)
    whole = np.zeros(steps + 2, dtype=np.int64)
    total = top = 0.0
    for j in range(nmb):
        step = j // per_step
        for q in range(starts[j], starts[j + 1]):
            d = abs(step - pos2[pos[q]] * per)
            total += d
            top = max(top, d)
            whole[np.int64(d)] += 1
    return total, top, whole


def stream_positions(plens: np.ndarray) -> np.ndarray:
    """Twice each sample's middle token position in a permuted stream of lengths ``plens``.

    >>> stream_positions(np.array([3, 1])).tolist()
    [3, 7]
    """
    x = np.asarray(plens, dtype=np.int64)
    return 2 * np.cumsum(x) - x


def moved(
    rows: np.ndarray,
    sample_step: np.ndarray,
    epochs: list[dict[str, int]],
    seed: int,
    window: int,
    row_lens: np.ndarray,
) -> dict[str, float]:
    """How far a shuffled plan trains its samples from their random positions (plan.json stats).

    ``rows[i]``: the input row of the sample trained at ``sample_step[i]`` (one entry per sample
    and epoch); ``row_lens``: the rows' lengths. In epoch ``e`` the permutation puts row ``r``'s
    middle ``t`` tokens into the epoch's ``T``, so a plain shuffle would train it at
    ``first_step + num_steps * t / T``; the figures are the distance to the step it does train
    at, in steps: mean, 99th percentile (whole steps) and max, and the max in windows
    (``--shuffle-window`` steps). The planner tallies the same figures while it composes
    (:class:`MovedTally`); this recomputes them from a plan's samples, as ``validate`` does.

    >>> one = [{"epoch": 0, "first_step": 0, "num_steps": 2}]
    >>> moved(np.array([0, 1]), np.array([0, 0]), one, 0, 1, np.array([3, 1]))["moved_steps_max"]
    1.75
    """
    tally = MovedTally()
    starts = np.array([e["first_step"] for e in epochs], dtype=np.int64)
    span = 2 * int(np.asarray(row_lens, dtype=np.int64).sum())
    for e in epochs:
        mask = np.flatnonzero(np.searchsorted(starts, sample_step, side="right") - 1 == e["epoch"])
        if len(mask) == 0 or span == 0:
            continue
        perm, plens = permuted(seed, e["epoch"], np.asarray(row_lens))
        pos2 = np.empty(len(perm), dtype=np.int64)
        pos2[perm] = stream_positions(plens)
        del plens
        del perm
        for a in range(0, len(mask), MOVED_PIECE):
            at = mask[a : a + MOVED_PIECE]
            tally.add(sample_step[at], pos2[rows[at]], e["first_step"], e["num_steps"] / span)
    return tally.figures(window)
