"""Segment arithmetic over flat arrays: the plan's micro-batches are runs of a sample stream.

A micro-batch (or a step, or a pipeline group) is a segment ``[offsets[i], offsets[i+1])`` of a
flat array; these helpers reduce or gather such segments without a Python loop.
"""

from __future__ import annotations

import numpy as np


def segment_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each non-empty segment ``[offsets[i], offsets[i+1])``.

    >>> segment_sums(np.array([0, 2, 5]), np.array([1, 2, 3, 4, 5])).tolist()
    [3, 12]
    """
    return np.add.reduceat(values, offsets[:-1]) if len(offsets) > 1 else values[:0]


def segment_max(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Maximum of ``values`` over each non-empty segment.

    >>> segment_max(np.array([0, 2, 5]), np.array([1, 2, 3, 9, 5])).tolist()
    [2, 9]
    """
    return np.maximum.reduceat(values, offsets[:-1]) if len(offsets) > 1 else values[:0]


def gather_positions(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges ``starts[i] .. starts[i]+counts[i]-1`` and the list offsets.

    >>> pos, off = gather_positions(np.array([5, 0]), np.array([2, 3]))
    >>> pos.tolist(), off.tolist()
    ([5, 6, 0, 1, 2], [0, 2, 5])
    """
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    shift = np.repeat(starts - offsets[:-1], counts)
    return shift + np.arange(offsets[-1], dtype=np.int64), offsets


def group_max(step: np.ndarray, rank: np.ndarray, values: np.ndarray, dp: int) -> np.ndarray:
    """Each micro-batch's value replaced by the maximum over its (step, rank).

    >>> group_max(np.array([0, 0, 0, 1]), np.array([0, 0, 1, 0]), np.array([3, 5, 4, 1]), 2).tolist()
    [5, 5, 4, 1]
    """
    key = step * dp + rank
    if len(key) == 0:  # a share of no micro-batches (a rank under MPI)
        return values.copy()
    top = np.zeros(int(key.max()) + 1, dtype=values.dtype)
    np.maximum.at(top, key, values)
    return top[key]
