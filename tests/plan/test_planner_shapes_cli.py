"""Shapes as the command line writes and checks them: `varpack validate` refuses plans whose
shape rules were broken by hand (a late shape after the warm-up, a pipeline step of two shapes, an
overfull block, too many shapes), a compiling trainer's replay of the manifests `varpack plan`
wrote finds no shape after the warm-up prefix, and the shape options read from a TOML file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shape_helpers import compiles_after_prefix, manifests, planned
from testkit import cli, write_metadata

from varpack.plan import PlanConfig
from varpack.planfile.format import PLAN_JSON, _write_table, rank_file, sha256_file

# ---- validate catches broken shape rules ----------------------------------------------------------


def _forge(plan: Path, rank: int, rows: list[dict]) -> None:
    path = plan / rank_file(rank)
    table = pa.Table.from_pylist(rows, schema=pq.read_schema(path))
    _write_table(table, path)
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["ranks"][rank].update(sha256=sha256_file(path), rows=table.num_rows)
    (plan / PLAN_JSON).write_text(json.dumps(doc))


def test_validate_catches_late_shape_after_warmup(tmp_path, rng):
    lens = np.sort(rng.integers(1, 300, 800))
    cfg = PlanConfig(max_tokens=512, layout="padded", max_shapes=5, warmup="reorder", grad_accum=1)
    out = planned(tmp_path, np.arange(800), lens, cfg)
    rows = pq.read_table(out / rank_file(0)).to_pylist()
    rows[0]["warmup"] = False  # the largest shape is now met only... in its warm-up slot? no: late
    _forge(out, 0, rows)
    text = cli("validate", out, expect=1).stdout
    assert "warm-up" in text or "not in the warm-up prefix" in text


def test_validate_catches_pp_shape_mismatch_and_block_overflow(tmp_path, rng):
    lens = np.sort(rng.integers(1, 300, 800))
    pp = planned(
        tmp_path / "a",
        np.arange(800),
        lens,
        PlanConfig(max_tokens=512, layout="padded", grad_accum=2, pp=2),
    )
    rows = pq.read_table(pp / rank_file(0)).to_pylist()
    rows[0]["pad_rows"] += 1
    _forge(pp, 0, rows)
    assert "shapes, the pipeline needs one" in cli("validate", pp, expect=1).stdout
    blk = planned(
        tmp_path / "b", np.arange(800), lens, PlanConfig(batching="blocks", max_tokens=600)
    )
    rows = pq.read_table(blk / rank_file(0)).to_pylist()
    row = next(r for r in rows if len(r["block_index"]) >= 2 and r["block_index"][1] == 1)
    row["block_index"][1] = 0  # two samples in one block: over its length or not, fill changes
    _forge(blk, 0, rows)
    text = cli("validate", blk, expect=1).stdout
    assert "blocks +" in text or "over the block length" in text


def test_validate_catches_too_many_shapes(tmp_path, rng):
    lens = np.sort(rng.integers(1, 300, 800))
    out = planned(tmp_path, np.arange(800), lens, PlanConfig(max_tokens=512, max_shapes=2))
    rows = pq.read_table(out / rank_file(0)).to_pylist()
    rows[-1]["pad_to"] = 511
    _forge(out, 0, rows)
    text = cli("validate", out, expect=1).stdout
    assert "pad_to differs from the shape rule" in text and "over --max-shapes 2" in text


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--max-shapes", 4],
        ["--layout", "padded", "--max-shapes", 4],
        ["--layout", "padded", "--pp", 2, "--pad-multiple", 32],
        ["--layout", "padded", "--pp", 2, "--max-shapes", 4, "--order", "shuffle"],
        ["--pp", 2, "--max-shapes", 3, "--epochs", 2],
    ],
)
def test_no_shape_first_appears_after_the_warmup_prefix(tmp_path, rng, extra):
    """Replay each rank's shape sequence from the written manifests, as a compiling trainer would."""
    lens = rng.lognormal(5.0, 1.0, 3000).astype(np.int64).clip(1, 1024)
    write_metadata(tmp_path / "m.parquet", np.arange(3000), lens)
    out = tmp_path / "plan"
    cli(
        "plan",
        tmp_path / "m.parquet",
        out,
        "--max-tokens",
        2048,
        "--dp",
        3,
        "--grad-accum",
        4,
        "--warmup",
        "reorder",
        *extra,
    )
    meta = json.loads((out / PLAN_JSON).read_text())
    for r, m in enumerate(manifests(out)):
        assert compiles_after_prefix(m["rows"], m["pad_to"], m["warmup"]) == []
        p = int(m["warmup"].sum())
        assert p == len(meta["ranks"][r]["shapes"]) * (4 if "--pp" in extra else 1)  # whole steps
    assert cli("validate", out, "--metadata", tmp_path / "m.parquet").stdout.startswith("OK ")
    text = cli("inspect", out).stdout
    assert "largest shapes" in text and "warm-up" in text
    if "--pp" in extra:
        assert "pipeline" in text


def test_toml_accepts_shape_options(tmp_path, rng):
    lens = rng.integers(1, 90, 2000)
    write_metadata(tmp_path / "m.parquet", np.arange(2000), lens)
    toml = tmp_path / "plan.toml"
    toml.write_text('batching = "blocks"\nmax-tokens = 940\nwarmup = "reorder"\n[plan_extra]\n')
    res = cli("plan", tmp_path / "m.parquet", tmp_path / "x", "--config", toml, expect=2)
    assert "unexpected table" in res.stderr
    toml.write_text(
        'batching = "blocks"\nmax-tokens = 940\nwarmup = "reorder"\nblock-window = 512\n'
    )
    cli("plan", tmp_path / "m.parquet", tmp_path / "p", "--config", toml, "--dp", 2)
    cfg = json.loads((tmp_path / "p" / PLAN_JSON).read_text())["config"]
    assert (cfg["block_len"], cfg["blocks_per_batch"], cfg["block_window"], cfg["dp"]) == (
        int(lens.max()),
        940 // int(lens.max()),
        512,
        2,
    )
    text = cli("inspect", tmp_path / "p").stdout
    assert "blocks" in text and "padding inside blocks" in text
    bad = cli(
        "plan",
        tmp_path / "m.parquet",
        tmp_path / "q",
        "--max-tokens",
        64,
        "--grad-accum",
        3,
        "--pp",
        2,
        expect=2,
    )
    assert "multiple of --pp" in bad.stderr and not (tmp_path / "q").exists()
