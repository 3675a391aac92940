"""Length shapes and plan options the tests of the shuffled composers share: hypothesis
strategies of small lengths with a few near the budget, of the options every shuffled plan
takes, and the heavy-bodied long tail."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

#: lengths up to a budget of 300-512, some at 400
lengths = st.lists(
    st.one_of(st.integers(1, 60), st.integers(1, 400), st.just(400)), min_size=1, max_size=300
)
#: many light samples and a few heavy ones (near the budget), the long-SFT shape in small
heavy_mix = st.tuples(
    st.lists(st.integers(1, 80), min_size=20, max_size=400),
    st.lists(st.integers(200, 400), min_size=0, max_size=12),
).map(lambda t: t[0] + t[1])


def options(**more: st.SearchStrategy) -> st.SearchStrategy:  # type: ignore[type-arg]
    """The options of a small shuffled plan (budgets 300-512), and ``more`` of the caller's."""
    return st.fixed_dictionaries(
        {
            "dp": st.integers(1, 4),
            "grad_accum": st.integers(1, 4),
            "window": st.integers(1, 4),
            "epochs": st.integers(1, 2),
            "seed": st.integers(0, 5),
            "pad_multiple": st.sampled_from([1, 1, 8]),
            "oversize": st.sampled_from(["error", "drop", "alone"]),
            "budget": st.sampled_from([400, 512, 300]),
            **more,
        }
    )


def sorted_lengths(lens) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``lens`` as int64, sorted (the planner's input order)."""
    return np.sort(np.asarray(lens, dtype=np.int64), kind="stable")


def heavy_bodied(n: int, seed: int = 0, cap: int = 16384) -> np.ndarray:
    """A long tail with a heavy body: lognormal around 450 tokens, up to ``cap``."""
    x = np.random.default_rng(seed).lognormal(np.log(450), 1.45, n)
    return sorted_lengths(np.clip(np.rint(x), 1, cap))
