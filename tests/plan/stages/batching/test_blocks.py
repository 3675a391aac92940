"""Fixed-length blocks (BLoad): whole samples, best fit within windows, reset tables."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.metadata.synth import action_genome_lengths
from varpack.plan import PlanConfig
from varpack.plan.stages.batching.blocks import (
    DEFAULT_WINDOW,
    check_blocks,
    pack_blocks,
    reset_table,
)

#: The BLoad paper's block padding on Action Genome (Table I): 3,695 frames.
BLOAD_PADDING = 3695


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(1, 120), min_size=0, max_size=300),
    block_len=st.integers(1, 100),
    window=st.integers(1, 80),
    per_batch=st.integers(1, 5),
)
def test_block_invariants(lens: list[int], block_len: int, window: int, per_batch: int) -> None:
    a = np.array(lens, np.int64)
    p = pack_blocks(a, block_len, window)
    fits = a <= block_len
    # Every sample that fits is packed exactly once; the others are handed back as oversize.
    assert p.oversize.tolist() == np.flatnonzero(~fits).tolist()
    assert np.all((p.block_of_sample >= 0) == fits)
    assert sorted(p.order.tolist()) == np.flatnonzero(fits).tolist()
    blk = p.block_of_sample[p.order]
    assert np.all(np.diff(blk) >= 0) and (blk.size == 0 or blk[0] == 0)
    assert np.all(p.block_fill <= block_len) and np.all(p.block_fill > 0)
    assert p.block_fill.tolist() == np.bincount(blk, weights=a[p.order]).astype(int).tolist()
    # A block never mixes windows; within a window at most one block is at most half full
    # (best fit opens a block only when the sample fits no open one).
    win = p.order // window
    assert all(np.unique(win[blk == b]).size == 1 for b in np.unique(blk))
    block_win = np.zeros(p.block_fill.size, np.int64)
    block_win[blk] = win
    for w in np.unique(block_win):
        assert np.sum(2 * p.block_fill[block_win == w] <= block_len) <= 1
    # Micro-batches of per_batch blocks: block_index and the reset table of each row.
    n_mb = -(-p.block_fill.size // per_batch)
    off = np.searchsorted(blk, np.arange(n_mb + 1) * per_batch)
    bi = blk % per_batch
    lens_o = a[p.order]
    for i in range(off.size - 1):
        row = slice(off[i], off[i + 1])
        # start offsets: the sum of the block's earlier samples
        want = [
            int(lens_o[row][:j][bi[row][:j] == bi[row][j]].sum())
            for j in range(row.stop - row.start)
        ]
        assert reset_table(lens_o[row], bi[row]).tolist() == want
    t = np.full(off.size - 1, block_len)
    assert check_blocks(off, lens_o, bi, t, block_len, per_batch) == []


def test_deterministic_and_window_bounded(rng: np.random.Generator) -> None:
    a = rng.integers(1, 500, 5000)
    p1, p2 = pack_blocks(a, 512, 256), pack_blocks(a.copy(), 512, 256)
    assert all(np.array_equal(x, y) for x, y in zip(p1, p2, strict=True))
    # Samples move at most one window away from their stream position.
    rank_in_plan = np.empty(a.size, np.int64)
    rank_in_plan[p1.order] = np.arange(a.size)
    assert np.abs(rank_in_plan - np.arange(a.size)).max() < 256


def test_action_genome_data_shape() -> None:
    a = action_genome_lengths()
    assert (a.size, int(a.sum()), int(a.min()), int(a.max())) == (7464, 166_785, 3, 94)
    # The naive pad-to-longest figure of the paper (Table I, "0 padding") follows from it.
    assert a.size * a.max() - a.sum() == 534_831
    assert not np.array_equal(a, action_genome_lengths(seed=1))


def test_action_genome_padding_below_half_a_percent() -> None:
    """BLoad reports 3,695 padded frames (2.2 %) with blocks of T_max = 94; target <= 0.5 %."""
    rng = np.random.default_rng(0)
    a = action_genome_lengths()[rng.permutation(7464)]  # a shuffled epoch
    t = int(a.max())  # BLoad's block length: the longest sample
    assert t == 94
    p = pack_blocks(a, t, DEFAULT_WINDOW)
    padding = p.block_fill.size * t - int(a.sum())
    assert p.oversize.size == 0
    assert padding <= 0.005 * p.block_fill.size * t
    assert padding < BLOAD_PADDING
    # Never fewer blocks than the frames need.
    assert p.block_fill.size >= -(-int(a.sum()) // t)


def test_check_blocks_reports() -> None:
    off = np.array([0, 2])
    t = np.array([10])
    assert check_blocks(off, np.array([4, 4]), np.array([0, 2]), t, 10, 4)  # gap in block_index
    assert check_blocks(off, np.array([4, 4]), np.array([1, 1]), t, 10, 4)  # does not start at 0
    assert check_blocks(off, np.array([4, 4]), np.array([0, 1]), t, 10, 1)  # over blocks/batch
    assert check_blocks(off, np.array([4, 4]), np.array([0]), t, 10, 2)  # length mismatch
    assert check_blocks(off, np.array([4, 7]), np.array([0, 0]), t, 10, 2) == [
        "micro-batch 0: block 0 holds 11, over the block length 10"
    ]


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="--block-len"):
        pack_blocks(np.array([3]), 0)
    with pytest.raises(ConfigError, match="exceeds --max-tokens"):
        PlanConfig(batching="blocks", block_len=128, max_tokens=100).resolved()
    cfg = PlanConfig(batching="blocks", max_tokens=16_384).with_block_len(94)
    assert (cfg.block_len, cfg.blocks_per_batch) == (94, 174)
