"""Pipeline parallel: one shape per (step, rank), micro-batch counts a multiple of P."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan.pipeline import (
    check_pipeline_steps,
    pipeline_rebatch,
    pipeline_shapes,
    split_to_multiple,
)
from varpack.plan.shapes import round_up


@st.composite
def step_groups(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples of (step, rank) groups: lengths, group offsets, group steps."""
    dp = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 12), min_size=dp * steps, max_size=dp * steps))
    lens = draw(st.lists(st.integers(1, 64), min_size=sum(sizes), max_size=sum(sizes)))
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return np.array(lens, np.int64), off, np.repeat(np.arange(steps), dp)


@settings(max_examples=150, deadline=None)
@given(
    groups=step_groups(),
    pp=st.integers(1, 4),
    budget=st.integers(64, 300),
    m=st.sampled_from([1, 8]),
    uniform=st.booleans(),
)
def test_rebatch_invariants(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray], pp: int, budget: int, m: int, uniform: bool
) -> None:
    lens, goff, gstep = groups
    off, mb_group, t, pad_rows = pipeline_rebatch(lens, goff, gstep, budget, pp, m, uniform)
    n = np.diff(off)
    # Nothing lost, order kept, and every micro-batch inside its own group.
    assert off[0] == 0 and off[-1] == lens.size and np.all(n >= 0)
    assert np.all(off[:-1] >= goff[mb_group]) and np.all(off[1:] <= goff[mb_group + 1])
    counts = np.bincount(mb_group, minlength=goff.size - 1)
    assert np.all(counts % pp == 0)
    for s in np.unique(gstep):  # equal counts on every rank of a step
        assert np.unique(counts[gstep == s]).size == 1
    if uniform:
        assert np.unique(counts).size == 1
    rows = n + pad_rows
    assert np.all(pad_rows >= 0)
    step = gstep[mb_group]
    for g in range(goff.size - 1):
        sel = mb_group == g
        group_lens = lens[goff[g] : goff[g + 1]]
        assert np.unique(t[sel]).tolist() == [round_up(group_lens.max(), m)]
        assert np.unique(rows[sel]).size == 1
        assert check_pipeline_steps(step[sel], rows[sel], t[sel], pp, budget, rank=0) == []


@st.composite
def micro_batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_groups = draw(st.integers(1, 5))
    per_group = draw(st.integers(1, 5))  # equal counts per group, as the planner makes them
    sizes = draw(
        st.lists(st.integers(1, 9), min_size=n_groups * per_group, max_size=n_groups * per_group)
    )
    lens = draw(st.lists(st.integers(1, 100), min_size=sum(sizes), max_size=sum(sizes)))
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return np.array(lens, np.int64), off, np.repeat(np.arange(n_groups) * 3 + 1, per_group)


@settings(max_examples=150, deadline=None)
@given(mbs=micro_batches(), pp=st.integers(1, 5))
def test_split_to_multiple(mbs: tuple[np.ndarray, np.ndarray, np.ndarray], pp: int) -> None:
    lens, off, group = mbs
    try:
        new_off, new_group = split_to_multiple(off, group, lens, pp)
    except ConfigError:
        # Only when some group has fewer samples than the count it must reach.
        for g in np.unique(group):
            sel = np.flatnonzero(group == g)
            target = -(-sel.size // pp) * pp
            if off[sel[-1] + 1] - off[sel[0]] < target:
                return
        raise
    # Only cuts are added: nothing moves or is lost, and no piece is empty.
    assert set(off.tolist()) <= set(new_off.tolist())
    assert new_off[-1] == lens.size and np.all(np.diff(new_off) >= 1)
    ids, counts = np.unique(new_group, return_counts=True)
    assert ids.tolist() == np.unique(group).tolist() and np.all(counts % pp == 0)
    old_counts = np.unique(group, return_counts=True)[1]
    assert counts.tolist() == (-(-old_counts // pp) * pp).tolist()
    # Each new micro-batch lies inside one old micro-batch of the same group.
    parent = np.searchsorted(off, new_off[:-1], side="right") - 1
    assert np.all(new_off[1:] <= off[parent + 1]) and np.all(group[parent] == new_group)


def test_split_picks_the_largest_and_reports_impossible() -> None:
    lens = np.array([1, 1, 50, 50, 2])
    off, g = split_to_multiple(np.array([0, 2, 4, 5]), np.array([0, 0, 0]), lens, 2)
    assert off.tolist() == [0, 2, 3, 4, 5] and g.tolist() == [0, 0, 0, 0]
    with pytest.raises(ConfigError, match="multiple of --pp"):
        split_to_multiple(np.array([0, 1, 2, 3]), np.array([0, 0, 0]), lens[:3], 2)


def test_pipeline_shapes_extra_padding(rng: np.random.Generator) -> None:
    group = np.repeat(np.arange(5), 4)
    rows = rng.integers(1, 5, group.size)
    t = rng.integers(8, 64, group.size)
    b, tt, extra = pipeline_shapes(group, rows, t)
    for g in range(5):
        sel = group == g
        assert b[g] == rows[sel].max() and tt[g] == t[sel].max()
        assert extra[g] == (b[g] * tt[g] - rows[sel] * t[sel]).sum() >= 0


def test_check_pipeline_steps_reports_budget() -> None:
    msgs = check_pipeline_steps(np.array([0, 0]), np.array([3, 3]), np.array([8, 8]), 2, 16)
    assert msgs == ["step 0: shape 3 x 8 exceeds the budget 16"] * 2
