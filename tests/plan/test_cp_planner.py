"""--cp in the planner: options, the memory model, GDS steps, placement in the plan arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan
from varpack.plan.cost import sample_flops
from varpack.plan.cp.cost import cp_load, cp_model, over_capacity
from varpack.plan.models import PRESETS

BASE = dict(cp=4, bucket_size=300, cost="flops", model_preset="qwen2.5-0.5b")


def _data(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    short = rng.integers(1, 80, n - n // 5)
    long = rng.integers(200, 1200, n // 5)
    lens = np.sort(np.concatenate([short, long]))
    return np.arange(len(lens), dtype=np.int64), lens


def _plan(**kw):  # type: ignore[no-untyped-def]
    ids, lens = _data(kw.pop("seed", 0))
    return make_plan(ids, lens, PlanConfig(**{**BASE, **kw}))


@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=2),
        dict(dp=3, grad_accum=2, order="shuffle", seed=4),
        dict(dp=2, grad_accum=3, cp_batching="greedy"),
        dict(dp=2, cp_placement="round-robin", epochs=2),
        dict(dp=2, cp_placement="distributed"),
        dict(dp=2, cost="tokens", model_preset=None),
        dict(dp=2, cost="time", time_per_flop=1e-12, time_fixed=1e-3, comm_bytes_per_s=1e9),
    ],
)
def test_cp_plans_keep_every_promise(kw):
    arrays, meta, _ = _plan(**kw)
    cfg = arrays.cfg
    assert arrays.cp_placement is not None and len(arrays.cp_placement) == len(arrays.stream)
    assert meta["layout"]["cp"] == 4 and cfg.max_tokens == 1200
    lens = arrays.lens[arrays.stream]
    tokens = np.add.reduceat(lens, arrays.offsets[:-1])
    assert (tokens <= cfg.max_tokens).all()
    model = cp_model(cfg)
    load = cp_load(arrays.offsets, lens, arrays.cp_placement, model)
    assert len(over_capacity(load, model)) == 0
    assert np.array_equal(load.cost, arrays.cp_cost)
    # every step: dp x grad_accum micro-batches, grad_accum per rank; each sample once per epoch
    per = np.bincount(arrays.step * cfg.dp + arrays.rank)
    assert (per == cfg.grad_accum).all()
    counts = np.bincount(arrays.stream, minlength=len(arrays.ids))
    assert (counts == cfg.epochs).all()
    assert meta["cp"]["distributed_samples"] == int((arrays.cp_placement < 0).sum())


@pytest.mark.parametrize("sync", ["step", "micro"])
def test_gds_keeps_each_steps_samples_and_balances_compute_over_dp_ranks(sync):
    # mixed lengths in each step; balanced per step, or per slot (each rank's micro j)
    shuffled = dict(dp=4, grad_accum=2, order="shuffle", seed=1, sync=sync)
    gds, _, _ = _plan(**shuffled)
    greedy, _, _ = _plan(**shuffled, cp_batching="greedy")
    assert np.array_equal(gds.step, greedy.step)
    for s in range(gds.num_steps):
        a = np.sort(gds.stream[gds.offsets[s * 8] : gds.offsets[(s + 1) * 8]])
        b = np.sort(greedy.stream[greedy.offsets[s * 8] : greedy.offsets[(s + 1) * 8]])
        assert np.array_equal(a, b)

    def slowest_rank_flops(p):  # type: ignore[no-untyped-def]
        f = np.add.reduceat(sample_flops(p.lens[p.stream], PRESETS["qwen2.5-0.5b"]), p.offsets[:-1])
        unit = p.step * 2 + p.micro_index if sync == "micro" else p.step  # what ranks wait on
        return np.bincount(unit * 4 + p.rank, weights=f).reshape(-1, 4).max(axis=1).sum()

    assert slowest_rank_flops(gds) < 0.97 * slowest_rank_flops(greedy)


def test_same_input_same_plan():
    a, ma, _ = _plan(dp=2, order="shuffle", seed=3)
    b, mb, _ = _plan(dp=2, order="shuffle", seed=3)
    assert np.array_equal(a.cp_placement, b.cp_placement) and ma == mb


def test_without_cp_nothing_changes_in_the_config():
    cfg = PlanConfig(max_tokens=100).resolved()
    assert "cp" not in cfg.to_dict() and "bucket_size" not in cfg.to_dict()
    assert PlanConfig.from_mapping(cfg.to_dict()).resolved() == cfg


def test_memory_model_gives_the_bucket():
    cfg = PlanConfig(cp=2, memory_per_token=1000.0, memory_fixed=5000.0, memory_capacity=305_000)
    assert cfg.resolved().bucket() == 300 and cfg.resolved().max_tokens == 600
    one = PlanConfig(bucket_size=512).resolved()  # a bucket without --cp is the budget
    assert one.max_tokens == 512


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(cp=2), "--cp needs a memory model"),
        (dict(cp=2, bucket_size=10, max_tokens=30), "exceeds what memory holds"),
        (dict(cp=2, bucket_size=10, layout="padded"), "conflicts with --layout padded"),
        (dict(cp=2, bucket_size=10, pp=2, grad_accum=2), "conflicts with --pp"),
        (dict(memory_per_token=2.0), "needs both"),
        (dict(bucket_size=5, memory_per_token=2.0, memory_capacity=10), "conflicts with"),
        (dict(memory_per_token=2.0, memory_capacity=10, memory_fixed=20.0), "leaves -5 tokens"),
        (dict(max_tokens=9, cost="time", model_preset="qwen2.5-0.5b"), "--time-per-flop"),
        (dict(max_tokens=9, time_per_flop=1.0), "used by --cost time only"),
        (dict(cp=2, bucket_size=9, comm_bytes_per_s=1.0), "price the K/V exchange"),
        (dict(cp=2, bucket_size=9, memory_fixed=-1.0), "--memory-fixed"),
        (dict(max_tokens=9, memory_per_token=float("nan"), memory_capacity=9), "finite number"),
    ],
)
def test_bad_options_are_one_clear_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        PlanConfig(**kw).resolved()


def test_oversize_sample_is_refused_before_placement():
    ids, lens = np.arange(3), np.array([5, 6, 2000])
    with pytest.raises(ConfigError, match="do not fit --max-tokens 1200 even alone"):
        make_plan(ids, lens, PlanConfig(**BASE))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 600), min_size=8, max_size=80),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from(["dacp", "round-robin"]),
)
def test_any_input_fits_every_cp_rank(lens, dp, k, strategy):
    lens = np.sort(np.array(lens))
    if len(lens) < dp * k:
        return
    cfg = PlanConfig(cp=2, bucket_size=300, dp=dp, grad_accum=k, cp_placement=strategy)
    try:
        arrays, _, _ = make_plan(np.arange(len(lens)), lens, cfg)
    except ConfigError as exc:  # too few micro-batches for dp x grad_accum: the batcher's rule
        assume("cannot be split" not in str(exc))
        raise
    model = cp_model(arrays.cfg)
    assert arrays.cp_placement is not None
    load = cp_load(arrays.offsets, arrays.lens[arrays.stream], arrays.cp_placement, model)
    assert len(over_capacity(load, model)) == 0
    assert (np.bincount(arrays.stream, minlength=len(lens)) == 1).all()
