"""How figures computed on shares of a plan's samples are combined, exactly.

The per-sample figures (mixing, the time bound, the ideal) need every sample's length and step.
They are computed from parts that combine without rounding: a histogram of lengths, integer
counts and sums, float sums of integers (exact below 2^53), the few long samples, and chunks of
lengths of the chunks a float sum runs over, in their global order. :class:`Whole` is one process holding every sample; ``plan``
under MPI passes a merge over its ranks (``varpack.make.mpi.figures.Ranks``), so that rank 0
computes the same floats from the same parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np


class Merge(Protocol):
    """The combining steps a share of the samples takes part in (every share calls each)."""

    @property
    def root(self) -> bool:
        """Whether this share computes the final figures."""
        ...

    def histogram(self, values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every share's distinct lengths and counts merged (on every share)."""
        ...

    def total(self, a: np.ndarray) -> np.ndarray | None:
        """The elementwise sum of every share's ``a`` (on the root)."""
        ...

    def join(self, a: np.ndarray) -> np.ndarray | None:
        """Every share's ``a`` one after the other, in share order (on the root)."""
        ...

    def chunked(
        self, a: np.ndarray, size: int, fn: Callable[[np.ndarray], float]
    ) -> list[float] | None:
        """``fn`` of each chunk of ``size`` values of the global array whose part ``a`` is, in
        order (on the root): a share computes the chunks it holds whole, the root the others."""
        ...


class Whole:
    """One process: every sample at hand, nothing to combine."""

    root = True

    def histogram(self, values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return values, counts

    def total(self, a: np.ndarray) -> np.ndarray | None:
        return a

    def join(self, a: np.ndarray) -> np.ndarray | None:
        return a

    def chunked(
        self, a: np.ndarray, size: int, fn: Callable[[np.ndarray], float]
    ) -> list[float] | None:
        return [fn(a[start : start + size]) for start in range(0, len(a), size)]


WHOLE = Whole()


def length_histogram(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths and their counts (bincount when lengths are small ints).

    >>> [x.tolist() for x in length_histogram(np.array([3, 1, 3]))]
    [[1, 3], [1, 2]]
    """
    if len(lens) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(lens.max())
    if int(lens.min()) >= 0 and top <= (1 << 24):
        counts = np.bincount(lens, minlength=top + 1)
        values = np.flatnonzero(counts)
        return values, counts[values]
    values, counts = np.unique(lens, return_counts=True)
    return values, counts
