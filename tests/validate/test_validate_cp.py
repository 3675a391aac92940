"""validate on --cp plans: placement in range, within each CP rank's capacity, figures recomputed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.plan import PlanConfig, make_plan
from varpack.planfile.format import PLAN_JSON, _write_table, rank_file, sha256_file, write_plan
from varpack.planfile.tables import plan_tables


@pytest.fixture
def cp_plan(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    lens = np.sort(np.concatenate([rng.integers(1, 60, 300), rng.integers(150, 600, 60)]))
    cfg = PlanConfig(cp=4, bucket_size=160, dp=2, grad_accum=2, order="shuffle", seed=2)
    arrays, meta, extra = make_plan(np.arange(len(lens), dtype=np.int64), lens, cfg)
    out = tmp_path / "plan"
    write_plan(out, meta, list(plan_tables(arrays)), rank_extra=extra)
    assert cli("validate", out).exit_code == 0
    return out


def _forge(plan: Path, rank: int, edit) -> None:  # type: ignore[no-untyped-def]
    """Edit rank's rows and update plan.json's checksum (a consistent forgery)."""
    path = plan / rank_file(rank)
    rows = pq.read_table(path).to_pylist()
    edit(rows)
    _write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["ranks"][rank].update(sha256=sha256_file(path), rows=len(rows))
    (plan / PLAN_JSON).write_text(json.dumps(doc))


def _violations(plan: Path) -> str:
    return cli("validate", plan, expect=1).stdout


def test_placement_out_of_range(cp_plan):
    _forge(cp_plan, 0, lambda rows: rows[0]["cp_placement"].__setitem__(0, 4))
    assert "cp_placement out of range (-1 or 0..3)" in _violations(cp_plan)


def test_over_capacity(cp_plan):
    def all_local(rows):  # type: ignore[no-untyped-def]
        row = max(rows, key=lambda r: sum(r["seq_lens"]))
        row["cp_placement"] = [0] * len(row["seq_lens"])

    _forge(cp_plan, 1, all_local)
    out = _violations(cp_plan)
    assert "a CP rank holds more than the bucket size 160 tokens" in out and "rank 1 step" in out


def test_placement_not_parallel(cp_plan):
    _forge(cp_plan, 0, lambda rows: rows[0]["cp_placement"].append(-1))
    assert "cp_placement lists are not parallel to sample_ids" in _violations(cp_plan)


def test_edited_figures(cp_plan):
    doc = json.loads((cp_plan / PLAN_JSON).read_text())
    doc["cp"]["estimated_time"] *= 2
    (cp_plan / PLAN_JSON).write_text(json.dumps(doc))
    assert "plan.json cp estimated_time" in _violations(cp_plan)


def test_moved_placement_changes_figures(cp_plan):
    def move(rows):  # type: ignore[no-untyped-def]
        row = next(r for r in rows if 0 in r["cp_placement"] and len(r["seq_lens"]) > 3)
        i = row["cp_placement"].index(0)
        row["cp_placement"][i] = -1  # still fits: a distributed sample needs less room

    _forge(cp_plan, 0, move)
    assert "plan.json cp" in _violations(cp_plan)


def test_replay_of_a_cp_plan(cp_plan, tmp_path):
    from testkit import write_metadata

    rng = np.random.default_rng(5)
    lens = np.sort(np.concatenate([rng.integers(1, 60, 300), rng.integers(150, 600, 60)]))
    meta = write_metadata(tmp_path / "meta" / "part-0.parquet", np.arange(len(lens)), lens)
    res = cli("validate", cp_plan, "--metadata", meta.parent, "--replay", expect=None)
    assert res.exit_code == 0, res.stdout


def test_inspect_shows_and_plots_the_cp_load(cp_plan, tmp_path):
    out = cli("inspect", cp_plan).stdout
    assert "estimated time" in out and "CP memory" in out and "CP imbalance" in out
    info = json.loads(cli("inspect", cp_plan, "--json").stdout)
    assert info["cp"]["cp"] == 4 and info["layout"]["cp"] == 4
    pytest.importorskip("matplotlib")
    cli("inspect", cp_plan, "--plot", tmp_path / "cp.png")
    assert (tmp_path / "cp.png").stat().st_size > 10_000
