"""Shuffled packing over runs of the stream: cut at window starts, the carry between windows
handed from run to run, the runs give the micro-batches of the whole stream (what ``plan``
under MPI relays from rank to rank)."""

from __future__ import annotations

import numpy as np
import pytest

from varpack.plan.kernels.compose import compose_run
from varpack.plan.kernels.order import OrderRule, regroup
from varpack.plan.kernels.pack import PackRule, pack_steps


def _lens(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    body = np.exp(rng.normal(5.0, 1.2, n)).astype(np.int64) + 1
    return np.minimum(body, 4000)


def _window_starts(weight: np.ndarray, size: int, runs: int) -> list[int]:
    """``runs - 1`` window starts spread over the first 3/4 of the stream, and its ends."""
    window = (np.cumsum(weight) - weight) // size
    starts = np.flatnonzero(np.diff(window)) + 1
    starts = starts[starts < 3 * len(weight) // 4]
    picks = np.linspace(0, len(starts) - 1, runs + 1)[1:-1].astype(int) if len(starts) else []
    return [0, *sorted({int(starts[i]) for i in picks}), len(weight)]


@pytest.mark.parametrize("seed", range(6))
def test_packed_steps_over_runs_are_the_whole_streams(seed: int) -> None:
    lens = _lens(seed, 3000)
    rule = PackRule(max_tokens=4096)
    orule = OrderRule(seed, 1 + seed % 3, 9000 + 1000 * seed)
    cap = 2 + seed % 3
    idx, bounds = regroup(np.arange(len(lens)), lens, orule)
    whole, whole_off, _ = pack_steps(lens[idx], bounds, np.zeros(len(lens), bool), rule, cap)
    cuts = _window_starts(lens, orule.window * orule.step, 3)
    assert len(cuts) > 3
    stream, offs, carry = [], [], np.zeros(0, np.int64)
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        ridx, rb = regroup(np.arange(a, b), lens, orule, int(lens[:a].sum()))
        rows = np.concatenate((carry, ridx))  # input rows, carried ones first
        perm, off, left = pack_steps(lens[rows], rb + len(carry), np.zeros(len(rows), bool),
                                     rule, cap, None, len(carry), b == len(lens))  # fmt: skip
        at = sum(len(s) for s in stream)
        stream.append(rows[perm])
        offs.append(off[:-1] + at)
        carry = rows[left]
    assert len(carry) == 0
    assert np.array_equal(np.concatenate(stream), idx[whole])
    assert np.array_equal(np.append(np.concatenate(offs), len(lens)), whole_off)


@pytest.mark.parametrize("seed", range(6))
def test_steps_composed_over_runs_are_the_whole_streams(seed: int) -> None:
    lens = _lens(seed, 4000)
    alone = np.zeros(len(lens), bool)
    dp, k, window_tok, step_tok = 2 + seed % 3, 1 + seed % 2, 60_000, 20_000
    args = ((1.0, 1e-4 * (seed % 2)), window_tok, step_tok, dp, k, 1, 4096, 0.75)
    whole = compose_run(lens, alone, *args)
    assert whole is not None
    cuts = _window_starts(lens, window_tok, 4)
    assert len(cuts) > 3
    stream, offs = [], []
    carry, held = np.zeros(0, np.int64), np.zeros(0, bool)
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        rows = np.concatenate((carry, np.arange(a, b)))
        run = (len(carry), int(lens[:a].sum()), int(lens[b:].sum()), len(lens) - b, held)
        got = compose_run(lens[rows], alone[rows], *args, None, run)
        assert got is not None
        at = sum(len(s) for s in stream)
        stream.append(rows[got.stream])
        offs.append(got.starts[:-1] + at)
        carry, held = rows[got.carry], got.held
    assert len(carry) == 0
    assert np.array_equal(np.concatenate(stream), whole.stream)
    assert np.array_equal(np.append(np.concatenate(offs), len(lens)), whole.starts)
