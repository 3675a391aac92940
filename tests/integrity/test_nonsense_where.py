"""A ``--where`` condition is an expression over one metadata row, and nothing else reaches
polars: no subquery, file, table function, aggregate, window, clock, comment or statement; no
column the metadata lacks; no function whose result outgrows its row. Each kind is refused in
one line that says what a condition may hold, before polars sees the text (polars would read a
``read_parquet`` file while only parsing); conditions within the grammar select what the same
selection by hand selects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.errors import ConfigError
from varpack.metadata import where as where_module
from varpack.metadata.where import where_ids

N = 400
ALLOWED = "a condition is an expression over one metadata row"


@pytest.fixture
def meta(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    cols = {
        "sample_id": np.arange(N, dtype=np.int64) * 5 + 2,
        "seq_len": rng.integers(1, 3000, N),
        "score": rng.random(N),
        "lang": rng.choice(np.array(["en", "de", "it's"]), N),
        "my score": rng.random(N),
        "order": rng.integers(0, 6, N),
    }
    pq.write_table(pa.table(cols), tmp_path / "m.parquet", row_group_size=128)
    pq.write_table(pa.table({"sample_id": cols["sample_id"][:3]}), tmp_path / "outside.parquet")
    return tmp_path / "m.parquet", cols


#: (condition, what the line says); OUTSIDE is the path of another Parquet file
REFUSED = [
    ("sample_id IN (SELECT sample_id FROM read_parquet('OUTSIDE'))", "SELECT is not allowed"),
    ("EXISTS (SELECT 1)", "EXISTS is not allowed"),
    ("score > (SELECT avg(score) FROM metadata)", "SELECT is not allowed"),
    ("read_parquet('OUTSIDE') IS NULL", "read_parquet() is not a function of one row"),
    ("read_csv('OUTSIDE') IS NULL", "read_csv() is not a function of one row"),
    ("\"read_parquet\"('OUTSIDE') IS NULL", '"read_parquet" is not a function of a condition'),
    ("score > 0.5 UNION SELECT 1", "UNION is not allowed"),
    ("WITH x AS (SELECT 1) SELECT 1", "WITH is not allowed"),
    ("score > 0.5 JOIN x", "JOIN is not allowed"),
    ("1 = 1; DROP TABLE metadata", "one condition, no ';'"),
    ("score > avg(score)", "avg() is not a function of one row"),
    ("count(*) > 1", "count() is not a function of one row"),
    ("row_number() OVER () < 10", "row_number() is not a function of one row"),
    ("seq_len = max(seq_len)", "max() is not a function of one row"),
    ("now() > '2020-01-01'", "now() is not a function of one row"),
    ("random() < 0.5", "random() is not a function of one row"),
    ("repeat(lang, 1000000) = ''", "repeat() is not a function of one row"),
    ("lpad(lang, 100000000) = ''", "lpad() is not a function of one row"),
    ("concat(lang, lang) = 'enen'", "concat() is not a function of one row"),
    ("lang || 'x' = 'enx'", "no || (a condition compares values"),
    ("CASE WHEN score > 0.5 THEN TRUE ELSE FALSE END", "CASE is not allowed"),
    ("score > 0.5 -- AND lang = 'en'", "no comments (-- or /* */)"),
    ("score > 0.5 /* AND lang = 'en' */", "no comments (-- or /* */)"),
    ("nope > 1", "no column 'nope' in the metadata (columns: sample_id, seq_len, score"),
    ('"nope" > 1', "no column 'nope' in the metadata"),
    ("SCORE > 0.5", "no column 'SCORE' in the metadata"),  # names are case-sensitive
    ("my score > 0.5", "no column 'my' in the metadata"),
    ("order < 3", "ORDER is not allowed in a condition; a condition is"),
    ("metadata.score > 0.5", "'.' at character 9 is not part of a condition"),
    ("`score` > 0.5", "quote a column name with double quotes"),
    ("lang = $$en$$", "'$' at character 8 is not part of a condition"),
    ("lang = E'en'", "no column 'E' in the metadata"),
    ("score > ?", "'?' at character 9 is not part of a condition"),
    ("lang = 'en", "an unterminated string at character 8"),
    ("CAST(score AS DATE) IS NULL", "DATE is not a type a condition casts to"),
]


def _fill(sql: str, tmp: Path) -> str:
    return sql.replace("OUTSIDE", str(tmp / "outside.parquet"))


@pytest.mark.parametrize(("sql", "says"), REFUSED)
def test_each_kind_is_refused_before_polars_sees_it(
    tmp_path: Path, meta: Any, sql: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import polars as pl

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("polars was handed the condition")

    path, _ = meta
    monkeypatch.setattr(pl, "SQLContext", never)
    with pytest.raises(ConfigError) as info:
        where_ids([str(path)], _fill(sql, tmp_path))
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("sql", "says"), REFUSED[::3])
def test_each_kind_is_one_line_on_every_command(
    tmp_path: Path, meta: Any, sql: str, says: str
) -> None:
    path, _ = meta
    sql = _fill(sql, tmp_path)
    for args in (["plan", path, tmp_path / "p", "--max-tokens", 4096], ["check", path]):
        res = cli(*args, "--where", sql, expect=2)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], res.stderr
        assert not (tmp_path / "p").exists()


def test_the_line_says_what_a_condition_may_hold(tmp_path: Path, meta: Any) -> None:
    res = cli("plan", meta[0], tmp_path / "p", "--max-tokens", 4096, "--where",
              "score > avg(score)", expect=2)  # fmt: skip
    line = res.stderr.strip()
    assert f"{ALLOWED}: its columns, literals, comparisons" in line
    assert "IN (...), BETWEEN, LIKE" in line and "lower" in line and "regexp_like" in line


#: conditions within the grammar, and the same selection by hand
ACCEPTED = [
    ("\"score\" > 0.5 AND lower(lang) = 'en'", lambda c: (c["score"] > 0.5) & (c["lang"] == "en")),
    ("CAST(seq_len AS DOUBLE) / 2 > 700.5", lambda c: c["seq_len"] / 2 > 700.5),
    ("seq_len % 7 = 0 OR lang IN ('de')", lambda c: (c["seq_len"] % 7 == 0) | (c["lang"] == "de")),
    (
        "lang LIKE 'e%' AND score BETWEEN 0.2 AND 0.4",
        lambda c: (c["lang"] == "en") & (c["score"] >= 0.2) & (c["score"] <= 0.4),
    ),
    ("lang = 'it''s'", lambda c: c["lang"] == "it's"),  # a quote inside a string
    ("lang = 'SELECT * FROM x; --'", lambda c: c["lang"] == "nothing"),  # words in a string
    ("lang = 'en'' OR 1 = 1 OR lang = '''", lambda c: c["lang"] == "nothing"),
    ('"my score" < 0.1 AND "order" >= 3', lambda c: (c["my score"] < 0.1) & (c["order"] >= 3)),
    ("NOT (seq_len::int > 100) AND score IS NOT NULL", lambda c: ~(c["seq_len"] > 100)),
    ("regexp_like(lang, '^d') AND length(lang) = 2", lambda c: c["lang"] == "de"),
    ("abs(score - 0.5) < 0.01", lambda c: np.abs(c["score"] - 0.5) < 0.01),
]


@pytest.mark.parametrize(("sql", "by_hand"), ACCEPTED)
def test_conditions_within_the_grammar_select_what_the_hand_selects(
    meta: Any, sql: str, by_hand: Any
) -> None:
    path, cols = meta
    want = np.sort(cols["sample_id"][np.asarray(by_hand(cols))])
    assert np.array_equal(where_ids([str(path)], sql), want)


def test_validate_refuses_a_condition_read_back_that_reaches_outside(
    tmp_path: Path, meta: Any
) -> None:
    import json

    from varpack.planfile.schema import CHECKSUM_KEY, plan_checksum

    path, _ = meta
    plan = tmp_path / "p"
    cli("plan", path, plan, "--max-tokens", 4096, "--where", "score > 0.5", "-q")
    doc = json.loads((plan / "plan.json").read_text())
    doc["selection"]["where"] = _fill(REFUSED[0][0], tmp_path)  # a forger's, resealed
    doc[CHECKSUM_KEY] = plan_checksum(doc)
    (plan / "plan.json").write_text(json.dumps(doc))
    res = cli("validate", plan, "--metadata", path, expect=2)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{plan}: plan.json's selection where" in lines[0]
    assert "SELECT is not allowed" in lines[0]


def test_the_text_polars_runs_is_the_checked_one(meta: Any) -> None:
    """Whitespace outside literals becomes one space (plan.json keeps that text); inside a
    string it is the user's."""
    path, cols = meta
    got = where_module.check_sql("lang   =\n'it''s'\tAND  score>0.5")
    assert got == "lang = 'it''s' AND score>0.5"
    want = cols["sample_id"][(cols["lang"] == "it's") & (cols["score"] > 0.5)]
    assert np.array_equal(where_ids([str(path)], got), np.sort(want))
