"""Curriculum steps levelled by cost: micro-batches in cost order inside windows of steps."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.plan import PlanConfig, make_plan, plan_arrays
from varpack.plan.stages import levelling
from varpack.plan.stages.levelling import by_cost_in_windows
from varpack.planfile.format import write_plan
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan

FLOPS = dict(cost="flops", model_preset="qwen2.5-0.5b")


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=60),
    costs=st.data(),
    window=st.integers(1, 9),
)
def test_property_micro_batches_move_whole_inside_their_window(sizes, costs, window):
    m = len(sizes)
    cost = np.array(costs.draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)), float)
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    idx = np.arange(off[-1], dtype=np.int64) * 7
    lens = np.arange(off[-1], dtype=np.int64) + 100
    new_idx, new_off, new_lens = by_cost_in_windows(idx, off, lens, cost, window)
    assert new_off[0] == 0 and new_off[-1] == off[-1]
    moved = [tuple(new_idx[new_off[j] : new_off[j + 1]].tolist()) for j in range(m)]
    before = [tuple(idx[off[j] : off[j + 1]].tolist()) for j in range(m)]
    assert np.array_equal(new_lens, new_idx // 7 + 100)  # lengths travel with their samples
    for a in range(0, m, window):
        here = moved[a : a + window]
        assert sorted(here) == sorted(before[a : a + window])  # the window's micro-batches
        got = [cost[before.index(mb)] for mb in here]
        assert got == sorted(got)  # in cost order
        ties = [before.index(mb) for mb in here]
        for x, y in zip(range(len(here)), range(1, len(here)), strict=False):
            if got[x] == got[y]:
                assert ties[x] < ties[y]  # ties keep the stream order


def _heavy_bodied(n: int) -> np.ndarray:
    x = np.random.default_rng(0).lognormal(np.log(450), 1.45, n)
    return np.sort(np.clip(np.rint(x), 1, 16384).astype(np.int64))


def test_levelled_curriculum_is_closer_to_the_ideal(monkeypatch: pytest.MonkeyPatch) -> None:
    lens = _heavy_bodied(10_000)
    ids = np.arange(len(lens), dtype=np.int64)
    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=1, **FLOPS)  # type: ignore[arg-type]
    p, meta, extra = make_plan(ids, lens, cfg)
    with monkeypatch.context() as mp:
        mp.setattr(levelling, "levels", lambda cost, order: False)
        mp.setattr("varpack.plan.stages.batching.greedy.levels", lambda cost, order: False)
        plain = make_plan(ids, lens, cfg)[1]["stats"]
    ours = meta["stats"]
    assert ours["time_vs_ideal"] < plain["time_vs_ideal"] - 0.003
    assert ours["time_vs_ideal"] <= 1.02
    # still a curriculum: a micro-batch moves by less than one window of steps
    window = cfg.shuffle_window * cfg.micro_per_step
    first = p.stream[p.offsets[:-1]]  # each micro-batch's first sample, in input order
    home = np.argsort(np.argsort(first))  # its place in the unlevelled curriculum
    assert np.abs(home - np.arange(len(home))).max() < window
    assert (home != np.arange(len(home))).any()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        write_plan(out, meta, list(plan_tables(p)), rank_extra=extra)
        assert validate_plan(out, (ids, lens)).problems == []


def test_tokens_cost_and_shuffled_plans_are_not_levelled() -> None:
    lens = _heavy_bodied(3000)
    ids = np.arange(len(lens), dtype=np.int64)
    p = plan_arrays(ids, lens, PlanConfig(max_tokens=16384, dp=4))  # tokens cost
    assert np.array_equal(p.stream, np.arange(len(lens)))  # the input order, untouched
    q = plan_arrays(ids, lens, PlanConfig(max_tokens=16384, dp=4, **FLOPS))  # type: ignore[arg-type]
    assert not np.array_equal(q.stream, np.arange(len(lens)))
    assert sorted(q.stream.tolist()) == list(range(len(lens)))
