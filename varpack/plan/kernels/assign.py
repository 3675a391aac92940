"""Micro-batches to optimizer steps, and each step's micro-batches to data-parallel ranks.

Steps: step ``s`` takes micro-batches ``s*dp*K .. (s+1)*dp*K - 1`` of the stream (the stream
order already holds each step's samples together, see :mod:`varpack.plan.kernels.order`).

Ranks: every step's ``dp*K`` micro-batches go to ``dp`` ranks, exactly ``K`` each, minimising
the slowest rank's cost: longest-processing-time first with a cardinality limit, then pairwise
swaps out of the slowest rank while they lower it. A per-step loop in a numba kernel; vectorised
preparation around it. Inside a rank, micro-batches run in stream order (``micro`` 0..K-1).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def steps_in_order(num_micro: int, per_step: int) -> np.ndarray:
    """Curriculum: consecutive groups of ``per_step`` micro-batches form the steps.

    >>> steps_in_order(6, 2).tolist()
    [0, 0, 1, 1, 2, 2]
    """
    return np.arange(num_micro, dtype=np.int64) // per_step


@njit(cache=True)
def deal_ranks(costs, dp, k, ranks, fill):  # type: ignore[no-untyped-def]
    """Deal ``dp*k`` micro-batches (``costs``, in the order to deal them: costliest first)
    to ``dp`` ranks, each to the least loaded rank still short of ``k`` (the first of a tie):
    longest-processing-time first with a cardinality limit. Writes each one's rank to
    ``ranks`` and its place in that rank (0..k-1) to ``fill``; returns the ranks' loads."""
    load = np.zeros(dp)
    have = np.zeros(dp, dtype=np.int64)
    for i in range(len(costs)):
        best = -1
        for r in range(dp):
            if have[r] < k and (best < 0 or load[r] < load[best]):
                best = r
        ranks[i] = best
        fill[i] = have[best]
        load[best] += costs[i]
        have[best] += 1
    return load


@njit(cache=True)
def _balance(costs, dp, k, rounds):  # type: ignore[no-untyped-def]
    """``costs``: (steps, dp*k), each row in descending order. Returns the rank of each entry."""
    steps, width = costs.shape
    ranks = np.empty((steps, width), dtype=np.int64)
    fill = np.empty(width, dtype=np.int64)
    for s in range(steps):
        load = deal_ranks(costs[s], dp, k, ranks[s], fill)
        # Pairwise swaps out of the slowest rank while one lowers it.
        for _ in range(rounds):
            top = 0
            for r in range(1, dp):
                if load[r] > load[top]:
                    top = r
            best_peak = load[top]
            bi = -1
            bj = -1
            for i in range(width):
                if ranks[s, i] != top:
                    continue
                for j in range(width):
                    r = ranks[s, j]
                    if r == top:
                        continue
                    d = costs[s, i] - costs[s, j]
                    if d <= 0:
                        continue
                    peak = max(load[top] - d, load[r] + d)
                    if peak < best_peak:
                        best_peak = peak
                        bi = i
                        bj = j
            if bi < 0:
                break
            r = ranks[s, bj]
            d = costs[s, bi] - costs[s, bj]
            load[top] -= d
            load[r] += d
            ranks[s, bi] = r
            ranks[s, bj] = top
    return ranks


@njit(cache=True)
def _balance_in_order(cost, dp, k, rounds):  # type: ignore[no-untyped-def]
    """:func:`balance_ranks` where step ``s`` is micro-batches ``s*dp*k .. (s+1)*dp*k - 1``.

    Each step's costs are sorted costliest first, ties by position (a stable insertion sort of
    ``dp*k`` entries), balanced by :func:`_balance`, and numbered per rank in stream order.
    """
    m = len(cost)
    width = dp * k
    steps = m // width
    order = np.empty(m, dtype=np.int64)
    sorted_cost = np.empty((steps, width), dtype=np.float64)
    for s in range(steps):
        base = s * width
        for i in range(width):  # insert position base+i after every cost >= its own
            c = cost[base + i]
            j = i
            while j > 0 and cost[order[base + j - 1]] < c:
                order[base + j] = order[base + j - 1]
                j -= 1
            order[base + j] = base + i
        for i in range(width):
            sorted_cost[s, i] = cost[order[base + i]]
    ranks_sorted = _balance(sorted_cost, dp, k, rounds)
    rank = np.empty(m, dtype=np.int64)
    micro = np.empty(m, dtype=np.int64)
    fill = np.zeros(dp, dtype=np.int64)
    for s in range(steps):
        base = s * width
        for i in range(width):
            rank[order[base + i]] = ranks_sorted[s, i]
        fill[:] = 0
        for i in range(base, base + width):
            micro[i] = fill[rank[i]]
            fill[rank[i]] += 1
    return rank, micro


