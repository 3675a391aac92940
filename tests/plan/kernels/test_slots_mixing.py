"""Slots of the padded layout under ``--sync micro`` mix lengths: pooled pairs of blocks keep
each block's share of every cost range, and slots are dealt to steps by their rows' length."""

from __future__ import annotations

import numpy as np
import pytest

from varpack.plan.kernels.slots import pool_pairs, slot_order


@pytest.mark.parametrize("second", [0.4, 1.0])
def test_a_pooled_pair_keeps_each_blocks_share_of_every_cost(second: float) -> None:
    rng = np.random.default_rng(3)
    size, dp = 1024, 8
    cost = rng.lognormal(0.0, 1.0, size + int(second * size))
    out = pool_pairs(cost, size, dp)
    assert sorted(out.tolist()) == list(range(len(cost)))  # a permutation
    first, rest = cost[out[:size]], cost[out[size:]]
    # both blocks hold cheap and costly micro-batches alike (the second took all the cheapest)
    for q in (0.1, 0.5, 0.9):
        assert abs(np.quantile(first, q) / np.quantile(rest, q) - 1) < 0.15
    assert not set(out[:size].tolist()) - set(range(2 * size))  # at most the other block


def test_slots_are_dealt_by_their_rows_length() -> None:
    # one block of 4 steps x 2 slots x 2 ranks; costs rank the slots one way, lengths another
    cost = np.arange(16, 0, -1, dtype=np.float64)
    rows = np.array([5, 5, 6, 6, 7, 7, 8, 8, 1, 1, 2, 2, 3, 3, 4, 4])
    order = slot_order(cost, 2, 2, 4, deal=rows)
    step = np.empty(16, dtype=np.int64)
    step[order] = np.arange(16) // 4
    lens_by_step = [sorted(set(rows[step == s].tolist())) for s in range(4)]
    # every step holds one long and one short range (a snake over the lengths: 8+1, 7+2 ...)
    assert lens_by_step == [[1, 8], [2, 7], [3, 6], [4, 5]]
    # the slots themselves are the cost cut's: runs of dp neighbours in cost
    assert all(abs(int(a) - int(b)) == 1 for a, b in order.reshape(-1, 2))
