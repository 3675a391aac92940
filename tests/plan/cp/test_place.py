"""Context-parallel placement: capacity, each sample once, values in range, rollback, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan.cp.cost import CPModel, cp_load, over_capacity
from varpack.plan.cp.place import CP_PLACEMENTS, place

STRATEGIES = sorted(CP_PLACEMENTS)


@st.composite
def micro_batches(draw):  # type: ignore[no-untyped-def]
    """Micro-batches that fit (total <= C * N), so every strategy must place them."""
    n = draw(st.integers(1, 8))
    cap = draw(st.integers(1, 200))
    count = draw(st.integers(1, 6))
    lens, offsets = [], [0]
    for _ in range(count):
        budget = cap * n
        k = draw(st.integers(1, 12))
        seg = []
        for _ in range(k):
            if budget < 1:
                break
            s = draw(st.integers(1, budget))
            seg.append(s)
            budget -= s
        lens += seg
        offsets.append(len(lens))
    return np.array(lens, np.int64), np.array(offsets, np.int64), cap, n


@settings(max_examples=150, deadline=None)
@given(micro_batches(), st.sampled_from(STRATEGIES))
def test_every_fitting_micro_batch_is_placed_within_capacity(mb, strategy):
    lens, offsets, cap, n = mb
    out = place(lens, offsets, cap, n, strategy, (1.0, 0.01))
    assert out.shape == lens.shape and out.dtype == np.int32  # one placement per sample
    assert ((out >= -1) & (out < n)).all()
    model = CPModel(n, cap)
    load = cp_load(offsets, lens, out, model)
    assert len(over_capacity(load, model)) == 0
    assert (load.memory <= n * cap).all()
    # tokens are conserved: every CP rank's share adds up to the micro-batch
    assert np.array_equal(load.memory.sum(axis=1) // n, np.add.reduceat(lens, offsets[:-1]))
    if strategy == "distributed":
        assert (out == -1).all()


@settings(max_examples=100, deadline=None)
@given(micro_batches())
def test_dacp_never_shards_a_micro_batch_that_fits_one_rank_each(mb):
    lens, offsets, cap, n = mb
    out = place(lens, offsets, cap, n, "dacp")
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        if (lens[a:b] <= cap).all() and b - a <= n:  # one sample per rank fits: nothing sharded
            assert (out[a:b] >= 0).all()


def test_short_samples_stay_local_and_balanced():
    lens = np.array([3, 3, 3, 3, 2, 2, 2, 2])
    out = place(lens, np.array([0, 8]), cap=10, n=4)
    assert (out >= 0).all()
    assert np.bincount(out, weights=lens, minlength=4).tolist() == [5, 5, 5, 5]


def test_long_sample_is_distributed():
    out = place(np.array([2, 2, 30]), np.array([0, 3]), cap=12, n=4)
    assert out.tolist()[2] == -1 and out[0] >= 0 and out[1] >= 0


def test_rollback_turns_a_placed_local_sample_distributed():
    # N=2, C=6: 1 goes to rank 0, 4 to rank 1 (2 tokens left); 6 needs 3 on each rank, so the
    # local 4 is rolled back (rank 1: 2 + 3 = 5 <= 6), then 6 fits: rank 0 holds 1 + 2 + 3.
    lens, off = np.array([1, 4, 6]), np.array([0, 3])
    out = place(lens, off, cap=6, n=2)
    assert out.tolist() == [0, -1, -1]
    assert cp_load(off, lens, out, CPModel(2, 6)).memory.tolist() == [[12, 10]]


def test_rollback_down_to_every_sample_distributed():
    lens, off = np.array([2, 4, 6]), np.array([0, 3])  # exactly C * N tokens
    assert place(lens, off, cap=6, n=2).tolist() == [-1, -1, -1]


def test_error_names_the_micro_batch():
    with pytest.raises(ConfigError, match=r"micro-batch 1 \(2 samples, 30 tokens\).*--bucket-size"):
        place(np.array([1, 10, 20]), np.array([0, 1, 3]), cap=7, n=4)


def test_round_robin_fills_the_emptiest_rank():
    out = place(np.array([1, 2, 3]), np.array([0, 3]), cap=10, n=2, strategy="round-robin")
    assert out.tolist() == [0, 1, 0]


def test_cost_overlaps_communication_with_local_compute():
    lens, off, pl = np.array([4, 8]), np.array([0, 2]), np.array([0, -1])
    slow = CPModel(2, 100, comm_bw=1.0, kv_bytes=1.0)  # comm 4 s > local 4 s? equal
    fast = CPModel(2, 100, comm_bw=100.0, kv_bytes=1.0)
    assert cp_load(off, lens, pl, fast).cost.tolist() == [8.0]  # local 4 + dist 4
    assert cp_load(off, lens, pl, slow).cost.tolist() == [8.0]  # max(4, 4) + 4
    slower = CPModel(2, 100, comm_bw=0.5, kv_bytes=1.0)
    assert cp_load(off, lens, pl, slower).cost.tolist() == [12.0]  # comm 8 + 4


def test_full_rollback_when_one_shard_would_overflow_another_rank():
    # N=3, C=5, 15 tokens = C * N exactly (found by searching a Python mirror of the kernel):
    # after a first rollback, sharding the fullest rank's longest local sample would overflow
    # another rank, so every local sample placed so far becomes distributed at once.
    lens, off = np.array([4, 3, 5, 3]), np.array([0, 4])
    out = place(lens, off, cap=5, n=3)
    assert out.tolist() == [-1, -1, -1, -1]
    assert cp_load(off, lens, out, CPModel(3, 5)).memory.tolist() == [[15, 15, 15]]
