"""Shapes through the real planner: --max-shapes, --pack-to, --warmup, --pp, --batching blocks.

Every plan is written, read back and checked by `varpack validate`; the properties also check
each invariant directly from the written manifests (independently of validate), and a simulated
trainer replays each rank's shape sequence to see when it would compile (``shape_helpers.py``).
The command line's side (validate refusing broken shape rules, the CLI's plans replayed, TOML):
``test_planner_shapes_cli.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from shape_helpers import compiles_after_prefix, manifests, planned

from varpack.errors import ConfigError
from varpack.metadata.synth import action_genome_lengths
from varpack.plan import PlanConfig, make_plan, plan_arrays
from varpack.plan.kernels.shapes import choose_lengths, padding_of
from varpack.plan.stages.batching.blocks import reset_table
from varpack.planfile.format import PLAN_JSON
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan

# ---- hand-checked cases ---------------------------------------------------------------------------


def test_max_shapes_padded_fixes_rows_and_pads_with_empty_rows(tmp_path):
    lens = np.array([3, 3, 3, 4, 9, 10, 12, 16])
    cfg = PlanConfig(max_tokens=16, layout="padded", max_shapes=2)
    p = plan_arrays(np.arange(8), lens, cfg)
    assert p.lengths.tolist() == choose_lengths(lens, 2).tolist() == [4, 16]
    (rows,) = [t.to_pylist() for t in plan_tables(p)]
    # T=4: B=4 -> [3 3 3 4]; T=16: B=1 -> one sample each, no empty rows.
    assert [(r["seq_lens"], r["pad_to"], r["pad_rows"]) for r in rows] == [
        ([3, 3, 3, 4], 4, 0),
        ([9], 16, 0),
        ([10], 16, 0),
        ([12], 16, 0),
        ([16], 16, 0),
    ]
    short = plan_arrays(np.arange(5), np.array([3, 3, 4, 9, 16]), cfg)
    (rows,) = [t.to_pylist() for t in plan_tables(short)]
    assert rows[0]["seq_lens"] == [3, 3, 4] and rows[0]["pad_rows"] == 1  # 3 of B=4 rows
    meta = make_plan(np.arange(5), np.array([3, 3, 4, 9, 16]), cfg)[1]
    assert meta["stats"]["pad_rows"] == 1 and meta["stats"]["pad_row_tokens"] == 4
    assert validate_plan(planned(tmp_path, np.arange(5), [3, 3, 4, 9, 16], cfg)).problems == []


def test_pack_to_pads_every_micro_batch_to_l(tmp_path):
    lens = [5, 6, 7, 8, 9, 10]
    cfg = PlanConfig(pack_to=16, dp=1)
    p = plan_arrays(np.arange(6), np.array(lens), cfg)
    assert set(p.micro.pad_to.tolist()) == {16} and p.cfg.max_tokens == 16
    meta = make_plan(np.arange(6), np.array(lens), cfg)[1]
    assert meta["shape_lengths"] == [16] and meta["stats"]["shapes_per_rank"] == [1]
    assert meta["stats"]["padded_tokens"] == 16 * len(p.micro.pad_to)
    assert validate_plan(planned(tmp_path, np.arange(6), lens, cfg)).problems == []


def test_padded_dp_lower_bound_is_met_on_curriculum(rng):
    # Padded + max-shapes: every sample is padded to its bucket, so the DP optimum is a floor.
    lens = np.sort(rng.integers(1, 2000, 4000))
    cfg = PlanConfig(max_tokens=4096, layout="padded", max_shapes=4)
    meta = make_plan(np.arange(4000), lens, cfg)[1]
    floor = padding_of(lens, np.array(meta["shape_lengths"]))
    pad = meta["stats"]["padded_tokens"] - meta["stats"]["real_tokens"]
    # Beyond the floor: empty rows, and at most K - 1 micro-batches that straddle two lengths.
    assert floor <= pad <= floor + meta["stats"]["pad_row_tokens"] + 3 * 4096
    assert max(meta["stats"]["shapes_per_rank"]) <= 4


def test_pp_groups_share_one_shape_and_fill_the_budget(tmp_path, rng):
    lens = np.sort(rng.integers(1, 500, 3000))
    cfg = PlanConfig(max_tokens=1024, layout="padded", dp=2, grad_accum=4, pp=2, pad_multiple=16)
    out = planned(tmp_path, np.arange(3000), lens, cfg)
    meta = json.loads((out / PLAN_JSON).read_text())
    assert meta["layout"] == {"dp": 2, "pp": 2, "cp": 1, "grad_accum": 4}
    assert meta["stats"]["pp_extra_padding"] >= 0
    for m in manifests(out):
        for s in np.unique(m["step"]):
            sel = m["step"] == s
            assert (
                sel.sum() == 4 and len(set(zip(m["rows"][sel], m["pad_to"][sel], strict=True))) == 1
            )
            assert (m["rows"][sel] * m["pad_to"][sel] <= 1024).all() and (
                m["count"][sel] >= 1
            ).all()
    assert validate_plan(out, (np.arange(3000), lens)).problems == []
    # Curriculum pp costs little over the same plan without pp.
    base = make_plan(np.arange(3000), lens, PlanConfig(**{**cfg.to_dict(), "pp": 1}))[1]
    assert meta["stats"]["padding_ratio"] < base["stats"]["padding_ratio"] + 0.05


def test_blocks_on_action_genome_shape(tmp_path):
    lens = action_genome_lengths()
    ids = np.arange(len(lens))
    cfg = PlanConfig(batching="blocks", max_tokens=94 * 8, order="shuffle", seed=1)
    out = planned(tmp_path, ids, np.sort(lens), cfg)
    meta = json.loads((out / PLAN_JSON).read_text())
    b = meta["stats"]["blocks"]
    assert meta["config"]["block_len"] == 94 and meta["config"]["blocks_per_batch"] == 8
    assert b["block_padding"] < 3695  # the BLoad paper's padded frames on Action Genome
    assert b["block_padding"] == b["blocks"] * 94 - int(lens.sum())
    for m in manifests(out):
        for sl, bi in zip(m["seq_lens"], m["block_index"], strict=True):
            fill = np.bincount(bi, weights=sl)
            assert fill.max() <= 94 and bi[0] == 0 and (np.diff(bi) >= 0).all()
            starts = reset_table(np.array(sl), np.array(bi))
            assert (starts + np.array(sl) <= 94).all()
    assert validate_plan(out, (ids, np.sort(lens))).problems == []


def test_warmup_reorder_prefix_largest_first_and_lr_recomputed(tmp_path, rng):
    lens = np.sort(rng.integers(1, 400, 2000))
    kw = dict(
        max_tokens=512,
        layout="padded",
        max_shapes=6,
        dp=2,
        grad_accum=2,
        lr_scaling="linear",
        base_batch_size=16,
    )
    listed = plan_arrays(np.arange(2000), lens, PlanConfig(**kw))
    out = planned(tmp_path, np.arange(2000), lens, PlanConfig(**kw, warmup="reorder"))
    meta = json.loads((out / PLAN_JSON).read_text())
    for r, m in enumerate(manifests(out)):
        p = int(m["warmup"].sum())
        assert m["warmup"][:p].all() and not m["warmup"][p:].any()
        shapes = meta["ranks"][r]["shapes"]
        assert [
            [int(b), int(t)] for b, t in zip(m["rows"][:p], m["pad_to"][:p], strict=True)
        ] == shapes
        sizes = [b * t for b, t in shapes]
        assert sizes == sorted(sizes, reverse=True)
        assert compiles_after_prefix(m["rows"], m["pad_to"], m["warmup"]) == []
    # The same micro-batches as the listed plan, moved within their rank; LR follows the steps.
    assert sorted(meta["stats"]["shapes_per_rank"]) == sorted(
        len(s) for s in make_plan(np.arange(2000), lens, PlanConfig(**kw))[2] for s in [s["shapes"]]
    )
    assert meta["stats"]["padded_tokens"] == int((listed.micro.rows * listed.micro.pad_to).sum())
    assert validate_plan(out, (np.arange(2000), lens)).problems == []


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_tokens": 64, "grad_accum": 3, "pp": 2}, "multiple of --pp"),
        ({"max_tokens": 64, "pack_to": 64, "max_shapes": 4}, "conflicts with --max-shapes"),
        ({"max_tokens": 64, "pack_to": 32}, "conflicts with --max-tokens"),
        ({"max_tokens": 64, "pack_to": 64, "layout": "padded"}, "applies to --layout packed"),
        ({"max_tokens": 64, "max_shapes": 2, "oversize": "alone"}, "--oversize alone conflicts"),
        ({"max_tokens": 64, "max_shapes": 0}, "--max-shapes"),
        ({"max_tokens": 64, "block_len": 8}, "--batching blocks only"),
        ({"batching": "blocks"}, "needs --max-tokens"),
        (
            {"batching": "blocks", "max_tokens": 64, "block_len": 30, "blocks_per_batch": 3},
            "exceeds",
        ),
        (
            {"batching": "blocks", "max_tokens": 64, "oversize": "alone"},
            "--oversize alone conflicts",
        ),
        ({"max_tokens": 64, "warmup": "sometimes"}, "choose one of"),
    ],
)
def test_shape_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        PlanConfig(**kw).resolved()


def test_blocks_defaults_resolve_from_data():
    cfg = plan_arrays(
        np.arange(4), np.array([3, 5, 7, 20]), PlanConfig(batching="blocks", max_tokens=64)
    ).cfg
    assert (cfg.block_len, cfg.blocks_per_batch, cfg.layout) == (20, 3, "padded")
    with pytest.raises(ConfigError, match="exceeds --max-tokens"):
        plan_arrays(np.arange(2), np.array([3, 80]), PlanConfig(batching="blocks", max_tokens=64))
    with pytest.raises(ConfigError, match="do not fit --block-len 10"):
        plan_arrays(
            np.arange(3),
            np.array([3, 5, 12]),
            PlanConfig(batching="blocks", max_tokens=64, block_len=10),
        )


# ---- properties: every combination through the real planner ---------------------------------------

shape_configs = st.fixed_dictionaries(
    {
        "batching": st.sampled_from(["budget", "budget", "fixed", "blocks"]),
        "budget": st.integers(32, 600),
        "block_len": st.sampled_from([None, 24, 60, 200]),
        "layout": st.sampled_from(["packed", "padded"]),
        "pad_multiple": st.sampled_from([1, 4, 8]),
        "max_shapes": st.sampled_from([None, 1, 2, 3, 8]),
        "pack_to": st.booleans(),
        "warmup": st.sampled_from(["list", "reorder", "none"]),
        "pp": st.sampled_from([1, 2]),
        "dp": st.integers(1, 3),
        "accum_mult": st.integers(1, 2),
        "order": st.sampled_from(["curriculum", "shuffle"]),
        "epochs": st.integers(1, 2),
        "oversize": st.sampled_from(["error", "drop", "drop"]),
        "blocks_per_batch": st.sampled_from([None, 1, 3]),
        "seed": st.integers(0, 3),
    }
)


def shape_config(c: dict) -> PlanConfig:
    blocks = c["batching"] == "blocks"
    packed = c["layout"] == "packed" and not blocks
    pack_to = c["pack_to"] and packed and c["batching"] == "budget" and c["max_shapes"] is None
    budget = max(c["budget"], c["pad_multiple"], 200 if blocks else 0)
    return PlanConfig(
        batching=c["batching"],
        max_tokens=budget if c["batching"] != "fixed" else None,
        batch_size=3 if c["batching"] == "fixed" else None,
        layout=c["layout"],
        pad_multiple=c["pad_multiple"],
        max_shapes=c["max_shapes"],
        pack_to=budget if pack_to else None,
        block_len=c["block_len"] if blocks else None,
        warmup=c["warmup"],
        pp=c["pp"],
        dp=c["dp"],
        grad_accum=c["pp"] * c["accum_mult"],
        order=c["order"],
        epochs=c["epochs"],
        oversize=c["oversize"] if c["batching"] != "fixed" else "error",
        blocks_per_batch=c["blocks_per_batch"] if blocks else None,
        seed=c["seed"],
        lr_scaling="linear",
        base_batch_size=8.0,
    )


ACCEPTED = (
    "cannot fill one step",
    "do not fit",
    "cannot be split",
    "cannot fill (step, rank)",
    "exceeds --max-tokens",
)


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(1, 200), min_size=6, max_size=150), c=shape_configs)
def test_property_shapes_invariants_and_validate(lens, c):
    lens_a = np.sort(np.array(lens, dtype=np.int64), kind="stable")
    ids = np.arange(len(lens_a), dtype=np.int64) * 3 + 1
    cfg = shape_config(c)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = planned(Path(tmp), ids, lens_a, cfg)
        except ConfigError as exc:
            assert any(s in str(exc) for s in ACCEPTED), str(exc)
            event("refused: " + next(s for s in ACCEPTED if s in str(exc)))
            return
        event(f"planned {cfg.batching} pp={cfg.pp} warmup={cfg.warmup}")
        meta = json.loads((out / PLAN_JSON).read_text())
        rcfg = meta["config"]
        k = cfg.grad_accum
        for r, m in enumerate(manifests(out)):
            shapes = set(zip(m["rows"].tolist(), m["pad_to"].tolist(), strict=True))
            assert sorted(map(list, shapes)) == sorted(meta["ranks"][r]["shapes"])
            assert (m["count"] >= 1).all() and (m["pad_rows"] >= 0).all()
            if cfg.max_shapes is not None:  # shape bound
                assert len(shapes) <= cfg.max_shapes
            if rcfg["pack_to"] is not None:
                assert (m["pad_to"] == rcfg["pack_to"]).all()
            if rcfg["batching"] != "fixed":  # the budget holds for the whole shape
                vol = m["rows"] * m["pad_to"] if rcfg["layout"] == "padded" else m["pad_to"]
                assert (vol <= rcfg["max_tokens"]).all()
            if cfg.pp > 1:  # one shape per (step, rank); K (a multiple of pp) per step
                for s in np.unique(m["step"]):
                    sel = m["step"] == s
                    assert sel.sum() == k and sel.sum() % cfg.pp == 0
                    assert len(set(zip(m["rows"][sel], m["pad_to"][sel], strict=True))) == 1
            if rcfg["batching"] == "blocks":  # block lengths and block_index
                t = rcfg["block_len"]
                assert (m["pad_to"] == t).all()
                for sl, bi, pr in zip(m["seq_lens"], m["block_index"], m["pad_rows"], strict=True):
                    bi = np.array(bi)
                    assert bi[0] == 0 and set(np.diff(bi).tolist()) <= {0, 1}
                    assert np.bincount(bi, weights=sl).max() <= t
                    assert bi[-1] + 1 + pr == rcfg["blocks_per_batch"]
            if cfg.warmup == "reorder":  # warm-up prefix covers every shape
                assert compiles_after_prefix(m["rows"], m["pad_to"], m["warmup"]) == []
                p = int(m["warmup"].sum())
                assert m["warmup"][:p].all()
            else:
                assert not m["warmup"].any()
        report = validate_plan(out, (ids, lens_a))
        assert report.problems == []
