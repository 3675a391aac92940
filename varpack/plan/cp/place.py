"""Context-parallel placement: which samples of a micro-batch stay whole on one CP rank.

With ``--cp N`` each micro-batch runs on a CP group of N ranks. Every sample is either *local*
(whole on one CP rank: value ``r`` in ``0..N-1``) or *distributed* (sharded over all N:
:data:`DISTRIBUTED`, -1). A CP rank holds its local samples' tokens plus ``S / N`` of every
distributed sample, at most the bucket size ``C`` (the memory model). Strategies, chosen by name
from :data:`CP_PLACEMENTS` (``--cp-placement``):

* ``dacp`` — Skrull's distribution-aware heuristic: samples shortest first, each to the CP rank
  with the least compute if it fits there (balance compute first), else to the rank with the
  most room (avoid sharding), else distributed; if even its ``S / N`` share does not fit, an
  already-placed local sample is rolled back to distributed and the sample tried again;
* ``round-robin`` — Skrull's RR baseline: the rank with the most room, else distributed, with
  the same rollback;
* ``distributed`` — standard context parallelism: every sample sharded.

Rollback picks the longest local sample of the fullest rank (the one that frees most room with
one shard), and when its share would overflow another rank every local sample placed so far
becomes distributed (the least memory any placement needs); when the fullest rank holds only
shares, the micro-batch does not fit. Each rollback turns a local sample into a distributed one for good, so a micro-batch
takes at most K rollbacks; a micro-batch of at most ``C * N`` tokens always fits. Memory is
counted in integers scaled by N (``N * local + distributed``), so the capacity rule is exact.

One numba kernel runs over all micro-batches (a sequential greedy per micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from varpack.errors import ConfigError
from varpack.plan.kernels.inputs import frozen

DISTRIBUTED = -1
_DACP, _ROUND_ROBIN, _ALL = 0, 1, 2


@njit(cache=True)
def _argmin(x):  # type: ignore[no-untyped-def]
    best = 0
    for r in range(1, len(x)):
        if x[r] < x[best]:
            best = r
    return best


@njit(cache=True)
def _argmax(x):  # type: ignore[no-untyped-def]
    best = 0
    for r in range(1, len(x)):
        if x[r] > x[best]:
            best = r
    return best


@njit(cache=True)
def _distribute(j, lens, cost, out, room, load, n):  # type: ignore[no-untyped-def]
    """Shard sample ``j`` (local or new) over every rank."""
    q = out[j]
    if q >= 0:  # a rollback: its rank gets its whole length back
        room[q] += n * lens[j]
        load[q] -= cost[j]
    out[j] = -1
    for r in range(n):
        room[r] -= lens[j]
        load[r] += cost[j] / n


@njit(cache=True)
def _roll_back(t, lens, cost, out, room, load, n):  # type: ignore[no-untyped-def]
    """Turn a local sample into a distributed one; False when there is none."""
    best = -1
    for j in range(len(lens)):
        if out[j] == t and (best < 0 or lens[j] > lens[best]):
            best = j
    if best < 0:  # only shares on the fullest rank: nothing can make room there
        return False
    fits = True
    for r in range(n):
        if r != t and room[r] < lens[best]:
            fits = False
    if fits:
        _distribute(best, lens, cost, out, room, load, n)
        return True
    any_local = False  # every local sample so far to distributed (fits: all is the least memory)
    for j in range(len(lens)):
        if out[j] >= 0:
            _distribute(j, lens, cost, out, room, load, n)
            any_local = True
    return any_local


@njit(cache=True)
def _place_one(lens, cost, out, cap, n, strategy):  # type: ignore[no-untyped-def]
    """Place one micro-batch's samples into ``out``; False if it cannot fit."""
    k = len(lens)
    for j in range(k):
        out[j] = -2  # not placed yet
    room = np.full(n, cap * n, dtype=np.int64)  # N * C - (N * local + distributed)
    load = np.zeros(n, dtype=np.float64)
    order = np.argsort(lens, kind="mergesort")  # shortest first, ties by position
    i = 0
    while i < k:
        j = order[i]
        s = lens[j]
        t = -1
        if strategy == _DACP:
            t = _argmin(load)
            if room[t] < n * s:
                t = -1
        if t < 0 and strategy != _ALL:
            t = _argmax(room)
            if room[t] < n * s:
                t = -1
        if t >= 0:
            out[j] = t
            room[t] -= n * s
            load[t] += cost[j]
            i += 1
            continue
        if room[_argmin(room)] >= s:
            _distribute(j, lens, cost, out, room, load, n)
            i += 1
            continue
        if not _roll_back(_argmin(room), lens, cost, out, room, load, n):
            return False
    return True


@njit(cache=True)
def _place_all(lens, offsets, cap, n, strategy, lin, quad):  # type: ignore[no-untyped-def]
    """Placement of every stream position; the index of a micro-batch that fails, else -1."""
    out = np.empty(len(lens), dtype=np.int32)
    for m in range(len(offsets) - 1):
        a, b = offsets[m], offsets[m + 1]
        seg = lens[a:b]
        cost = np.empty(b - a, dtype=np.float64)
        for j in range(b - a):
            s = float(seg[j])
            cost[j] = lin * s + quad * s * s
        if not _place_one(seg, cost, out[a:b], cap, n, strategy):
            return out, m
    return out, -1


def _strategy(code: int) -> Callable[..., tuple[np.ndarray, int]]:
    def run(
        lens: np.ndarray, offsets: np.ndarray, cap: int, n: int, lin: float, quad: float
    ) -> tuple[np.ndarray, int]:
        lens64, off = frozen(lens, np.int64), frozen(offsets, np.int64)
        out, bad = _place_all(lens64, off, int(cap), int(n), code, float(lin), float(quad))
        return out, int(bad)

    return run


#: ``--cp-placement`` name -> ``run(lens, offsets, cap, n, lin, quad) -> (placement, failed)``
CP_PLACEMENTS: dict[str, Callable[..., tuple[np.ndarray, int]]] = {
    "dacp": _strategy(_DACP),
    "round-robin": _strategy(_ROUND_ROBIN),
    "distributed": _strategy(_ALL),
}


def place(
    lens: np.ndarray,
    offsets: np.ndarray,
    cap: int,
    n: int,
    strategy: str = "dacp",
    weights: tuple[float, float] = (1.0, 0.0),
) -> np.ndarray:
    """CP placement (int32, -1 = distributed) of every sample of the micro-batches.

    Micro-batch ``i`` is ``lens[offsets[i]:offsets[i+1]]``; ``cap`` is the bucket size C;
    ``weights`` ``(lin, quad)`` give a sample's compute ``lin * S + quad * S^2`` (balanced
    first). Raises :class:`~varpack.errors.ConfigError` naming a micro-batch that cannot fit.

    >>> place(np.array([1, 1, 6]), np.array([0, 3]), cap=4, n=2).tolist()
    [0, 1, -1]
    """
    out, bad = CP_PLACEMENTS[strategy](lens, offsets, cap, n, *weights)
    if bad >= 0:
        a, b = int(offsets[bad]), int(offsets[bad + 1])
        total = int(np.asarray(lens[a:b], dtype=np.int64).sum())
        raise ConfigError(
            f"context-parallel placement: micro-batch {bad} ({b - a} samples, {total} tokens) does "
            f"not fit {n} CP ranks of {cap} tokens even with every sample distributed; raise "
            "--bucket-size (or the memory capacity), raise --cp, or lower --max-tokens"
        )
    return out
