"""The random permutation of a shuffled epoch, drawn from ``(seed, epoch)``.

Up to :data:`WHOLE` samples the permutation is NumPy's own (``Generator.permutation``). Above it,
a Fisher-Yates shuffle of the whole array spends nearly all its time on cache misses (100 M
samples: about 10 s), so the permutation is drawn in two levels (Rao-Sandelius): every sample
gets a random bucket label, the samples are grouped by label keeping their order, and each
bucket (about :data:`BUCKET` samples, so it sits in cache) is shuffled on its own. With
labels drawn independently and uniformly and each bucket shuffled uniformly, every permutation
is equally likely, as with one Fisher-Yates pass.

The two-level draw decomposes, so that ranks holding runs of the samples draw the same
permutation (``plan`` under MPI): the labels of each block of :data:`BLOCK` samples come from a
generator of their own, ``(seed, epoch, 1, block)`` (:func:`labels`), and bucket ``b`` is
shuffled by ``(seed, epoch, 2, b)`` (:func:`bucket_order`).

Values that follow the samples (their lengths) are moved in the same passes, so the caller
gets ``values[perm]`` without a gather over the whole array. Inside :func:`given_orders` an
epoch's permutation may instead be given by the caller (``varpack replan``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from numba import njit

#: Up to this many samples: one Fisher-Yates pass (NumPy's permutation).
WHOLE = 1 << 20
#: Samples per bucket of the two-level draw, about (a power of two).
BUCKET = 1 << 18
#: Samples per block of bucket labels drawn from one generator (two-level draw).
BLOCK = 1 << 20


#: Permutations given by the caller for some epochs (:func:`given_orders`), else drawn.
_GIVEN: ContextVar[dict[int, np.ndarray] | None] = ContextVar("given_orders", default=None)


@contextmanager
def given_orders(orders: dict[int, np.ndarray]) -> Iterator[None]:
    """Inside the block, epoch ``e``'s permutation is ``orders[e]`` instead of one drawn from
    ``(seed, e)``: ``varpack replan`` plans the samples a run has left in the order its parent
    plan would have trained them, so each stays within about one window of where it was.

    >>> with given_orders({0: np.array([2, 0, 1])}):
    ...     permutation(7, 0, 3).tolist(), permuted(7, 0, np.array([5, 6, 7]))[1].tolist()
    ([2, 0, 1], [7, 5, 6])
    """
    token = _GIVEN.set(orders)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def _given(epoch: int, n: int) -> np.ndarray | None:
    orders = _GIVEN.get()
    if orders is None or epoch not in orders:
        return None
    perm = orders[epoch]
    if len(perm) != n:
        raise ValueError(f"the given order of epoch {epoch} holds {len(perm)} samples, not {n}")
    return perm


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of one epoch: independent streams for every (seed, epoch) pair."""
    return np.random.default_rng([seed, epoch])


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of ``n`` samples for ``(seed, epoch)`` (int64).

    >>> sorted(permutation(0, 1, 5).tolist())
    [0, 1, 2, 3, 4]
    >>> bool((permutation(3, 0, 10) == np.random.default_rng([3, 0]).permutation(10)).all())
    True
    """
    given = _given(epoch, n)
    if given is not None:
        return given
    return _draw(seed, epoch, n, None, WHOLE, BUCKET)[0]


def permuted(seed: int, epoch: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, values[perm])`` with ``perm = permutation(seed, epoch, len(values))``.

    >>> perm, v = permuted(0, 0, np.array([10, 11, 12]))
    >>> bool((v == np.array([10, 11, 12])[perm]).all())
    True
    """
    given = _given(epoch, len(values))
    if given is not None:
        return given, values[given]
    perm, moved = _draw(seed, epoch, len(values), values, WHOLE, BUCKET)
    assert moved is not None
    return perm, moved


