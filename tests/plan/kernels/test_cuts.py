"""Each row's next cut, found at once, gives greedy packing's micro-batches from any start."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.plan.kernels.cuts import follow, next_cuts
from varpack.plan.kernels.pack import PackRule, pack


def _starts(lens: np.ndarray, alone: np.ndarray, rule: PackRule, group: np.ndarray) -> np.ndarray:
    return pack(lens, np.array([0, len(lens)]), alone, rule, 0, group)[1]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400),
    layout=st.sampled_from(["packed", "padded", "fixed"]),
    shape=st.sampled_from(["uniform", "sorted", "ties"]),
)
def test_following_the_cuts_is_packing_from_that_row(
    seed: int, n: int, layout: str, shape: str
) -> None:
    rng = np.random.default_rng(seed)
    budget = int(rng.choice([64, 512, 4096]))
    lens = rng.integers(1, budget + budget // 4, n)
    if shape == "sorted":  # curriculum shares: equal lengths in long runs
        lens = np.sort(lens)
    elif shape == "ties":
        lens = rng.choice(np.array([1, 7, budget // 3, budget]), n)
    alone = rng.random(n) < float(rng.choice([0.0, 0.02, 0.3]))
    group = np.where(rng.random(n) < float(rng.choice([0.0, 0.2, 0.9])), rng.integers(0, 6, n), -1)
    if layout == "fixed":
        rule = PackRule(batch_size=int(rng.integers(1, 9)))
    else:
        rule = PackRule(layout=layout, pad_multiple=int(rng.choice([1, 8, 64])), max_tokens=budget)
    nxt = next_cuts(lens, alone, rule, group)
    for start in {0, int(rng.integers(0, n)), n - 1}:
        want = _starts(lens[start:], alone[start:], rule, group[start:]) + start
        assert np.array_equal(follow(nxt, start), want), (start, layout)
