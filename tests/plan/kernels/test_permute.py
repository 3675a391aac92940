"""The epoch permutation: a permutation, deterministic, NumPy's own when small, uniform when drawn
in buckets; and the moved figures tallied in one pass agree with the piecewise tally."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from varpack.plan.kernels.order import MovedTally, stream_positions
from varpack.plan.kernels.permute import WHOLE, _draw, permutation, permuted


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 70_000])
def test_a_permutation_with_values_moved_along(n: int) -> None:
    values = np.random.default_rng(n).integers(1, 10_000, n)
    perm, moved = _draw(5, 1, n, values, whole=64, bucket=256, block=100)
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert moved is not None and np.array_equal(moved, values[perm])
    again, none = _draw(5, 1, n, None, whole=64, bucket=256, block=100)
    assert none is None and np.array_equal(again, perm)  # the values do not change the draw


def test_small_epochs_keep_numpys_permutation() -> None:
    for n in (0, 5, 1000, WHOLE):
        assert np.array_equal(permutation(2, 3, n), np.random.default_rng([2, 3]).permutation(n))


def test_large_epochs_are_drawn_in_buckets_and_stay_deterministic() -> None:
    n = WHOLE + 12_345
    perm = permutation(0, 4, n)
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert np.array_equal(perm, permutation(0, 4, n))
    assert not np.array_equal(perm, permutation(0, 5, n))
    assert not np.array_equal(perm, np.random.default_rng([0, 4]).permutation(n))
    lens = np.arange(n, dtype=np.int64) % 997 + 1
    p2, moved = permuted(0, 4, lens)
    assert np.array_equal(p2, perm) and np.array_equal(moved, lens[perm])


def test_every_permutation_equally_likely_through_buckets() -> None:
    """All 24 orders of 4 samples, drawn in 2 buckets: a chi-square test of uniformity."""
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    draws = 24_000
    counts = np.zeros(24)
    for seed in range(draws):
        perm, _ = _draw(seed, 11, 4, None, whole=1, bucket=2, block=3)
        counts[index[tuple(perm.tolist())]] += 1
    expected = draws / 24
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 60.0  # 23 degrees of freedom: p < 1e-5 above 60
    assert counts.min() > 0


def test_each_sample_lands_anywhere_alike() -> None:
    """Every sample's position is uniform over the epoch (sample x position-decile table)."""
    n, draws = 200, 3000
    table = np.zeros((n, 10))
    for seed in range(draws):
        perm, _ = _draw(seed, 3, n, None, whole=8, bucket=16, block=64)
        table[perm, np.arange(n) * 10 // n] += 1
    expected = draws / 10
    chi2 = ((table - expected) ** 2 / expected).sum(axis=1)
    assert chi2.max() < 45.0  # 9 degrees of freedom per sample: p < 1e-6 above 45


def test_one_pass_tally_matches_the_piecewise_one() -> None:
    rng = np.random.default_rng(0)
    n, per_step = 5000, 6
    plens = rng.integers(1, 500, n)
    pos = rng.permutation(n)
    starts = np.linspace(0, n, 6 * per_step * 7 + 1).astype(np.int64)  # 42 micro-batches
    one, two = MovedTally(), MovedTally()
    one.add_epoch(pos, starts, plens, per_step)
    steps = (len(starts) - 1) // per_step
    step = np.repeat(np.arange(len(starts) - 1) // per_step, np.diff(starts))
    two.add(step, stream_positions(plens)[pos], 0, steps / (2 * float(plens.sum())))
    a, b = one.figures(3), two.figures(3)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-12)
    assert np.array_equal(np.trim_zeros(one.hist, "b"), np.trim_zeros(two.hist, "b"))


def test_plans_drawn_in_buckets_pass_validate(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The planner and ``validate`` draw the same bucketed permutation (moved figures agree)."""
    from varpack.metadata.synth import sample_lengths
    from varpack.plan import PlanConfig, make_plan
    from varpack.planfile.format import write_plan
    from varpack.planfile.tables import plan_tables
    from varpack.validate import validate_plan

    lens = np.sort(sample_lengths("long-tail", 6000, np.random.default_rng(2), max_len=4096))
    ids = np.arange(len(lens), dtype=np.int64) * 5 + 3
    monkeypatch.setattr("varpack.plan.kernels.permute.WHOLE", 500)
    monkeypatch.setattr("varpack.plan.kernels.permute.BUCKET", 256)
    for compose in ("cost", "tokens"):
        cfg = PlanConfig(max_tokens=4096, dp=2, order="shuffle", epochs=2, compose=compose)
        p, meta, extra = make_plan(ids, lens, cfg)
        first = p.stream[: len(lens)]
        assert sorted(first.tolist()) == list(range(len(lens)))
        out = tmp_path / compose
        write_plan(out, meta, list(plan_tables(p)), rank_extra=extra)
        assert validate_plan(out, (ids, lens)).problems == []
