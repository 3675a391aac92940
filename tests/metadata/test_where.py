"""``--where``: SQL selection over the metadata, for ``plan`` and ``check``, checked by ``validate``.

A plan with ``--where`` must equal the plan of the same rows selected by hand; bad conditions
are one line and write nothing; ``validate --metadata`` re-applies the condition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.metadata.where import where_ids
from varpack.planfile.format import PLAN_VERSION

PLAN = ("--max-tokens", 4096, "--dp", 2, "--grad-accum", 2, "--order", "shuffle", "-q")


@pytest.fixture
def meta(tmp_path: Path) -> tuple[Path, pa.Table]:
    rng = np.random.default_rng(3)
    tables = []
    for k in range(5):  # shards of unequal sizes, one empty
        n = [700, 0, 1200, 300, 900][k]
        t = pa.table({
            "sample_id": np.arange(n, dtype=np.int64) * 7 + k,
            "seq_len": rng.integers(5, 3000, n),
            "score": rng.random(n),
            "lang": rng.choice(["en", "de", "fr"], n),
            "quality": rng.integers(0, 5, n).astype(np.int32),
        })  # fmt: skip
        (tmp_path / "meta").mkdir(exist_ok=True)
        pq.write_table(t, tmp_path / "meta" / f"s{k}.parquet")
        tables.append(t)
    return tmp_path / "meta", pa.concat_tables(tables)


def _ranks(plan: Path) -> list[str]:
    return [r["sha256"] for r in json.loads((plan / "plan.json").read_text())["ranks"]]


@pytest.mark.parametrize(
    ("sql", "by_hand"),
    [
        ("score > 0.5 AND lang = 'en'", lambda t: (t["score"] > 0.5) & (t["lang"] == "en")),
        ("quality >= 3 OR seq_len < 100", lambda t: (t["quality"] >= 3) | (t["seq_len"] < 100)),
        (
            "lang IN ('de', 'fr') AND NOT score < 0.2",
            lambda t: t["lang"].isin(["de", "fr"]) & ~(t["score"] < 0.2),
        ),  # fmt: skip
    ],
)
def test_where_plans_exactly_what_the_same_selection_by_hand_plans(
    tmp_path: Path, meta: tuple[Path, pa.Table], sql: str, by_hand
) -> None:
    path, table = meta
    df = {c: np.asarray(table[c]) for c in table.column_names}
    mask = np.asarray(by_hand(_Frame(df)))
    pq.write_table(table.filter(pa.array(mask)), tmp_path / "hand.parquet")
    cli("plan", path, tmp_path / "where", *PLAN, "--where", sql)
    cli("plan", tmp_path / "hand.parquet", tmp_path / "hand", *PLAN)
    assert _ranks(tmp_path / "where") == _ranks(tmp_path / "hand")  # byte-identical manifests
    doc = json.loads((tmp_path / "where" / "plan.json").read_text())
    sel = doc["selection"]
    assert (sel["kept_samples"], sel["samples"]) == (int(mask.sum()), len(mask))
    assert sel["kept_tokens"] == int(df["seq_len"][mask].sum()) and sel["where"] == sql
    assert doc["version"] == PLAN_VERSION  # the planner's version: a selection needs no newer
    out = cli("validate", tmp_path / "where", "--metadata", path).stdout
    assert out.startswith("OK")
    got = json.loads(cli("check", path, "--where", sql, "--json").stdout)
    assert got["count"] == int(mask.sum()) and got["selection"]["kept_samples"] == int(mask.sum())


class _Frame:
    """Column access with .isin, enough for the by-hand selections above."""

    def __init__(self, cols: dict[str, np.ndarray]) -> None:
        self.cols = cols

    def __getitem__(self, name: str) -> _Col:
        return _Col(self.cols[name])


class _Col(np.ndarray):
    def __new__(cls, a: np.ndarray) -> _Col:
        return np.asarray(a).view(cls)

    def isin(self, values: list[str]) -> np.ndarray:
        return np.isin(np.asarray(self), values)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("scor > 0.5", "no column 'scor' in the metadata (columns: sample_id, seq_len, score"),
        ("score >> 1", "--where 'score >> 1'"),
        ("score > 2", "selects none of the 3,100 samples"),
        ("  ", "the condition is empty"),
        ("1 = 1; DROP TABLE metadata", "no ';'"),
    ],
)
def test_a_bad_condition_is_one_line_and_writes_nothing(
    tmp_path: Path, meta: tuple[Path, pa.Table], sql: str, words: str
) -> None:
    out = cli("plan", meta[0], tmp_path / "p", *PLAN, "--where", sql, expect=2)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], out.stderr
    assert not (tmp_path / "p").exists()


def test_validate_names_samples_the_condition_no_longer_selects(
    tmp_path: Path, meta: tuple[Path, pa.Table]
) -> None:
    path, table = meta
    cli("plan", path, tmp_path / "p", *PLAN, "--where", "score > 0.5")
    score = np.asarray(table["score"]).copy()
    flip = int(np.flatnonzero(score > 0.5)[0])
    score[flip] = 0.1  # the metadata changed since planning: one sample no longer selected
    changed = table.set_column(table.schema.get_field_index("score"), "score", pa.array(score))
    pq.write_table(changed, tmp_path / "changed.parquet")
    out = cli("validate", tmp_path / "p", "--metadata", tmp_path / "changed.parquet", expect=1)
    assert str(int(table["sample_id"][flip])) in out.stdout


def test_where_reads_a_sort_outputs_metadata_from_carry_from(
    tmp_path: Path, meta: tuple[Path, pa.Table]
) -> None:
    path, _ = meta
    cli("sort", path, tmp_path / "sorted", "-q")
    out = cli(
        "plan", tmp_path / "sorted", tmp_path / "p", *PLAN, "--where", "score > 0.5", expect=2
    )
    assert "add --carry-from PATH" in out.stderr and "lengths --keep COL" in out.stderr
    cli("plan", tmp_path / "sorted", tmp_path / "p", *PLAN, "--where", "score > 0.5",
        "--carry-from", path)  # fmt: skip
    cli("plan", path, tmp_path / "direct", *PLAN, "--where", "score > 0.5")
    assert _ranks(tmp_path / "p") == _ranks(tmp_path / "direct")
    (tmp_path / "c.toml").write_text("where = \"lang = 'fr'\"\n")
    cli("plan", path, tmp_path / "toml", *PLAN, "--config", tmp_path / "c.toml")
    assert json.loads((tmp_path / "toml" / "plan.json").read_text())["selection"]["where"] == (
        "lang = 'fr'"
    )


def test_where_ids_reads_only_the_condition_columns(meta: tuple[Path, pa.Table]) -> None:
    path, table = meta
    files = sorted(str(p) for p in path.glob("*.parquet"))
    got = where_ids(files, "quality = 4")
    want = np.sort(np.asarray(table["sample_id"])[np.asarray(table["quality"]) == 4])
    assert np.array_equal(got, want)