def balance_ranks(
    step: np.ndarray, cost: np.ndarray, dp: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(rank, micro)`` of every micro-batch; each step must hold exactly ``dp*k`` of them.

    >>> rank, micro = balance_ranks(np.zeros(4, np.int64), np.array([4.0, 3, 2, 1]), 2, 2)
    >>> rank.tolist(), micro.tolist()
    ([0, 1, 1, 0], [0, 0, 1, 1])
    """
    m = len(step)
    width = dp * k
    assert m % width == 0
    first = int(step[0]) if m else 0
    if np.array_equal(step, steps_in_order(m, width) + first):  # the planner's: steps in order
        return _balance_in_order(np.ascontiguousarray(cost, dtype=np.float64), dp, k, 4 * dp)
    return balance_any_order(step, cost, dp, k)


@njit(cache=True)
def _slots_in_order(cost, dp, k):  # type: ignore[no-untyped-def]
    """:func:`balance_slots` where step ``s`` is micro-batches ``s*dp*k .. (s+1)*dp*k - 1``."""
    m = len(cost)
    width = dp * k
    slot = np.empty(m, dtype=np.int64)
    lane = np.empty(m, dtype=np.int64)
    for base in range(0, m, width):
        order = np.argsort(-cost[base : base + width], kind="mergesort")  # ties by position
        for q in range(width):
            slot[base + order[q]] = q // dp
            lane[base + order[q]] = q % dp
    return slot, lane


def balance_slots(
    step: np.ndarray, cost: np.ndarray, dp: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(micro, lane)`` of every micro-batch when ranks meet at every micro-batch: each step's
    ``dp*k`` micro-batches, costliest first (ties by position), cut into ``k`` slots of ``dp``;
    ``lane`` is the place in its slot (0: the costliest). A step lasts the sum of its slots'
    costliest micro-batches, and sorted slots make that sum the least any split of the step's
    micro-batches into ``k`` slots of ``dp`` can reach (the ``j``-th costliest slot waits on at
    least the ``j*dp``-th costliest micro-batch).

    >>> micro, lane = balance_slots(np.zeros(4, np.int64), np.array([1.0, 4, 2, 4]), 2, 2)
    >>> micro.tolist(), lane.tolist()
    ([1, 0, 1, 0], [1, 0, 0, 1])
    """
    m = len(step)
    width = dp * k
    assert m % width == 0
    first = int(step[0]) if m else 0
    if np.array_equal(step, steps_in_order(m, width) + first):  # the planner's: steps in order
        return _slots_in_order(np.ascontiguousarray(cost, dtype=np.float64), dp, k)  # type: ignore[no-any-return]
    pos = np.arange(m, dtype=np.int64)
    order = np.lexsort((pos, -cost, step))  # by step, costliest first, ties by position
    q = np.empty(m, dtype=np.int64)
    q[order] = pos % width
    return q // dp, q % dp


def step_offsets(num_steps: int, dp: int, seed: int) -> np.ndarray:
    """A pseudo-random rank offset for each step, drawn from ``(seed, step)`` (splitmix64).

    Balancing gives the costliest share of a step to the lowest rank whenever costs tie or the
    step cannot be levelled; rotating each step's ranks by its offset spreads those shares over
    all ranks, so that no rank is the slowest step after step.

    >>> step_offsets(6, 4, 0).tolist()
    [0, 1, 2, 3, 1, 0]
    """
    mask = (1 << 64) - 1
    base = np.uint64((int(seed) * 0xD1B54A32D192ED03 + 0x9E3779B97F4A7C15) & mask)
    z = np.arange(num_steps, dtype=np.uint64) ^ base
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(dp)).astype(np.int64)


def balance_any_order(
    step: np.ndarray, cost: np.ndarray, dp: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`balance_ranks` for steps in any order (the reference the fast path must equal)."""
    m = len(step)
    width = dp * k
    pos = np.arange(m, dtype=np.int64)
    order = np.lexsort((pos, -cost, step))  # by step, costliest first, ties by position
    ranks_sorted = _balance(np.ascontiguousarray(cost[order].reshape(-1, width)), dp, k, 4 * dp)
    rank = np.empty(m, dtype=np.int64)
    rank[order] = ranks_sorted.reshape(-1)
    # micro: position among the rank's micro-batches of the step, in stream order.
    by_slot = np.lexsort((pos, rank, step))
    micro = np.empty(m, dtype=np.int64)
    micro[by_slot] = np.arange(m, dtype=np.int64) % k
    return rank, micro
