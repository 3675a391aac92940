"""Reshard: the micro-batches of a plan's steps dealt again to another number of ranks.

A run that resumes on another world size keeps what matters for its loss curve when every step
keeps its samples: the same global batch, the same LR factor. So when ``dp x grad_accum`` stays
the same, each step's ``dp x grad_accum`` micro-batches are kept whole (each already within the
budget and of its shape) and only dealt again to the new ``dp'`` ranks, ``grad_accum'`` each,
balanced by cost (:func:`varpack.plan.kernels.assign.balance_ranks`, the assign stage's own
kernel) and rotated by the step offsets drawn from ``(seed, step)`` so no rank is favoured.

Pure NumPy over per-micro-batch arrays: the I/O edge is :mod:`varpack.make.replan`.
"""

from __future__ import annotations

import numpy as np

from varpack.plan.kernels.assign import balance_ranks, step_offsets


def reshard(
    step: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    cost: np.ndarray,
    old: tuple[int, int],
    new: tuple[int, int],
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(rank, micro)`` of every micro-batch on ``new = (dp, grad_accum)``.

    ``step``, ``rank``, ``micro``, ``cost``: each micro-batch's place in the plan on
    ``old = (dp, grad_accum)`` and its cost; every step holds ``dp x grad_accum`` of them, the
    same count on both. With ``new == old`` the places are kept (the identity).

    >>> step = np.zeros(4, np.int64)
    >>> rank, micro = reshard(step, np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]),
    ...                       np.array([4.0, 1, 3, 2]), (2, 2), (4, 1))
    >>> sorted(rank.tolist()), micro.tolist()
    ([0, 1, 2, 3], [0, 0, 0, 0])
    >>> reshard(step, np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), np.ones(4), (2, 2),
    ...         (2, 2))[0].tolist()
    [0, 0, 1, 1]
    """
    (dp0, k0), (dp, k) = old, new
    if dp0 * k0 != dp * k:
        raise ValueError(f"dp x grad_accum changes ({dp0} x {k0} -> {dp} x {k})")
    if (dp0, k0) == (dp, k):
        return rank.astype(np.int64, copy=True), micro.astype(np.int64, copy=True)
    # steps in order, each step's micro-batches in the old (rank, micro) order: deterministic
    order = np.lexsort((micro, rank, step))
    new_rank = np.empty(len(step), dtype=np.int64)
    new_micro = np.empty(len(step), dtype=np.int64)
    r, m = balance_ranks(step[order], cost[order], dp, k)
    shift = step_offsets(int(step.max()) + 1 if len(step) else 0, dp, seed)[step[order]]
    new_rank[order] = (r + shift) % dp
    new_micro[order] = m
    return new_rank, new_micro