def buckets(n: int, whole: int, bucket: int) -> int:
    """Buckets of the two-level draw of ``n`` samples (0: one pass, ``n <= whole``); about
    ``bucket`` samples each (``bucket`` a power of two).

    >>> buckets(1000, 1000, 256), buckets(1001, 1000, 256)
    (0, 4)
    """
    if n <= whole:
        return 0
    return min(1 << 16, 1 << max(0, (n - 1).bit_length() - bucket.bit_length() + 1))


def labels(
    seed: int, epoch: int, a: int, b: int, n: int, nb: int, block: int | None = None
) -> np.ndarray:
    """The bucket labels (of ``nb``) of samples ``a .. b-1`` of ``n``: block ``j`` of ``block``
    samples draws its labels from ``(seed, epoch, 1, j)``, so any run of samples draws its own.

    >>> bool((labels(1, 0, 3, 9, 12, 4, 5) == labels(1, 0, 0, 12, 12, 4, 5)[3:9]).all())
    True
    """
    block = BLOCK if block is None else block
    out = np.empty(max(b - a, 0), dtype=np.uint16)
    for j in range(a // block, -(-b // block)):
        lo = j * block
        got = np.random.default_rng([seed, epoch, 1, j]).integers(
            0, nb, min(lo + block, n) - lo, dtype=np.uint16
        )  # the whole block, whichever part of it is asked for
        x, y = max(a, lo), min(b, lo + block)
        out[x - a : y - a] = got[x - lo : y - lo]
    return out


def bucket_order(seed: int, epoch: int, bucket: int, size: int) -> np.ndarray:
    """The shuffle of bucket ``bucket`` (its ``size`` samples in input order)."""
    return np.random.default_rng([seed, epoch, 2, bucket]).permutation(size)


def _draw(
    seed: int,
    epoch: int,
    n: int,
    values: np.ndarray | None,
    whole: int,
    bucket: int,
    block: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The permutation (and ``values`` moved along): one pass up to ``whole`` samples, else
    buckets of about ``bucket`` samples (``bucket`` a power of two), labels drawn in blocks."""
    nb = buckets(n, whole, bucket)
    if nb == 0:
        perm = epoch_rng(seed, epoch).permutation(n).astype(np.int64)
        return perm, None if values is None else np.asarray(values)[perm]
    label = labels(seed, epoch, 0, n, n, nb, block)
    vals = np.zeros(0, dtype=np.int64) if values is None else np.ascontiguousarray(values)
    perm, moved, bounds = _group(label, nb, vals, values is not None)
    del label
    for b, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        local = bucket_order(seed, epoch, b, hi - lo)
        perm[lo:hi] = perm[lo:hi][local]
        if values is not None:
            moved[lo:hi] = moved[lo:hi][local]
    return perm, moved if values is not None else None


def grouped(labels: np.ndarray, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by label (of ``nb``), in order inside each group, and the groups'
    bounds: a counting sort.

    >>> order, bounds = grouped(np.array([2, 0, 2, 1], np.uint16), 3)
    >>> order.tolist(), bounds.tolist()
    ([1, 3, 0, 2], [0, 1, 2, 4])
    """
    order, _, bounds = _group(labels, nb, np.zeros(0, np.int64), False)
    return order, bounds


@njit(cache=True)
def _group(labels, nb, values, carry):  # type: ignore[no-untyped-def]
    """Sample numbers grouped by label, in order inside each group (a counting sort), with
    ``values`` moved along when ``carry``; and the groups' bounds."""
    n = len(labels)
    bounds = np.zeros(nb + 1, dtype=np.int64)
    for i in range(n):
        bounds[labels[i] + 1] += 1
    for b in range(nb):
        bounds[b + 1] += bounds[b]
    at = bounds[:-1].copy()
    perm = np.empty(n, dtype=np.int64)
    moved = np.empty(n if carry else 0, dtype=values.dtype)
    for i in range(n):
        j = at[labels[i]]
        perm[j] = i
        if carry:
            moved[j] = values[i]
        at[labels[i]] = j + 1
    return perm, moved, bounds
