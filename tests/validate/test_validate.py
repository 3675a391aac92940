"""`varpack validate` catches tampering: edited files, and rebuilt-but-wrong manifests."""

from __future__ import annotations

import json
import re
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
def plan_dir(tmp_path: Path, rng: np.random.Generator) -> Path:
    lens = np.sort(rng.integers(1, 400, 600))
    ids = np.arange(600, dtype=np.int64)
    cfg = PlanConfig(max_tokens=512, dp=2, grad_accum=2, lr_scaling="linear", base_batch_size=16)
    arrays, meta, extra = make_plan(ids, lens, cfg)
    out = tmp_path / "plan"
    write_plan(out, meta, list(plan_tables(arrays)), rank_extra=extra)
    assert cli("validate", out).exit_code == 0
    return out


def _rewrite(plan: Path, rank: int, table: pa.Table) -> None:
    """Replace a manifest and update plan.json's checksum and rows (a 'consistent' forgery)."""
    path = plan / rank_file(rank)
    _write_table(table, path)
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["ranks"][rank].update(sha256=sha256_file(path), rows=table.num_rows)
    (plan / PLAN_JSON).write_text(json.dumps(doc))


def _rows(plan: Path, rank: int) -> list[dict]:
    return pq.read_table(plan / rank_file(rank)).to_pylist()


def _table(rows: list[dict], like: Path) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pq.read_schema(like))


def _violations(plan: Path) -> str:
    res = cli("validate", plan, expect=1)
    return res.stdout


def test_edited_manifest_fails_checksum(plan_dir):
    path = plan_dir / rank_file(1)
    rows = _rows(plan_dir, 1)
    rows[0]["lr_factor"] = 99.0
    _write_table(_table(rows, path), path)
    assert "sha256 does not match" in _violations(plan_dir)


def test_missing_sample_detected(plan_dir):
    rows = _rows(plan_dir, 0)
    gone = rows[3]["sample_ids"].pop()
    rows[3]["seq_lens"].pop()
    _rewrite(plan_dir, 0, _table(rows, plan_dir / rank_file(0)))
    out = _violations(plan_dir)
    assert "do not match the input fingerprint" in out
    assert "step_samples differs" in out
    res = cli("validate", plan_dir, "--metadata", _meta(plan_dir, gone), expect=1)
    assert f"missing from the plan (not dropped): {gone}" in res.stdout


def _meta(plan: Path, _gone: int) -> Path:
    """Write the plan's own input as metadata (ids 0..599 with their lengths)."""
    from testkit import write_metadata

    ids, lens = [], []
    for r in range(2):
        for row in _rows(plan, r):
            ids += row["sample_ids"]
            lens += row["seq_lens"]
    ids.append(_gone)
    lens.append(1)
    order = np.argsort(ids)
    return write_metadata(plan.parent / "meta.parquet", np.array(ids)[order], np.array(lens)[order])


def test_duplicate_sample_detected(plan_dir):
    rows = _rows(plan_dir, 1)
    rows[0]["sample_ids"][0] = rows[1]["sample_ids"][0]
    rows[0]["seq_lens"][0] = rows[1]["seq_lens"][0]
    _rewrite(plan_dir, 1, _table(rows, plan_dir / rank_file(1)))
    assert "planned more than once" in _violations(plan_dir)


def test_budget_exceeded_detected(plan_dir):
    rows = _rows(plan_dir, 0)
    rows[-1]["seq_lens"][0] += 600
    rows[-1]["pad_to"] += 600
    _rewrite(plan_dir, 0, _table(rows, plan_dir / rank_file(0)))
    out = _violations(plan_dir)
    assert "over the budget of 512 tokens" in out


def test_unequal_counts_detected(plan_dir):
    rows = _rows(plan_dir, 1)[:-1]
    _rewrite(plan_dir, 1, _table(rows, plan_dir / rank_file(1)))
    assert "unequal counts" in _violations(plan_dir)


def test_wrong_lr_and_numbering_detected(plan_dir):
    rows = _rows(plan_dir, 0)
    rows[2]["lr_factor"] *= 2
    _rewrite(plan_dir, 0, _table(rows, plan_dir / rank_file(0)))
    assert "lr_factor differs" in _violations(plan_dir)
    rows = _rows(plan_dir, 0)
    rows[0]["micro"], rows[1]["micro"] = 1, 0
    _rewrite(plan_dir, 0, _table(rows, plan_dir / rank_file(0)))
    assert "numbering is not contiguous" in _violations(plan_dir)


def test_not_a_plan_is_exit_2(tmp_path):
    res = cli("validate", tmp_path, expect=2)
    assert "not a varpack plan" in res.stderr


def test_budget_fill_is_recomputed_and_shown(plan_dir):
    doc = json.loads((plan_dir / PLAN_JSON).read_text())
    s = doc["stats"]
    assert s["budget_fill"] == s["real_tokens"] / (s["num_micro_batches"] * 512)
    assert 0 < s["budget_fill"] <= 1
    assert f"budget fill {100 * s['budget_fill']:.1f}%" in cli("validate", plan_dir).stdout
    text = cli("inspect", plan_dir).stdout
    assert re.search(rf"budget fill +{100 * s['budget_fill']:.2f}%", text)
    doc["stats"]["budget_fill"] = 0.99
    (plan_dir / PLAN_JSON).write_text(json.dumps(doc))
    assert "plan.json stats budget_fill = 0.99, recomputed" in _violations(plan_dir)


def test_bound_and_fill_given_up_are_recomputed_and_shown(plan_dir):
    doc = json.loads((plan_dir / PLAN_JSON).read_text())
    s = doc["stats"]
    assert 1.0 <= s["time_vs_ideal_bound"] <= s["time_vs_ideal"]
    assert set(s["fill_given_up"]) == {"mean", "max"}
    assert f"(bound {s['time_vs_ideal_bound']:.3f})" in cli("validate", plan_dir).stdout
    text = cli("inspect", plan_dir).stdout
    assert re.search(rf"bound +{s['time_vs_ideal_bound']:.4f}", text)
    assert "fill given up" in text
    doc["stats"]["time_vs_ideal_bound"] = 1.5
    doc["stats"]["fill_given_up"]["max"] = 0.5
    (plan_dir / PLAN_JSON).write_text(json.dumps(doc))
    out = _violations(plan_dir)
    assert "plan.json stats time_vs_ideal_bound = 1.5, recomputed" in out
    assert "plan.json stats fill_given_up" in out
