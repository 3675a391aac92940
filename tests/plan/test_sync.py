"""The synchronisation model (``--sync micro|step``): what a plan is balanced and scored for."""

from __future__ import annotations

import dataclasses
import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli, write_metadata

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan, plan_arrays
from varpack.plan.kernels.assign import balance_slots
from varpack.plan.kernels.slots import move_micro, slot_order
from varpack.plan.stages.warmup import check_warmup_prefix, slot_warmup_order
from varpack.plan.sync import micro_times, step_times
from varpack.planfile.format import PLAN_JSON, read_meta, write_plan
from varpack.planfile.schema import (
    CHECKSUM_KEY,
    FINGERPRINT_KEY,
    config_of,
    plan_checksum,
    plan_fingerprint,
)
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan

FLOPS = dict(cost="flops", model_preset="qwen2.5-0.5b")


def _sorted(lens):
    return np.sort(np.asarray(lens, dtype=np.int64), kind="stable")


def _heavy_tail(n, seed=0, budget=16384):
    """Chat-like lengths with 0.5 % of samples at 60-100 % of the budget."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(np.log(300), 0.9, n))
    long = rng.random(n) < 0.005
    x[long] = budget * rng.uniform(0.6, 1.0, int(long.sum()))
    return _sorted(np.clip(np.rint(x), 1, budget))


# ---- the model: resolution, refusal, scoring -----------------------------------------------------


def test_micro_is_the_default_and_step_with_a_pipeline():
    assert PlanConfig(max_tokens=64).resolved().sync == "micro"
    assert PlanConfig(max_tokens=64, pp=2, grad_accum=2).resolved().sync == "step"
    assert PlanConfig(max_tokens=64, sync="step").resolved().sync == "step"
    with pytest.raises(ConfigError, match="--sync micro conflicts with --pp 2"):
        PlanConfig(max_tokens=64, pp=2, grad_accum=2, sync="micro").resolved()
    with pytest.raises(ConfigError, match="--sync 'slot': choose one of micro, step"):
        PlanConfig(max_tokens=64, sync="slot").resolved()


def test_a_refused_sync_is_one_line_and_writes_nothing(tmp_path):
    write_metadata(tmp_path / "m.parquet", np.arange(100), np.full(100, 10))
    out = tmp_path / "plan"
    got = cli("plan", tmp_path / "m.parquet", out, "--max-tokens", 64, "--grad-accum", 2,
              "--pp", 2, "--sync", "micro", expect=2)  # fmt: skip
    assert got.output.count("\n") == 1 and got.output.startswith("varpack: error: --sync micro")
    assert not out.exists()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**16))
def test_a_step_never_lasts_longer_per_step_than_per_micro_batch(dp, k, steps, seed):
    rng = np.random.default_rng(seed)
    step = np.repeat(np.arange(steps), dp * k)
    rank = np.tile(np.repeat(np.arange(dp), k), steps)
    micro = np.tile(np.arange(k), steps * dp)
    cost = rng.random(len(step))
    s, m = (f(step, rank, micro, cost, steps, dp, k) for f in (step_times, micro_times))
    assert s.shape == m.shape == (steps,) and (s <= m + 1e-12).all()
    if k == 1:
        assert np.allclose(s, m)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 2**16))
def test_sorted_slots_are_the_least_sum_of_slot_maxima(dp, k, seed):
    cost = np.random.default_rng(seed).integers(1, 9, dp * k).astype(float)
    micro, lane = balance_slots(np.zeros(dp * k, np.int64), cost, dp, k)
    assert (np.bincount(micro * dp + lane, minlength=dp * k) == 1).all()  # one per (slot, rank)
    got = sum(cost[micro == j].max() for j in range(k))
    best = min(  # every way to cut the step into k slots of dp
        sum(cost[list(p[j * dp : (j + 1) * dp])].max() for j in range(k))
        for p in itertools.permutations(range(dp * k))
    )
    assert got == best


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 5),
       st.integers(0, 2**16))  # fmt: skip
def test_slots_cut_by_cost_keep_every_micro_batch_and_lower_the_time(dp, k, window, blocks, seed):
    rng = np.random.default_rng(seed)
    m = dp * k * window * blocks - dp * k * int(rng.integers(0, window))  # a short last block
    cost = rng.random(m)
    order = slot_order(cost, dp, k, window)
    assert sorted(order.tolist()) == list(range(m))
    size = dp * k * window  # micro-batches move inside their block only
    assert (order // size == np.arange(m) // size).all()
    before = cost.reshape(-1, dp).max(axis=1).sum()
    after = cost[order].reshape(-1, dp).max(axis=1).sum()
    assert after <= before + 1e-12
    (idx,), starts = move_micro((np.arange(2 * m),), np.arange(0, 2 * m + 1, 2), order)
    assert (idx.reshape(-1, 2)[:, 0] // 2 == order).all() and (np.diff(starts) == 2).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**16))
def test_the_slot_warm_up_moves_the_same_positions_on_every_rank(dp, n, shapes, seed):
    ids = np.random.default_rng(seed).integers(0, shapes, (dp, n))
    perm, warm = slot_warmup_order(ids)
    for r in range(dp):
        assert sorted(perm[r].tolist()) == list(range(n))
        assert check_warmup_prefix(ids[r][perm[r]], warm[r], r) == []
    front = len(np.unique(np.concatenate([np.unique(row, return_index=True)[1] for row in ids])))
    # past the front every rank runs the plan's positions, in order: the slots stay aligned
    assert (perm[:, front:] == perm[0, front:]).all()
    assert (np.diff(perm[0, front:]) > 0).all()


# ---- plans made for micro-batch synchronisation --------------------------------------------------


@pytest.mark.parametrize("k", [2, 4])
def test_a_micro_plan_levels_every_slot_where_a_step_plan_does_not(k):
    lens = _heavy_tail(40_000)
    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=k, order="shuffle", **FLOPS)
    micro = make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]
    step = make_plan(np.arange(len(lens)), lens, dataclasses.replace(cfg, sync="step"))[1]["stats"]
    assert micro["time_vs_ideal"] == micro["time_vs_ideal_by_sync"]["micro"]
    assert step["time_vs_ideal"] == step["time_vs_ideal_by_sync"]["step"]
    mine, theirs = micro["time_vs_ideal_by_sync"], step["time_vs_ideal_by_sync"]
    assert mine["micro"] < theirs["micro"] - 0.02  # the step plan's ranks wait slot by slot
    assert mine["step"] <= mine["micro"]  # balanced slots are balanced steps
    assert mine["micro"] - micro["time_vs_ideal_bound"] <= 0.03
    assert micro["mixing"] <= 0.15


def test_grad_accum_1_is_one_plan_under_both_models():
    lens = _heavy_tail(8000, seed=1)
    cfg = PlanConfig(max_tokens=16384, dp=4, order="shuffle", **FLOPS)
    a = plan_arrays(np.arange(len(lens)), lens, cfg)
    b = plan_arrays(np.arange(len(lens)), lens, dataclasses.replace(cfg, sync="step"))
    assert np.array_equal(a.stream, b.stream) and np.array_equal(a.rank, b.rank)


def test_the_micro_bound_is_the_grad_accum_1_bound_of_the_same_windows():
    lens = _heavy_tail(20_000, seed=2)
    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=4, order="shuffle", **FLOPS)
    micro = make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]
    step = make_plan(np.arange(len(lens)), lens, dataclasses.replace(cfg, sync="step"))[1]["stats"]
    assert micro["time_vs_ideal_bound"] <= micro["time_vs_ideal"]
    # slot by slot nothing levels a rank over its step: the bound can only be higher
    assert micro["time_vs_ideal_bound"] >= step["time_vs_ideal_bound"]


configs = st.fixed_dictionaries(
    {
        "dp": st.integers(1, 4),
        "grad_accum": st.integers(1, 4),
        "window": st.integers(1, 4),
        "epochs": st.integers(1, 2),
        "seed": st.integers(0, 5),
        "cost": st.sampled_from(["tokens", "flops"]),
        "layout": st.sampled_from(["packed", "padded"]),
        "order": st.sampled_from(["shuffle", "shuffle", "curriculum"]),
        "compose": st.sampled_from(["cost", "cost", "tokens"]),
        "warmup": st.sampled_from(["list", "reorder"]),
        "oversize": st.sampled_from(["error", "split"]),
    }
)
lengths = st.tuples(
    st.lists(st.integers(1, 80), min_size=30, max_size=400),
    st.lists(st.integers(200, 520), min_size=0, max_size=12),
).map(lambda t: t[0] + t[1])


@settings(max_examples=30, deadline=None)
@given(lens=lengths, c=configs)
def test_property_micro_plans_keep_every_promise(lens, c):
    lens_a = _sorted(lens)
    ids = np.arange(len(lens_a), dtype=np.int64) * 5 + 2
    flops = FLOPS if c["cost"] == "flops" else {"cost": c["cost"]}
    cfg = PlanConfig(max_tokens=400, dp=c["dp"], grad_accum=c["grad_accum"], order=c["order"],
                     shuffle_window=c["window"], epochs=c["epochs"], seed=c["seed"],
                     layout=c["layout"], compose=c["compose"], warmup=c["warmup"],
                     oversize=c["oversize"] if c["layout"] == "packed" else "error",
                     sync="micro", **flops)  # type: ignore[arg-type]  # fmt: skip
    if cfg.oversize == "error":
        lens_a = np.minimum(lens_a, 400)
    try:
        p, meta, extra = make_plan(ids, lens_a, cfg)
    except ConfigError as exc:
        assert "cannot be split" in str(exc) or "cannot fill" in str(exc), str(exc)
        return
    k, dp = cfg.grad_accum, cfg.dp
    # every rank holds grad_accum micro-batches of every step, one in each slot
    slots = np.bincount((p.step * k + p.micro_index) * dp + p.rank, minlength=p.num_steps * k * dp)
    assert (slots == 1).all()
    # every sample (every piece) once per epoch, the budget held
    n = len(p.ids)
    for e in meta["epochs"]:
        first = p.offsets[e["first_step"] * cfg.micro_per_step]
        assert sorted(p.stream[first : first + n].tolist()) == list(range(n))
    volume = p.micro.pad_to * (p.micro.rows if cfg.layout == "padded" else 1)
    assert (volume <= 400).all() and (p.micro.samples >= 1).all()
    # a sample trains within about one window of its random position (two for a heavy one
    # that waited; the warm-up reorder moves a micro-batch of each shape on purpose; padded
    # bands at grad-accum 1 are pooled by four blocks: two more)
    if cfg.order == "shuffle" and cfg.warmup != "reorder":
        wide = 2 * (cfg.layout == "padded" and cfg.grad_accum == 1 and cfg.compose == "cost")
        assert meta["stats"]["moved_steps_max"] <= (3 + wide) * cfg.shuffle_window + 3
    # scored under both models; validate recomputes both from the manifests
    both = meta["stats"]["time_vs_ideal_by_sync"]
    assert meta["stats"]["time_vs_ideal"] == both["micro"] >= both["step"] - 1e-12
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        write_plan(out, meta, list(plan_tables(p)), rank_extra=extra)
        assert validate_plan(out, (ids, lens_a)).problems == []


# ---- the artifact: plan.json, older plans, validate ----------------------------------------------


def _written(tmp_path, **kw):
    lens = _heavy_tail(3000, seed=3)
    cfg = PlanConfig(max_tokens=16384, dp=4, grad_accum=2, order="shuffle", **FLOPS, **kw)
    p, meta, extra = make_plan(np.arange(len(lens)), lens, cfg)
    out = tmp_path / "plan"
    write_plan(out, meta, list(plan_tables(p)), rank_extra=extra)
    return out, (np.arange(len(lens)), lens)


def _rewrite(out, edit):
    doc = json.loads((out / PLAN_JSON).read_text())
    edit(doc)
    doc[FINGERPRINT_KEY] = plan_fingerprint(doc)
    doc.pop(CHECKSUM_KEY, None)
    doc[CHECKSUM_KEY] = plan_checksum(doc)
    (out / PLAN_JSON).write_text(json.dumps(doc, indent=2))


def test_plan_json_records_the_model_and_both_times(tmp_path):
    out, _ = _written(tmp_path)
    meta = read_meta(out)
    assert meta["version"] == 4 and meta["config"]["sync"] == "micro"
    assert set(meta["stats"]["time_vs_ideal_by_sync"]) == {"step", "micro"}
    text = cli("inspect", out).stdout
    assert "micro sync" in text and "by sync" in text
    ok = cli("validate", out).stdout
    assert ok.startswith("OK ") and "under micro sync (" in ok and "x under step)" in ok


def test_validate_recomputes_the_time_under_both_models(tmp_path):
    out, inputs = _written(tmp_path)
    _rewrite(out, lambda d: d["stats"]["time_vs_ideal_by_sync"].update(step=1.0))
    problems = validate_plan(out, inputs).problems
    assert any("time_vs_ideal_by_sync" in line for line in problems), problems


def test_a_plan_from_before_sync_reads_as_balanced_per_step(tmp_path):
    out, inputs = _written(tmp_path, sync="step")

    def older(doc):
        doc["version"] = 3
        del doc["config"]["sync"], doc["stats"]["time_vs_ideal_by_sync"]

    _rewrite(out, older)
    meta = read_meta(out)
    assert config_of(meta).sync == "step"
    assert validate_plan(out, inputs).problems == []
    assert "step sync" in cli("inspect", out).stdout
