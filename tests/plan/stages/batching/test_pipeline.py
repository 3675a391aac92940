"""Pipeline parallel: the rule validate applies, and the planner's grouping kernels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan.stages.batching.pipeline import check_pipeline_steps, expand_groups, step_groups


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(1, 64), min_size=1, max_size=80),
    k=st.integers(1, 4),
    budget=st.integers(64, 256),
    cuts=st.lists(st.integers(0, 80), max_size=4),
)
def test_step_groups_fit_k_micro_batches_of_one_shape(lens, k, budget, cuts):
    bounds = np.unique(np.clip([0, *cuts, len(lens)], 0, len(lens)))
    e = np.concatenate(
        [np.sort(np.array(lens[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    )
    try:
        perm, starts, _ = step_groups(e, bounds, k, budget)
    except ConfigError as exc:  # a lone segment too small to give every group k samples
        assert "cannot fill" in str(exc)
        return
    e2 = e if perm is None else e[perm]
    assert sorted(e2.tolist()) == sorted(e.tolist())
    n = np.diff(starts)
    assert (n >= k).all()
    t = np.maximum.reduceat(e2, starts[:-1])
    assert (-(-n // k) * t <= budget).all()  # ceil(n / k) rows of T fit the budget
    off, pad_to, pad_rows = expand_groups(starts, t, k)
    sizes = np.diff(off)
    assert (sizes >= 1).all() and off[-1] == len(e)
    rows = sizes + pad_rows
    assert (rows.reshape(-1, k) == rows.reshape(-1, k)[:, :1]).all()  # one shape per group
    assert (rows * pad_to <= budget).all()


def test_check_pipeline_steps_reports_budget() -> None:
    msgs = check_pipeline_steps(np.array([0, 0]), np.array([3, 3]), np.array([8, 8]), 2, 16)
    assert msgs == ["step 0: shape 3 x 8 exceeds the budget 16"] * 2
