"""The random permutation of a shuffled epoch, drawn from ``(seed, epoch)``.

Up to :data:`WHOLE` samples the permutation is NumPy's own (``Generator.permutation``). Above it,
a Fisher-Yates shuffle of the whole array spends nearly all its time on cache misses (100 M
samples: about 10 s), so the permutation is drawn in two levels (Rao-Sandelius): every sample
gets a random bucket label, the samples are grouped by label keeping their order, and each
bucket (about :data:`BUCKET` samples, so it sits in cache) is shuffled on its own. With
labels drawn independently and uniformly and each bucket shuffled uniformly, every permutation
is equally likely, as with one Fisher-Yates pass.

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
    return _draw(epoch_rng(seed, epoch), n, None, WHOLE, BUCKET)[0]


def permuted(seed: int, epoch: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, values[perm])`` with ``perm = permutation(seed, epoch, len(values))``.

    >>> perm, v = permuted(0, 0, np.array([10, 11, 12]))
    >>> bool((v == np.array([10, 11, 12])[perm]).all())
    True
    """
    given = _given(epoch, len(values))
    if given is not None:
        return given, values[given]
    perm, moved = _draw(epoch_rng(seed, epoch), len(values), values, WHOLE, BUCKET)
    assert moved is not None
    return perm, moved


def _draw(
    rng: np.random.Generator, n: int, values: np.ndarray | None, whole: int, bucket: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The permutation (and ``values`` moved along): one pass up to ``whole`` samples, else
    buckets of about ``bucket`` samples (``bucket`` a power of two)."""
    if n <= whole:
        perm = rng.permutation(n).astype(np.int64)
        return perm, None if values is None else np.asarray(values)[perm]
    nb = min(1 << 16, 1 << max(0, (n - 1).bit_length() - bucket.bit_length() + 1))
    labels = rng.integers(0, nb, n, dtype=np.uint16)
    vals = np.zeros(0, dtype=np.int64) if values is None else np.ascontiguousarray(values)
    perm, moved, bounds = _group(labels, nb, vals, values is not None)
    del labels
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        local = rng.permutation(b - a)
        perm[a:b] = perm[a:b][local]
        if values is not None:
            moved[a:b] = moved[a:b][local]
    return perm, moved if values is not None else None


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
