"""A window dealt window-wide at grad-accum 1 (``plan/kernels/lpt.py``) and the slot cut that
mixes alike micro-batches (``slot_order``'s ``mix``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.plan import PlanConfig, make_plan
from varpack.plan.kernels import compose_threads as threads_mod
from varpack.plan.kernels.level import slot_cut_time
from varpack.plan.kernels.lpt import lpt_window, mix_window, window_time
from varpack.plan.kernels.slots import _sorted_blocks, slot_order
from varpack.plan.stages.batching import costed

LIN, QUAD = 1.0, 0.01


def _deal(lens, alone, wait, nbins, cap, last=False):  # type: ignore[no-untyped-def]
    order = np.argsort(-lens, kind="stable")
    where = np.empty(len(lens), dtype=np.int64)
    ok = lpt_window(np.arange(len(lens)), order, wait, lens, alone, LIN, QUAD, nbins, cap, where,
                    last)  # fmt: skip
    return ok, where


def _rollouts(n, seed, cap=8192):  # type: ignore[no-untyped-def]
    """RL rollouts (as the balance benchmark's): a prompt and a response cut at a ``cap``-token
    generation limit (a quarter of them reach it), sorted."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(np.exp(rng.normal(np.log(350), 0.7, n))), 16, 4096)
    response = np.clip(np.rint(np.exp(rng.normal(np.log(4200), 1.0, n))), 1, cap)
    return np.sort((prompt + response).astype(np.int64))


@settings(max_examples=80, deadline=None)
@given(
    lens=st.lists(st.integers(1, 100), min_size=1, max_size=60),
    lone=st.lists(st.booleans(), min_size=60, max_size=60),
    held=st.lists(st.booleans(), min_size=60, max_size=60),
    nbins=st.integers(1, 12),
    last=st.booleans(),
)
def test_the_deal_places_each_sample_once_within_the_budget(lens, lone, held, nbins, last):
    x = np.array(lens, dtype=np.int64)
    alone, wait = np.array(lone[: len(x)]), np.array(held[: len(x)])
    ok, where = _deal(x, alone, wait, nbins, 100, last)
    if not ok:
        return
    assert np.all(where[wait] == -1)
    assert np.all((where >= -1) & (where < nbins))
    assert np.all(np.bincount(where[where >= 0], minlength=nbins) > 0)  # none empty
    assert np.all(np.bincount(where[where >= 0], x[where >= 0], nbins) <= 100)
    for b in np.unique(where[alone & (where >= 0)]):  # a sample that needs its own, alone
        assert np.sum(where == b) == 1
    if last:  # the epoch's last window places every sample that does not wait
        assert np.all(where[~wait] >= 0)


def _by_scan(lens, alone, wait, nbins, cap):  # type: ignore[no-untyped-def]
    """The deal written plainly: each sample, costliest first, to the least loaded micro-batch
    with room, the first of a tie (a lone sample: an empty one, closed after)."""
    load, tok, closed = np.zeros(nbins), np.zeros(nbins, np.int64), np.zeros(nbins, bool)
    where = np.full(len(lens), -1)
    for i in np.argsort(-lens, kind="stable"):
        if wait[i]:
            continue
        room = [j for j in range(nbins) if not closed[j]
                and (tok[j] == 0 if alone[i] else tok[j] + lens[i] <= cap)]  # fmt: skip
        if room:
            j = min(room, key=lambda j: (load[j], j))
            where[i], load[j], tok[j], closed[j] = (
                j,
                load[j] + LIN * lens[i] + QUAD * lens[i] ** 2,
                tok[j] + lens[i],
                alone[i],
            )
    return where


@settings(max_examples=120, deadline=None)
@given(
    lens=st.lists(st.integers(1, 100), min_size=1, max_size=60),
    lone=st.floats(0, 0.3),
    nbins=st.integers(1, 12),
    seed=st.integers(0, 99),
)
def test_the_heap_deals_as_a_plain_scan_does(lens, lone, nbins, seed):
    """The micro-batches wait in a heap by load (``log(nbins)`` a sample): the same deal as
    scanning them all (before ``fill_empty`` gives empty ones a sample)."""
    x = np.array(lens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    alone, wait = rng.random(len(x)) < lone, rng.random(len(x)) < 0.1
    _, where = _deal(x, alone, wait, nbins, 100)
    want = _by_scan(x, alone, wait, nbins, 100)
    moved = where != want  # fill_empty moves a sample into each empty micro-batch
    assert np.all(np.isin(where[moved], np.setdiff1d(np.arange(nbins), want)))


def test_every_micro_batch_lands_near_the_windows_mean_cost():
    lens = _rollouts(200, 0)  # about three a micro-batch of 16 K
    ok, where = _deal(lens, np.zeros(200, bool), np.zeros(200, bool), 64, 16384)
    assert ok and np.all(where >= 0)
    c = np.bincount(where, LIN * lens + QUAD * lens.astype(float) ** 2, 64)
    assert c.max() / c.mean() < 1.05 and c.min() / c.mean() > 0.94


def test_the_last_window_that_cannot_place_everything_says_so():
    lens = np.array([60, 60, 60], dtype=np.int64)  # two micro-batches of 100 hold two of them
    ok, _ = _deal(lens, np.zeros(3, bool), np.zeros(3, bool), 2, 100, last=True)
    assert not ok
    ok, where = _deal(lens, np.zeros(3, bool), np.zeros(3, bool), 2, 100, last=False)
    assert ok and sorted(where.tolist()) == [-1, 0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_the_window_keeps_whichever_deal_waits_less(seed):
    lens = _rollouts(150, seed)
    m, nbins, dp = len(lens), 48, 8
    buf, order = np.arange(m), np.argsort(-lens, kind="stable")
    mine = np.random.default_rng(seed).integers(0, nbins, m)  # a poor composition
    where = mine.copy()
    took = mix_window(buf, order, np.zeros(m, bool), lens, np.zeros(m, bool), LIN, QUAD, nbins,
                      dp, 1 << 20, where, False, 0)  # fmt: skip
    before = window_time(buf, m, mine, lens, nbins, dp, LIN, QUAD)
    after = window_time(buf, m, where, lens, nbins, dp, LIN, QUAD)
    assert took and after < before
    again = where.copy()  # the window-wide deal itself: no better one to take
    assert not mix_window(buf, order, np.zeros(m, bool), lens, np.zeros(m, bool), LIN, QUAD,
                          nbins, dp, 1 << 20, again, False, 0)  # fmt: skip
    assert np.array_equal(again, where)


def test_the_cut_mixes_only_blocks_dealt_window_wide():
    rng = np.random.default_rng(0)
    cost = 100 + rng.random(64)  # within 1 % of each other: one bucket of 4 %
    wide = np.zeros(64, bool)
    wide[:32] = True  # the first block of 4 steps x dp 8 dealt window-wide
    a = slot_order(cost, 8, 1, 4, (0.04, np.uint64(1), wide))
    b = slot_order(cost, 8, 1, 4, (0.04, np.uint64(2), wide))
    plain = slot_order(cost, 8, 1, 4)
    assert np.array_equal(np.sort(a), np.arange(64))
    assert np.array_equal(a[32:], plain[32:])  # the composer's block: the sorted cut
    assert not np.array_equal(a[:32], plain[:32]) and not np.array_equal(a[:32], b[:32])
    assert np.array_equal(a, slot_order(cost, 8, 1, 4, (0.04, np.uint64(1), wide)))


def test_buckets_keep_unlike_costs_in_cost_order():
    cost = np.repeat([400.0, 300, 200, 100], 8) + np.tile(np.arange(8) * 0.1, 4)
    order = slot_order(cost, 4, 1, 8, (0.04, np.uint64(5), np.ones(32, bool)))
    runs = cost[_sorted_blocks(cost, 32)]
    mixed = cost[np.sort(order.reshape(-1, 4), axis=1).ravel()]  # each slot's costs
    assert slot_cut_time(mixed, 4) <= slot_cut_time(runs, 4) * 1.01
    assert sorted(np.floor(cost[order] / 100).tolist()) == sorted(np.floor(cost / 100).tolist())
    slots = cost[order].reshape(-1, 4)
    assert np.all(slots.max(axis=1) - slots.min(axis=1) < 1.0)  # a slot holds one bucket


def _plan_figures(lens, monkeypatch, wide):  # type: ignore[no-untyped-def]
    if not wide:
        run = threads_mod.compose_threaded
        monkeypatch.setattr(costed, "compose_threaded",
                            lambda *a, **k: run(*a, **{**k, "mix": False}))  # fmt: skip
    cfg = PlanConfig(max_tokens=16384, dp=16, cost="flops", hidden=896, kv_hidden=128, layers=24,
                     order="shuffle", seed=3)  # fmt: skip
    _, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    monkeypatch.undo()
    return meta["stats"]["time_vs_ideal"], meta["stats"]["mixing"]


def test_rollouts_at_grad_accum_1_mix_better_at_the_same_time(monkeypatch):
    lens = _rollouts(12_000, 7)
    t0, mix0 = _plan_figures(lens, monkeypatch, wide=False)
    t1, mix1 = _plan_figures(lens, monkeypatch, wide=True)
    assert mix1 < mix0 - 0.03, (mix0, mix1)
    assert t1 < t0 + 0.005, (t0, t1)
