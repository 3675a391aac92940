"""The balance engine (``--compose engine``): the promises every shuffled plan keeps, and what
the engine is for (each group the ranks meet at costs alike, in the plan's own cost)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shuffle_shapes import heavy_bodied, heavy_mix, lengths, options, sorted_lengths

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan, plan_arrays
from varpack.plan.cost import sample_cost
from varpack.plan.stages.batching import batcher_name
from varpack.planfile.format import write_plan
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan

FLOPS = dict(cost="flops", model_preset="qwen2.5-0.5b")

# every sample over half the budget: one a micro-batch, none may be left empty
alone_each = st.lists(st.integers(201, 400), min_size=1, max_size=200)
configs = options(
    cost=st.sampled_from(["tokens", "flops"]), sync=st.sampled_from(["step", "micro"])
)


_sorted = sorted_lengths


def _time(p) -> float:  # type: ignore[no-untyped-def]
    """The plan's time over its ideal, scored here from its arrays: each sample priced alone
    by the cost model (its own oracle tests: test_model_flops.py), summed per micro-batch;
    under ``step`` a step waits for its costliest rank's sum, under ``micro`` each slot for
    its costliest micro-batch."""
    cfg = p.cfg  # resolved: the model's dimensions filled in
    own = sample_cost(p.lens[p.stream], cfg.cost_model())
    micro = np.add.reduceat(own, p.offsets[:-1])
    meet = p.step * cfg.grad_accum + p.micro_index if cfg.sync == "micro" else p.step
    loads = np.zeros((int(meet.max()) + 1, cfg.dp))
    np.add.at(loads, (meet, p.rank), micro)
    return float(loads.max(axis=1).sum() / (own.sum() / cfg.dp))


@settings(max_examples=60, deadline=None)
@given(lens=st.one_of(lengths, heavy_mix, alone_each), c=configs)
def test_property_engine_plans_keep_every_promise(lens, c):  # type: ignore[no-untyped-def]
    lens_a = _sorted(lens)
    ids = np.arange(len(lens_a), dtype=np.int64) * 3 + 1
    cfg = PlanConfig(
        max_tokens=c["budget"], dp=c["dp"], grad_accum=c["grad_accum"], order="shuffle",
        shuffle_window=c["window"], epochs=c["epochs"], seed=c["seed"], cost=c["cost"],
        model_preset="qwen2.5-0.5b" if c["cost"] == "flops" else None,
        pad_multiple=c["pad_multiple"], oversize=c["oversize"], sync=c["sync"],
        compose="engine",
    )  # fmt: skip
    assert batcher_name(cfg) == "engine"
    try:
        p, meta, extra = make_plan(ids, lens_a, cfg)
    except ConfigError as exc:
        refusals = ("cannot fill", "do not fit", "cannot be split")
        assert any(s in str(exc) for s in refusals), str(exc)
        return
    n = len(p.ids)
    for e in meta["epochs"]:  # every sample once per epoch
        first = p.offsets[e["first_step"] * cfg.micro_per_step]
        assert sorted(p.stream[first : first + n].tolist()) == list(range(n))
    counts = np.bincount(p.step * cfg.dp + p.rank, minlength=p.num_steps * cfg.dp)
    assert (counts == cfg.grad_accum).all()  # grad_accum micro-batches a rank and step
    assert (p.micro.samples >= 1).all()  # none empty
    lone = p.micro.samples == 1
    assert ((p.micro.pad_to <= cfg.max_tokens) | lone).all()  # the budget holds
    # a sample trains within about a window of its random position (two for one that waited)
    assert meta["stats"]["moved_steps_max"] <= 3 * cfg.shuffle_window + 3
    again = plan_arrays(ids, lens_a, cfg)  # deterministic
    assert np.array_equal(again.stream, p.stream) and np.array_equal(again.rank, p.rank)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        write_plan(out, meta, list(plan_tables(p)), rank_extra=extra)
        assert validate_plan(out, (ids, lens_a)).problems == []


_heavy_bodied = heavy_bodied


@pytest.mark.parametrize(("k", "sync"), [(1, "step"), (2, "step"), (4, "step"), (2, "micro"),
                                         (4, "micro")])  # fmt: skip
def test_every_group_the_ranks_meet_at_costs_alike(k: int, sync: str) -> None:
    lens = _heavy_bodied(12000)
    times = {}
    for compose in ("cost", "engine"):
        cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=k, order="shuffle", sync=sync,
                         compose=compose, **FLOPS)  # fmt: skip
        times[compose] = _time(plan_arrays(np.arange(len(lens)), lens, cfg))
    assert times["engine"] <= (1.015 if k == 1 else 1.01), times
    assert times["engine"] <= times["cost"] + 0.003  # no worse than the composer


def test_no_rank_is_the_slowest_step_after_step() -> None:
    rng = np.random.default_rng(3)
    lens = _sorted(rng.integers(20, 8192, 3000))
    for sync, k in (("step", 2), ("micro", 4)):
        cfg = PlanConfig(max_tokens=8192, dp=4, grad_accum=k, order="shuffle", sync=sync,
                         compose="engine", **FLOPS)  # fmt: skip
        p = plan_arrays(np.arange(len(lens)), lens, cfg)
        meet = p.step * k + p.micro_index if sync == "micro" else p.step
        loads = np.bincount(meet * 4 + p.rank, weights=p.micro.cost, minlength=(meet.max() + 1) * 4)
        loads = loads.reshape(-1, 4)
        top = loads == loads.max(axis=1, keepdims=True)
        counts = (top & (top.sum(axis=1, keepdims=True) == 1)).sum(axis=0)
        fair = counts.sum() / 4
        assert counts.max() <= fair + 4 * np.sqrt(fair) + 5, counts


@pytest.mark.parametrize("options", [dict(layout="padded"), dict(pp=2, grad_accum=2)])
def test_what_the_engine_does_not_compose_is_one_line(options: dict) -> None:  # type: ignore[type-arg]
    lens = _sorted(np.random.default_rng(0).integers(20, 4000, 400))
    cfg = PlanConfig(max_tokens=8192, dp=2, order="shuffle", compose="engine", **options)
    with pytest.raises(ConfigError, match="--compose engine composes the packed layout") as err:
        make_plan(np.arange(len(lens)), lens, cfg)
    assert "\n" not in str(err.value)


def test_levelling_brings_rollout_steps_to_their_bound() -> None:
    # responses of every length up to a generation cap: the deal leaves each step's ranks
    # within a sample's cost of each other (1.0069x without the moves, swaps and trades)
    rng = np.random.default_rng(0)
    lens = _sorted(rng.integers(100, 1000, 6000) + np.minimum(rng.exponential(3000, 6000), 8192))
    cfg = PlanConfig(max_tokens=16384, dp=16, grad_accum=2, order="shuffle", sync="step",
                     compose="engine", **FLOPS)  # fmt: skip
    p, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    assert _time(p) <= meta["stats"]["time_vs_ideal_bound"] + 0.003


def test_samples_each_over_half_the_budget_are_composed_one_a_micro_batch() -> None:
    # every sample needs a micro-batch of its own: a window's steps are as many as its samples
    # fill, and a heavy sample only waits where what stays still fills every micro-batch
    # (else the epoch could not be composed and fell back to tokens: 1.052x)
    lens = _sorted(np.random.default_rng(11).integers(15000, 16384, 3000))
    cfg = PlanConfig(max_tokens=16384, dp=8, order="shuffle", compose="engine", **FLOPS)
    p, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    assert (p.micro.samples == 1).all() and p.num_steps == 375
    assert _time(p) <= meta["stats"]["time_vs_ideal_bound"] + 0.003


@pytest.mark.parametrize(("k", "sync"), [(1, "step"), (4, "step"), (4, "micro")])
def test_threads_compose_the_one_thread_plan(k: int, sync: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # runs of the epoch composed at once on threads, the carries between them resolved after:
    # the same plan as one thread composes, byte for byte
    import varpack.plan.kernels.compose_threads as ct
    import varpack.plan.stages.batching.engine as eng

    rng = np.random.default_rng(0)  # chat lengths, 1 % near the budget: heavy samples wait
    lens = np.exp(rng.normal(np.log(450), 0.9, 40_000))
    lens[rng.random(len(lens)) < 0.01] = 14_000
    lens = _sorted(np.clip(np.rint(lens), 1, 16384))
    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=k, order="shuffle", sync=sync,
                     compose="engine", epochs=2, shuffle_window=2, **FLOPS)  # fmt: skip
    resolved = []
    orig = ct._Run.resolved

    def spy(run, carry, held):  # type: ignore[no-untyped-def]
        resolved.append(len(carry))
        return orig(run, carry, held)

    monkeypatch.setattr(ct._Run, "resolved", spy)
    monkeypatch.setattr(ct, "MIN_RUN", 4_000)
    plans = {}
    for threads in (1, 3, 5):
        monkeypatch.setattr(eng, "default_threads", lambda t=threads: t)
        plans[threads] = plan_arrays(np.arange(len(lens)), lens, cfg)
    assert resolved  # the epoch was composed in runs ...
    assert k > 1 or max(resolved) > 0  # ... and at grad-accum 1 heavy samples waited across them
    for threads in (3, 5):
        for field in ("stream", "offsets", "step", "rank", "micro_index"):
            assert np.array_equal(getattr(plans[threads], field), getattr(plans[1], field))


def test_more_steps_only_where_they_pay_for_their_micro_batches() -> None:
    # bimodal lengths at a 128 K budget: a window's cost asks for more steps than its tokens
    # fill, each step's micro-batches costing MICRO_COST of a full one: 188 steps where the
    # tokens need 172.7 (without that charge 197, for 0.0003 of time)
    from varpack.metadata.synth import sample_lengths

    lens = _sorted(sample_lengths("bimodal", 20_000, np.random.default_rng(0)))
    cfg = PlanConfig(max_tokens=131072, dp=8, grad_accum=2, order="shuffle", sync="step",
                     compose="engine", **FLOPS)  # fmt: skip
    p = plan_arrays(np.arange(len(lens)), lens, cfg)
    assert p.num_steps <= 1.1 * lens.sum() / (8 * 2 * 131072)
    assert _time(p) <= 1.001


def test_a_group_within_its_tolerance_is_left_as_it_is() -> None:
    # two bins of one group, 4e-5 of their mean apart; a swap (12 for 10) would level them
    from varpack.plan.engine.improve import improve
    from varpack.plan.tuning import LEVEL_TOLERANCE

    cost = np.array([50_000.0, 49_990.0, 12.0, 12.0, 10.0])
    tok = np.array([100, 100, 12, 12, 10], dtype=np.int64)
    order = np.arange(5, dtype=np.int64)
    out_bin = np.array([0, 1, 1, 1, 0], dtype=np.int64)
    out_mb = np.zeros(5, dtype=np.int64)
    load = np.array([50_010.0, 50_014.0])
    fill = np.array([110.0, 124.0])
    cnt = np.array([2, 3], dtype=np.int64)
    assert (load.max() - load.mean()) / load.mean() < LEVEL_TOLERANCE
    fill = np.array([110.0, 110.0])
    cnt = np.array([2, 2], dtype=np.int64)
    improve(cost, tok, order, out_bin, out_mb, load, fill, cnt, np.int64(1), np.int64(2),
            np.int64(1), np.int64(1000), np.int64(8), LEVEL_TOLERANCE)  # fmt: skip
    assert out_bin.tolist() == [0, 1, 1, 1, 0]
    improve(cost, tok, order, out_bin, out_mb, load, fill, cnt, np.int64(1), np.int64(2),
            np.int64(1), np.int64(1000), np.int64(8), 0.0)  # fmt: skip
    assert out_bin.tolist() != [0, 1, 1, 1, 0]  # without it, the swap is made
    assert load.tolist() == [50_012.0, 50_012.0]
