"""Where greedy packing cuts, found from every row at once.

Greedy packing (:func:`varpack.plan.kernels.pack.pack` without a cap) forgets everything at a
micro-batch start: where a micro-batch that starts at row ``i`` ends depends on the rows from
``i`` on only. :func:`next_cuts` finds that end for every row in one pass, with two pointers:
whether rows ``i:j`` may form one micro-batch is monotone (fewer rows have fewer tokens, a
shorter longest row and fewer pieces of one document), so the end never moves back as the start
moves on. :func:`follow` then walks the cuts from a start, one step per micro-batch: the same
starts as packing the rows from there. Under MPI every rank finds its rows' cuts at once, and
only the walk from the start handed in from the rank before is taken in turn.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.kernels.pack import PackRule, fits_more


def next_cuts(
    lens: np.ndarray, alone: np.ndarray, rule: PackRule, group: np.ndarray | None = None
) -> np.ndarray:
    """For every row ``i``, where a micro-batch that starts at ``i`` ends (one segment).

    >>> next_cuts(np.array([3, 3, 3, 5]), np.zeros(4, bool), PackRule(max_tokens=8)).tolist()
    [2, 3, 4, 4]
    """
    codes = np.zeros(0, dtype=np.int64)  # none: no split documents
    if group is not None and (group >= 0).any():  # documents numbered 0..G-1 on this share
        codes = np.full(len(lens), -1, dtype=np.int64)
        piece = group >= 0
        codes[piece] = np.unique(group[piece], return_inverse=True)[1]
    args = rule.kernel_args()
    # the window's longest row matters to the padded layout only; a window holds at most a
    # budget's rows (each row has a token) or a batch's
    longest = not rule.fixed and rule.layout == "padded"
    span = min(len(lens), max(rule.max_tokens or 0, rule.batch_size or 0) + 1) if longest else 1
    size = 1 << max(span - 1, 0).bit_length()  # a power of two: positions wrap with a mask
    return _next_cuts(
        np.ascontiguousarray(lens, dtype=np.int64),
        np.ascontiguousarray(alone, dtype=np.bool_),
        codes,
        longest,
        np.empty(size, dtype=np.int64),
        *args,
    )


@njit(cache=True)
def _next_cuts(lens, alone, codes, longest, ring, fixed, bsize, layout, multiple, budget):  # type: ignore[no-untyped-def]
    """Two pointers over ``i`` (the start) and ``j`` (the window's end); ``ring`` keeps the
    window's rows by decreasing length (its longest first) where ``longest``."""
    n = len(lens)
    nxt = np.empty(n, dtype=np.int64)
    grouped = len(codes) > 0
    held = np.zeros(int(codes.max()) + 1 if grouped else 0, dtype=np.int64)  # pieces a document
    mask = len(ring) - 1
    head = tail = 0  # ring positions, counted on (modulo cap when read)
    j = 0
    tok = np.int64(0)
    for i in range(n):
        if j == i:  # an empty window takes its start, whatever it is
            tok = lens[i]
            head = tail = 0
            if longest:
                ring[0] = i
                tail = 1
            if grouped and codes[i] >= 0:
                held[codes[i]] += 1
            j = i + 1
        while j < n and not alone[i] and not alone[j]:
            x = lens[j]
            mx = lens[ring[head & mask]] if longest else x
            if not fits_more(j - i, tok, mx, x, fixed, bsize, layout, multiple, budget):
                break
            if grouped and codes[j] >= 0 and held[codes[j]] > 0:
                break
            tok += x
            if longest:
                while tail > head and lens[ring[(tail - 1) & mask]] <= x:
                    tail -= 1
                ring[tail & mask] = j
                tail += 1
            if grouped and codes[j] >= 0:
                held[codes[j]] += 1
            j += 1
        nxt[i] = j
        tok -= lens[i]  # the start leaves the window
        if longest and ring[head & mask] == i:
            head += 1
        if grouped and codes[i] >= 0:
            held[codes[i]] -= 1
    return nxt


@njit(cache=True)
def follow(nxt, start):  # type: ignore[no-untyped-def]
    """The micro-batch starts from row ``start`` on, and the end (``len(nxt)``).

    >>> follow(np.array([2, 3, 4, 4]), 1).tolist()
    [1, 3, 4]
    """
    n = len(nxt)
    out = np.empty(n - start + 1 if start < n else 1, dtype=np.int64)
    k = 0
    s = start
    while s < n:
        out[k] = s
        k += 1
        s = nxt[s]
    out[k] = n
    return out[: k + 1].copy()
