"""Route sorted rows to ranks (pure NumPy): by splitters, and by exact global position.

Both work on locally sorted arrays, so every rank's outgoing rows are contiguous slices of the
sorted array itself: the send buffer needs no copy, only counts.
"""

from __future__ import annotations

import numpy as np


def split_counts(sorted_keys: np.ndarray, splitters: np.ndarray) -> np.ndarray:
    """Rows of ``sorted_keys`` going to each rank; rank ``r`` takes ``[splitters[r-1], splitters[r])``.

    >>> keys = np.array([5, 25, 26, 50, 99], dtype=np.uint64)
    >>> split_counts(keys, np.array([25, 50, 75], dtype=np.uint64)).tolist()
    [1, 2, 1, 1]
    """
    cuts = np.searchsorted(sorted_keys, splitters, side="left")
    return np.diff(np.concatenate([[0], cuts, [len(sorted_keys)]])).astype(np.int64)


def shift_counts(count: int, offset: int, total: int, parts: int) -> np.ndarray:
    """Rows a rank sends to each rank so that rank ``d`` ends with global rows ``[d*N//P, (d+1)*N//P)``.

    The rank holds the globally sorted rows ``[offset, offset + count)``; its sends are contiguous
    slices, in rank order, so the send buffer is the sorted array itself.

    >>> shift_counts(6, 0, 10, 2).tolist(), shift_counts(4, 6, 10, 2).tolist()
    ([5, 1], [0, 4])
    """
    bounds = np.arange(parts + 1, dtype=np.int64) * total // parts
    lo = np.maximum(bounds[:-1], offset)
    hi = np.minimum(bounds[1:], offset + count)
    return np.maximum(hi - lo, 0)
