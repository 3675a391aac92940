"""Compile warm-up ordering: every rank meets all its shapes in its prefix, largest first."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from varpack.plan.lr import step_totals
from varpack.plan.stages.warmup import (
    check_warmup_prefix,
    encode_shapes,
    first_new_shape_after_prefix,
    warmup_order,
)


@st.composite
def plans(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    dp = draw(st.integers(1, 4))
    grad_accum = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 6))
    n_shapes = draw(st.integers(1, 7))
    ids = draw(arrays(np.int64, (dp, steps * grad_accum), elements=st.integers(0, n_shapes - 1)))
    return ids, grad_accum


def simulate_compiles(shape_ids: np.ndarray) -> list[int]:
    """Positions where a rank running this sequence compiles a new graph (static compile)."""
    seen: set[int] = set()
    compiles = []
    for i, s in enumerate(shape_ids.tolist()):
        if s not in seen:
            seen.add(s)
            compiles.append(i)
    return compiles


@settings(max_examples=200, deadline=None)
@given(plans())
def test_reorder_invariants(plan: tuple[np.ndarray, int]) -> None:
    ids, grad_accum = plan
    perm, warm = warmup_order(ids)
    new = np.take_along_axis(ids, perm, axis=1)
    for r in range(ids.shape[0]):
        # A permutation within the rank: same micro-batches, and so grad_accum per step still.
        assert sorted(perm[r].tolist()) == list(range(ids.shape[1]))
        distinct = np.unique(ids[r])
        p = int(warm[r].sum())
        assert warm[r, :p].all() and not warm[r, p:].any()
        # One micro-batch per shape, largest first, then the rest in plan order.
        assert new[r, :p].tolist() == distinct[::-1].tolist()
        assert np.all(np.diff(perm[r, p:]) > 0)
        # Each representative is the first micro-batch of its shape.
        assert all(perm[r, j] == np.flatnonzero(ids[r] == new[r, j])[0] for j in range(p))
        # Simulated compiles all happen inside the warm-up prefix.
        assert all(i < p for i in simulate_compiles(new[r]))
        assert len(simulate_compiles(new[r])) == p
        assert first_new_shape_after_prefix(new[r], warm[r]) == -1
        assert check_warmup_prefix(new[r], warm[r], rank=r) == []


@settings(max_examples=100, deadline=None)
@given(plans())
def test_step_totals_after_reorder(plan: tuple[np.ndarray, int]) -> None:
    ids, grad_accum = plan
    rng = np.random.default_rng(ids.size)
    tokens = rng.integers(1, 1000, ids.shape)
    samples = rng.integers(1, 9, ids.shape)
    perm, _ = warmup_order(ids)
    t = np.take_along_axis(tokens, perm, axis=1)
    s = np.take_along_axis(samples, perm, axis=1)
    dp, n = ids.shape
    steps = n // grad_accum
    step = np.tile(np.arange(n) // grad_accum, dp)  # each position's step after the reorder
    ss, st_ = step_totals(step, s.ravel(), t.ravel(), steps)
    # Each step's total is the sum over all ranks of its grad_accum rows; totals are preserved.
    for k in range(steps):
        cols = slice(k * grad_accum, (k + 1) * grad_accum)
        assert st_[k] == t[:, cols].sum() and ss[k] == s[:, cols].sum()
    assert st_.sum() == tokens.sum() and ss.sum() == samples.sum()


def test_shapes_from_rows_and_lengths_reach_prefix(rng: np.random.Generator) -> None:
    """End to end on (rows, pad_to) shapes: ids by size, reorder, simulate every rank."""
    dp, n = 4, 48
    t = rng.choice([512, 1024, 2048, 4096], size=(dp, n))
    rows = 8192 // t
    ids, table = encode_shapes(rows, t)
    sizes = table[:, 0] * table[:, 1]
    assert np.all(np.diff(sizes) >= 0)
    assert np.all(table[ids, 1] == t) and np.all(table[ids, 0] == rows)
    perm, warm = warmup_order(ids)
    new = np.take_along_axis(ids, perm, axis=1)
    for r in range(dp):
        p = int(warm[r].sum())
        assert max(simulate_compiles(new[r])) < p
        # The first micro-batch is the rank's largest shape: an out-of-memory shows at once.
        assert new[r, 0] == new[r].max()
    # Without the reorder some rank meets a shape late (the checker sees it).
    late = [first_new_shape_after_prefix(ids[r], np.arange(n) < 1) for r in range(dp)]
    assert max(late) > 0


def test_checker_reports_bad_prefixes() -> None:
    mask = np.array([1, 1, 0, 0], bool)
    assert check_warmup_prefix(np.array([0, 1, 1, 0]), mask) == [
        "warm-up shapes are not largest first"
    ]
    assert check_warmup_prefix(np.array([1, 1, 0, 0]), mask) == [
        "the warm-up prefix repeats a shape",
        "micro-batch 2 has a shape not in the warm-up prefix",
    ]
    assert check_warmup_prefix(np.array([1, 0, 0]), np.array([1, 0, 1], bool)) == [
        "warm-up rows are not a prefix of the rank's plan"
    ]
