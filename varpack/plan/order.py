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

The stream is returned as indices into the input arrays, plus the segment bounds where packing
restarts (one segment per epoch in curriculum order, one per step in shuffle order; the packer
then makes each shuffle segment exactly one step of micro-batches).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.config import PlanConfig


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of one epoch: independent streams for every (seed, epoch) pair."""
    return np.random.default_rng([seed, epoch])


def step_size(cfg: PlanConfig, tokens_per_micro: float | None = None) -> int:
    """Size of one step: samples (fixed batching) or real tokens (budget batching).

    ``tokens_per_micro`` is the real tokens a micro-batch holds on average (the planner measures
    it by packing the sorted data); steps are sized 2% below it so that packing rarely overflows
    a step (an overflow moves on to the next step, a shortfall is split).
    """
    if cfg.batching == "fixed":
        assert cfg.batch_size is not None
        return cfg.micro_per_step * cfg.batch_size
    assert cfg.max_tokens is not None
    per = cfg.max_tokens if tokens_per_micro is None else tokens_per_micro
    return max(1, int(0.98 * cfg.micro_per_step * per))


def snake(rank: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Deal positions 0, 1, 2, .. to ``width`` slots as 0, 1, .., w-1, w-1, .., 0, 0, 1, ..

    >>> snake(np.arange(7), np.full(7, 3)).tolist()
    [0, 1, 2, 2, 1, 0, 0]
    """
    lap, j = np.divmod(rank, width)
    return np.where(lap % 2 == 0, j, width - 1 - j)


def epoch_stream(
    lens: np.ndarray, cfg: PlanConfig, epoch: int, tokens_per_micro: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(index, bounds)`` of one epoch over samples with lengths ``lens`` (input order).

    ``bounds`` are the segment starts plus the end: curriculum is one segment, shuffle one
    segment per step of each window.

    >>> from varpack.plan.config import PlanConfig
    >>> idx, bounds = epoch_stream(np.array([1, 2, 3]), PlanConfig(max_tokens=8), 0)
    >>> idx.tolist(), bounds.tolist()
    ([0, 1, 2], [0, 3])
    """
    n = len(lens)
    if cfg.order == "curriculum" or n == 0:
        return np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64)
    perm, plens, window, step = _windows(lens, cfg, epoch, tokens_per_micro)
    weight = np.ones(n, dtype=np.int64) if cfg.batching == "fixed" else plens
    # Steps per window: W for full windows (rounded: a window overshoots by < 1 sample).
    total = np.bincount(window, weights=weight).astype(np.int64)
    steps = np.maximum(1, (total + step // 2) // step)
    del weight
    idx = np.empty(n, dtype=np.int64)
    new_seg = np.zeros(n, dtype=bool)
    # Windows are independent: regroup them in chunks of about CHUNK samples (bounded memory).
    snap = np.searchsorted(window, window[np.arange(CHUNK, n, CHUNK)], side="left")  # window starts
    cuts = np.unique(np.concatenate(([0], snap, [n])))
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        idx[a:b], new_seg[a:b] = _regroup(perm[a:b], plens[a:b], window[a:b], steps)
    new_seg[0] = True
    return idx, np.append(np.flatnonzero(new_seg), n)


CHUNK = 1 << 22


def _windows(
    lens: np.ndarray, cfg: PlanConfig, epoch: int, tokens_per_micro: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The epoch's permutation, its lengths, each position's window and the step size."""
    n = len(lens)
    perm = epoch_rng(cfg.seed, epoch).permutation(n).astype(np.int64)
    plens = lens[perm]
    step = step_size(cfg, tokens_per_micro)
    weight = np.ones(n, dtype=np.int64) if cfg.batching == "fixed" else plens
    window = (np.cumsum(weight, dtype=np.int64) - weight) // (cfg.shuffle_window * step)
    return perm, plens, window, step


def epoch_windows(
    lens: np.ndarray, cfg: PlanConfig, epoch: int, tokens_per_micro: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(index, bounds)`` like :func:`epoch_stream`, but one segment per window, sorted by length.

    For ``--pp``: (step, rank) groups are cut from a whole sorted window (narrow length ranges,
    little padding) and then dealt to the window's steps (:func:`snake`), so each step still mixes
    lengths from the whole window. Curriculum: the input order, one segment.

    >>> from varpack.plan.config import PlanConfig
    >>> cfg = PlanConfig(max_tokens=8, order="shuffle", shuffle_window=1)
    >>> idx, bounds = epoch_windows(np.array([5, 1, 4, 2, 3]), cfg, 0)
    >>> sorted(idx.tolist()), int(bounds[0]), int(bounds[-1])
    ([0, 1, 2, 3, 4], 0, 5)
    """
    n = len(lens)
    if cfg.order == "curriculum" or n == 0:
        return np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64)
    perm, plens, window, _ = _windows(lens, cfg, epoch, tokens_per_micro)
    order = np.lexsort((plens, window))  # windows are consecutive; each sorted by length
    win = window[order]
    return perm[order], np.append(np.flatnonzero(np.r_[True, win[1:] != win[:-1]]), n)


def _regroup(
    perm: np.ndarray, plens: np.ndarray, window: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sort whole windows by length and deal each window's samples to its steps (snake)."""
    n = len(perm)
    order = np.lexsort((plens, window))  # each window sorted by length
    win = window[order]
    first = np.searchsorted(win, win, side="left")
    slot = snake(np.arange(n, dtype=np.int64) - first, steps[win])
    del first
    regroup = np.lexsort((np.arange(n), slot, win))  # by window, step slot, then length
    key_w, key_s = win[regroup], slot[regroup]
    new_seg = np.zeros(n, dtype=bool)
    new_seg[0] = True
    new_seg[1:] = (key_w[1:] != key_w[:-1]) | (key_s[1:] != key_s[:-1])
    return perm[order[regroup]], new_seg
