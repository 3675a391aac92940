"""The tokens in each micro-batch of each bin, with each bin's least-filled micro-batch at hand.

A sample goes to the least-filled micro-batch of its bin (if that one has no room, none has).
Under ``--sync step`` a bin is a rank's share of a step, ``kb = grad_accum`` micro-batches,
which a batch planned in memory makes hundreds; so each bin keeps a tournament tree over its
micro-batches (the winner the least filled, ties to the first) and a change of one fill costs
``log kb``, not ``kb``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _first(fill, at, x, y):  # type: ignore[no-untyped-def]
    """Of micro-batches ``x`` and ``y`` of the bin whose fills start at ``at`` (-1: none),
    the less filled, ties to the first."""
    if x < 0:
        return y
    if y < 0:
        return x
    fx, fy = fill[at + x], fill[at + y]
    return x if fx < fy or (fx == fy and x < y) else y


@njit(cache=True)
def fills_tree(fill, kb):  # type: ignore[no-untyped-def]
    """Each bin's tree over ``fill`` (``kb`` micro-batches a bin): ``2 * size`` entries a bin,
    ``size`` the power of two at or above ``kb``; entry 1 holds the least-filled one."""
    nb = len(fill) // kb
    size = 1
    while size < kb:
        size *= 2
    tree = np.full(nb * 2 * size, -1, dtype=np.int64)
    for b in range(nb):
        base = b * 2 * size
        for j in range(kb):
            tree[base + size + j] = j
        for node in range(size - 1, 0, -1):
            tree[base + node] = _first(fill, b * kb, tree[base + 2 * node],
                                       tree[base + 2 * node + 1])  # fmt: skip
    return tree


@njit(cache=True)
def least(tree, kb, b):  # type: ignore[no-untyped-def]
    """Bin ``b``'s least-filled micro-batch."""
    if kb == 1:
        return 0
    return tree[b * 2 * _size(kb) + 1]


@njit(cache=True, inline="always")
def _size(kb):  # type: ignore[no-untyped-def]
    size = 1
    while size < kb:
        size *= 2
    return size


@njit(cache=True)
def room(fill, tree, b, kb, cap, x):  # type: ignore[no-untyped-def]
    """The least-filled micro-batch of bin ``b`` where ``x`` more tokens fit, or -1."""
    j = least(tree, kb, b)
    return j if fill[b * kb + j] + x <= cap else -1


@njit(cache=True)
def add(fill, tree, b, kb, j, x):  # type: ignore[no-untyped-def]
    """``x`` tokens (negative: taken out) into micro-batch ``j`` of bin ``b``."""
    fill[b * kb + j] += x
    if kb == 1:
        return
    size = _size(kb)
    base = b * 2 * size
    node = (size + j) // 2
    while node >= 1:
        tree[base + node] = _first(fill, b * kb, tree[base + 2 * node], tree[base + 2 * node + 1])
        node //= 2
