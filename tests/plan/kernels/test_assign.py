"""The fast in-order rank balancing equals the general (lexsort) path it replaced."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.plan.kernels.assign import balance_any_order, balance_ranks, steps_in_order


@settings(max_examples=150, deadline=None)
@given(
    dp=st.integers(1, 8),
    k=st.integers(1, 6),
    steps=st.integers(1, 12),
    ties=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_fast_path_equals_general_path(dp: int, k: int, steps: int, ties: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = dp * k * steps
    cost = rng.integers(1, 4, m).astype(np.float64) if ties else rng.lognormal(0, 2, m)
    step = steps_in_order(m, dp * k)
    fast = balance_ranks(step, cost, dp, k)
    ref = balance_any_order(step, cost, dp, k)
    assert np.array_equal(fast[0], ref[0]) and np.array_equal(fast[1], ref[1])
    # Invariants: every rank gets exactly k micro-batches per step, numbered 0..k-1.
    slots = step * dp + fast[0]
    assert np.all(np.bincount(slots, minlength=steps * dp) == k)
    for s in range(steps):
        for r in range(dp):
            assert sorted(fast[1][(step == s) & (fast[0] == r)].tolist()) == list(range(k))


def test_balancing_beats_round_robin() -> None:
    """LPT-style balancing lowers the slowest rank's load against a plain deal."""
    rng = np.random.default_rng(0)
    dp, k, steps = 4, 4, 50
    m = dp * k * steps
    cost = rng.lognormal(0, 1.5, m)
    step = steps_in_order(m, dp * k)
    rank, _ = balance_ranks(step, cost, dp, k)
    naive = np.arange(m) % dp

    def worst(r: np.ndarray) -> float:
        return float(np.bincount(step * dp + r, weights=cost).reshape(steps, dp).max(1).sum())

    assert worst(rank) < 0.9 * worst(naive)
