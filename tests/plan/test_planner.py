"""Planner core: hand-checked cases, rules, and hypothesis properties checked by validate."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError, InputError
from varpack.plan import PlanConfig, make_plan, plan_arrays
from varpack.plan.cost import sample_flops
from varpack.plan.figures.stats import mixing
from varpack.plan.kernels.assign import balance_ranks
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.pack import complete, pack
from varpack.plan.models import PRESETS, preset_spec
from varpack.plan.models.flops import linear_per_token, sample_train_flops
from varpack.planfile.format import write_plan
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan


def _plan(ids, lens, **kw):
    return plan_arrays(np.asarray(ids), np.asarray(lens), PlanConfig(**kw))


def _rows(arrays):
    return [t.to_pylist() for t in plan_tables(arrays)]


def test_blog_30_token_example():
    # Budget 30 tokens, base batch 2, linear: batches of 10 and 4 samples -> LR x5 and x2.
    lens = [3] * 10 + [7] * 4
    p = _plan(range(14), lens, max_tokens=30, lr_scaling="linear", base_batch_size=2)
    (rows,) = _rows(p)
    assert [len(r["sample_ids"]) for r in rows] == [10, 4]
    assert [r["lr_factor"] for r in rows] == [5.0, 2.0]
    assert [1e-3 * r["lr_factor"] for r in rows] == pytest.approx([5e-3, 2e-3])
    assert [r["step_tokens"] for r in rows] == [30, 28]
    assert [r["step_samples"] for r in rows] == [10, 4]
    sq = _plan(range(14), lens, max_tokens=30, lr_scaling="sqrt", base_batch_size=2)
    assert sq.lr.tolist() == pytest.approx([5**0.5, 2**0.5])


def test_padded_layout_budget_and_pad_to():
    lens = [5, 6, 7, 9, 17]
    p = _plan(range(5), lens, max_tokens=32, layout="padded", pad_multiple=8)
    (rows,) = _rows(p)
    # 3 x 8 = 24 fits, adding 9 (pad 16) gives 4 x 16 = 64 > 32; [9] alone-ish then 17 (pad 24).
    assert [r["seq_lens"] for r in rows] == [[5, 6, 7], [9], [17]]
    assert [r["pad_to"] for r in rows] == [8, 16, 24]
    assert p.micro.samples.tolist() == [3, 1, 1]


def test_packed_pad_multiple_and_fixed_batching():
    p = _plan(range(5), [3, 3, 3, 3, 3], max_tokens=8, pad_multiple=4)
    assert [r["pad_to"] for r in _rows(p)[0]] == [8, 8, 4]
    f = _plan(range(5), [1, 2, 3, 4, 5], batching="fixed", batch_size=2, layout="padded")
    assert [r["seq_lens"] for r in _rows(f)[0]] == [[1, 2], [3, 4], [5]]


def test_last_step_completed_by_splitting_the_largest():
    # 9 samples of 10 in budget 30 -> 3 micro-batches; dp=2, K=2 needs 4: the last one is split.
    p = _plan(range(9), [10] * 9, max_tokens=30, dp=2, grad_accum=2)
    assert p.num_steps == 1 and sorted(p.micro.samples.tolist()) == [1, 2, 3, 3]
    for table in plan_tables(p):
        assert table.num_rows == 2


def test_too_few_samples_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot fill one step"):
        _plan(range(3), [5, 5, 5], max_tokens=30, dp=2, grad_accum=2)


def test_oversize_error_drop_alone():
    lens = [5, 50, 6, 70]
    with pytest.raises(ConfigError, match=r"sample_id 1 \(50 tokens\), 3 \(70 tokens\)"):
        _plan(range(4), lens, max_tokens=20)
    d = _plan(range(4), lens, max_tokens=20, oversize="drop")
    assert [x["sample_id"] for x in d.dropped] == [1, 3] and d.ids.tolist() == [0, 2]
    a = _plan(range(4), lens, max_tokens=20, oversize="alone")
    assert a.oversize_alone == [1, 3]
    rows = _rows(a)[0]
    assert [1] in [r["sample_ids"] for r in rows] and [3] in [r["sample_ids"] for r in rows]


def test_bad_input_arrays():
    with pytest.raises(InputError, match="no samples"):
        _plan([], [], max_tokens=8)
    with pytest.raises(InputError, match="non-positive"):
        _plan([1, 2], [3, 0], max_tokens=8)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_tokens": 8, "dp": 0}, "--dp"),
        ({"max_tokens": 8, "grad_accum": 0}, "--grad-accum"),
        ({}, "needs --max-tokens"),
        ({"max_tokens": 8, "batch_size": 4}, "conflicts"),
        ({"batching": "fixed", "batch_size": 2, "max_tokens": 8}, "conflicts"),
        ({"max_tokens": 8, "cost": "flops", "model_preset": "gpt-9"}, "unknown"),
        ({"max_tokens": 8, "cost": "flops"}, "needs the model it prices: --model CONFIG"),
        ({"max_tokens": 8, "model_preset": "qwen2.5-7b"}, "only used by --cost flops"),
        (
            {"max_tokens": 8, "cost": "flops", "model_preset": "qwen2.5-7b", "hidden": 7},
            "needs all three dimensions",
        ),
        (
            {
                "max_tokens": 8,
                "cost": "flops",
                "model_preset": "qwen2.5-7b",
                "hidden": 7,
                "kv_hidden": 512,
                "layers": 28,
            },
            "--hidden conflicts with --model-preset",
        ),
        (
            {
                "max_tokens": 8,
                "cost": "flops",
                "model": "qwen2.5-7b",
                "hidden": 7,
                "kv_hidden": 512,
                "layers": 28,
            },
            "--hidden conflicts with --model",
        ),
        (
            {
                "max_tokens": 8,
                "cost": "flops",
                "model": "qwen2.5-7b",
                "model_preset": "qwen2.5-0.5b",
            },
            "--model conflicts with --model-preset",
        ),
        ({"max_tokens": 8, "cost": "flops", "model": "gpt-9"}, "'gpt-9' is not a preset"),
        ({"max_tokens": 8, "model": "qwen2.5-7b"}, "--model is only used by --cost flops"),
        ({"max_tokens": 8, "model_digest": "sha256:0"}, "only used with a model"),
        (
            {
                "max_tokens": 8,
                "cost": "flops",
                "model_preset": "qwen2.5-7b",
                "model_digest": "sha256:0",
            },
            "does not match the model's fields",
        ),
        ({"max_tokens": 8, "lr_scaling": "linear"}, "needs --base-batch-size"),
        ({"max_tokens": 8, "base_batch_size": 4}, "no effect"),
        ({"max_tokens": 8, "layout": "ragged"}, "choose one of"),
        ({"max_tokens": 4, "pad_multiple": 8}, "nothing fits"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        PlanConfig(**kw).resolved()


def test_config_resolves_preset_and_is_idempotent():
    cfg = PlanConfig(max_tokens=8, cost="flops", model_preset="Qwen2.5-0.5B").resolved()
    assert cfg.model == preset_spec("qwen2.5-0.5b") and cfg.model_preset == "qwen2.5-0.5b"
    assert cfg.model_digest == cfg.model.digest() and cfg.hidden is None
    assert cfg.resolved() == cfg
    assert PlanConfig.from_mapping(cfg.to_dict()).resolved() == cfg
    assert cfg.to_dict()["model"] == cfg.model.to_dict()
    with pytest.raises(ConfigError, match="unknown option 'max_tokenz'"):
        PlanConfig.from_mapping({"max_tokenz": 3})
    # the model's config (its dict), or its spec, resolve alike; plans without one keep no key
    as_dict: Any = cfg.model.to_dict()  # the Python API takes the spec's dict too
    by_config = PlanConfig(max_tokens=8, cost="flops", model=as_dict).resolved()
    assert by_config.model == cfg.model and by_config.model_preset is None
    assert "model" not in PlanConfig(max_tokens=8).resolved().to_dict()
    # plans made before configs were read record the preset with its Skrull dimensions
    old = PlanConfig(max_tokens=8, cost="flops", model_preset="qwen2.5-0.5b", hidden=896,
                     kv_hidden=128, layers=24).resolved()  # fmt: skip
    assert old.model is None and old.cost_model().dims == PRESETS["qwen2.5-0.5b"]


def test_a_recorded_model_edited_by_hand_is_refused():
    d = PlanConfig(max_tokens=8, cost="flops", model_preset="qwen2.5-7b").resolved().to_dict()
    d["model"]["vocab"] += 1
    with pytest.raises(ConfigError, match="does not match the model's fields"):
        PlanConfig.from_mapping(d).resolved()
    d["model"]["vocab"] = "many"
    with pytest.raises(ConfigError, match="config: model: vocab must be a positive integer"):
        PlanConfig.from_mapping(d)


def test_flops_model():
    d = PRESETS["qwen2.5-0.5b"]
    s = 4096.0
    want = d.layers * (20 * d.hidden**2 * s + 4 * d.hidden * d.kv_hidden * s + 4 * d.hidden * s * s)
    assert sample_flops(np.array([4096]), d)[0] == pytest.approx(want)
    # Padded layout: every row costs flops(T); packed: the samples plus linear pad tokens.
    cfg = PlanConfig(max_tokens=64, cost="flops", layout="padded", hidden=d.hidden,
                     kv_hidden=d.kv_hidden, layers=d.layers).resolved()  # fmt: skip
    m = summarize(np.array([0, 2]), np.array([3, 8]), cfg.micro_rule())
    assert m.cost[0] == pytest.approx(2 * sample_flops(np.array([8]), d)[0])
    # a model: its exact training FLOPs; pad tokens of a packed row cost their linear part
    spec = preset_spec("qwen2.5-0.5b")
    cfg = PlanConfig(max_tokens=64, cost="flops", model_preset="qwen2.5-0.5b").resolved()
    m = summarize(np.array([0, 2]), np.array([3, 8]), cfg.micro_rule())
    assert m.cost[0] == pytest.approx(sample_train_flops(np.array([3, 8]), spec).sum())
    padded = dataclasses.replace(cfg, pad_multiple=16)
    m = summarize(np.array([0, 2]), np.array([3, 8]), padded.micro_rule())
    pad = 3 * linear_per_token(spec) * (16 - 11)
    assert m.cost[0] == pytest.approx(sample_train_flops(np.array([3, 8]), spec).sum() + pad)


def test_balance_ranks_minimises_the_slowest():
    cost = np.array([7.0, 6, 5, 4, 3, 2, 2, 1])
    rank, micro = balance_ranks(np.zeros(8, np.int64), cost, 2, 4)
    loads = np.bincount(rank, weights=cost)
    assert loads.max() == 15.0  # total 30: perfect split 15 / 15
    assert np.bincount(rank).tolist() == [4, 4]
    assert sorted(micro[rank == 0].tolist()) == [0, 1, 2, 3]


def test_complete_never_breaks_budget_and_errors_when_impossible():
    lens = np.array([4, 4, 4, 4, 4, 4])
    off = np.array([0, 3, 6])
    out = complete(off, lens, 4, lambda o, v: np.add.reduceat(v, o[:-1]).astype(float))
    assert len(out) - 1 == 4 and np.diff(out).min() >= 1
    with pytest.raises(ConfigError, match="cannot be split"):
        complete(np.array([0, 1, 2, 3]), np.array([5, 5, 5]), 2, lambda o, v: v[:-1] * 1.0)


def test_pack_segments_never_mix_and_cap_gives_whole_steps():
    cfg = PlanConfig(max_tokens=10).resolved()
    lens = np.array([2, 2, 2, 2, 2, 2, 9, 1])
    perm, off = pack(lens, np.array([0, 3, 8]), np.zeros(8, bool), cfg.pack_rule())
    assert np.all(np.diff(off) > 0) and 3 in off.tolist()  # a micro-batch starts at the segment
    perm, off = pack(lens, np.array([0, 4, 8]), np.zeros(8, bool), cfg.pack_rule(), cap=2)
    assert sorted(perm.tolist()) == list(range(8))
    assert off[2] == 4 or len(off) - 1 >= 4  # the first segment became exactly 2 micro-batches


def test_mixing_extremes():
    lens = np.arange(1, 101)
    # sorted deciles: step i is off by max(i/10, 0.9 - i/10); the mean is 0.7
    assert mixing(np.repeat(np.arange(10), 10), lens, 10) == pytest.approx(0.7)
    assert mixing(np.arange(100) % 10, lens, 10) < 0.1  # strided steps look like the data


def test_shuffle_is_seeded_per_epoch_and_mixes(rng):
    lens = np.sort(rng.integers(1, 500, 3000))
    kw = dict(max_tokens=1024, dp=2, grad_accum=4, order="shuffle", epochs=2, seed=7)
    a, b = _plan(range(3000), lens, **kw), _plan(range(3000), lens, **kw)
    assert np.array_equal(a.stream, b.stream) and np.array_equal(a.offsets, b.offsets)
    e0, e1 = a.stream[:3000], a.stream[3000:]
    assert not np.array_equal(e0, e1)  # epochs reshuffled
    c = _plan(range(3000), lens, **{**kw, "seed": 8})
    assert not np.array_equal(a.stream, c.stream)
    meta = make_plan(np.arange(3000), lens, PlanConfig(**kw))[1]
    cur = make_plan(np.arange(3000), lens, PlanConfig(**{**kw, "order": "curriculum"}))[1]
    assert meta["stats"]["mixing"] < 0.15 < cur["stats"]["mixing"]
    assert meta["epochs"][1]["first_step"] == meta["epochs"][0]["num_steps"]


# ---- properties: every plan the planner makes passes validate ------------------------------------

configs = st.fixed_dictionaries(
    {
        "batching": st.sampled_from(["budget", "fixed"]),
        "budget": st.integers(8, 400),
        "batch_size": st.integers(1, 9),
        "layout": st.sampled_from(["packed", "padded"]),
        "pad_multiple": st.sampled_from([1, 1, 4, 8]),
        "oversize": st.sampled_from(["error", "drop", "alone", "split"]),
        "split_len": st.sampled_from([None, None, 1, 5, 37]),
        "dp": st.integers(1, 4),
        "grad_accum": st.integers(1, 3),
        "cost": st.sampled_from(["tokens", "padded", "flops"]),
        "order": st.sampled_from(["curriculum", "shuffle"]),
        "window": st.integers(1, 4),
        "epochs": st.integers(1, 2),
        "lr": st.sampled_from(["none", "linear", "sqrt"]),
        "unit": st.sampled_from(["samples", "tokens"]),
        "seed": st.integers(0, 3),
        "max_shapes": st.sampled_from([None, None, 1, 3]),
        "warmup": st.sampled_from(["list", "reorder", "none"]),
        "pp": st.sampled_from([1, 1, 2]),
    }
)


def _config(c: dict) -> PlanConfig:
    budget = c["batching"] == "budget"
    alone = budget and c["oversize"] == "alone"  # a lone oversize sample has its own shape
    split = budget and c["oversize"] == "split"
    pp = c.get("pp", 1) if c["grad_accum"] % c.get("pp", 1) == 0 and not alone else 1
    if split and c["layout"] == "padded":
        pp = 1  # the pipeline batcher does not keep pieces apart (refused)
    top = max(c["budget"], c["pad_multiple"]) // c["pad_multiple"] * c["pad_multiple"]
    split_len = c.get("split_len")
    return PlanConfig(
        split_len=min(split_len, top) if split and split_len else None,
        max_alone_tokens=10**9 if alone else None,
        max_shapes=None if alone else c.get("max_shapes"),
        warmup=c.get("warmup", "list"),
        pp=pp,
        batching=c["batching"],
        max_tokens=max(c["budget"], c["pad_multiple"]) if budget else None,
        batch_size=None if budget else c["batch_size"],
        layout=c["layout"],
        pad_multiple=c["pad_multiple"],
        oversize=c["oversize"] if budget else "error",
        dp=c["dp"],
        grad_accum=c["grad_accum"],
        cost=c["cost"],
        model_preset="qwen2.5-0.5b" if c["cost"] == "flops" else None,
        order=c["order"],
        shuffle_window=c["window"],
        epochs=c["epochs"],
        seed=c["seed"],
        lr_scaling=c["lr"],
        base_batch_size=None if c["lr"] == "none" else 10.0,
        base_unit=c["unit"],
    )


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=150), c=configs)
def test_property_every_plan_is_valid(lens, c):
    lens_a = np.sort(np.array(lens, dtype=np.int64), kind="stable")
    ids = np.arange(len(lens_a), dtype=np.int64) * 7 + 3
    cfg = _config(c)
    try:
        arrays, meta, extra = make_plan(ids, lens_a, cfg)
    except ConfigError as exc:
        assert any(
            s in str(exc)
            for s in ("cannot fill one step", "do not fit", "cannot be split", "cannot fill (step")
        ), str(exc)
        return
    # Direct invariants, independent of validate.
    k = cfg.grad_accum
    tables = list(plan_tables(arrays))
    assert len(tables) == cfg.dp
    assert all(t.num_rows == arrays.num_steps * k for t in tables)
    planned = np.concatenate(
        [np.concatenate(t.column("sample_ids").to_numpy(zero_copy_only=False)) for t in tables]
    )
    dropped = {d["sample_id"] for d in meta["dropped"]}
    if cfg.oversize != "split":
        assert len(planned) == (len(ids) - len(dropped)) * cfg.epochs
    assert set(planned.tolist()) | dropped == set(ids.tolist())
    if cfg.batching == "budget" and cfg.oversize != "alone":
        vol = arrays.micro.pad_to * (arrays.micro.rows if cfg.layout == "padded" else 1)
        assert vol.max() <= cfg.max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        write_plan(out, meta, tables, rank_extra=extra)
        report = validate_plan(out, (ids, lens_a))
        assert report.problems == []


def test_property_config_roundtrip_through_dataclass():
    cfg = _config(
        {
            "batching": "budget",
            "budget": 64,
            "batch_size": 2,
            "layout": "packed",
            "pad_multiple": 1,
            "oversize": "drop",
            "dp": 2,
            "grad_accum": 2,
            "cost": "tokens",
            "order": "shuffle",
            "window": 2,
            "epochs": 1,
            "lr": "none",
            "unit": "samples",
            "seed": 0,
        }
    )
    assert dataclasses.replace(cfg).resolved().to_dict()["oversize"] == "drop"
