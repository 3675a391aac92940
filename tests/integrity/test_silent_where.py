"""A condition is never silently dropped: every path that takes one (``--where``, a ``--config``
file's ``where``, ``mpiexec ... varpack plan --where``, ``varpack check --where``, and ``validate
--metadata`` where plan.json's condition is read back) applies the same refusals, an empty
condition first; a text option given empty (``--mix ""``) is refused too, never read as "not
given"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import cli, mpiexec, write_metadata

from varpack.planfile.schema import CHECKSUM_KEY, plan_checksum

PLAN = ("--max-tokens", 2048, "--dp", 2, "-q")
EMPTY = ["", " ", "   ", "\t\n", " \r\n "]


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    n = 500
    return write_metadata(
        tmp_path / "m.parquet", np.arange(n) * 3, rng.integers(4, 900, n),
        score=rng.random(n), lang=rng.choice(["en", "de"], n),
    )  # fmt: skip


def _one_line(res: Any) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.mark.parametrize("sql", EMPTY)
def test_an_empty_flag_is_refused_like_a_blank_one(tmp_path: Path, meta: Path, sql: str) -> None:
    line = _one_line(cli("plan", meta, tmp_path / "p", *PLAN, "--where", sql, expect=2))
    assert line == (
        "varpack: error: --where: the condition is empty; give a SQL condition (score > 0.5)"
    )
    assert not (tmp_path / "p").exists()
    assert _one_line(cli("check", meta, "--where", sql, expect=2)) == line


@pytest.mark.parametrize("sql", EMPTY)
def test_an_empty_config_condition_is_refused_naming_the_file(
    tmp_path: Path, meta: Path, sql: str
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f"where = {json.dumps(sql)}\n")
    res = cli("plan", meta, tmp_path / "p", *PLAN, "--config", conf, expect=2)
    assert f"--config {conf}: where: the condition is empty" in _one_line(res)
    assert not (tmp_path / "p").exists()


def test_a_flag_overrides_the_config_file_even_when_it_is_empty(tmp_path: Path, meta: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("where = \"lang = 'en'\"\n")
    res = cli("plan", meta, tmp_path / "p", *PLAN, "--config", conf, "--where", "", expect=2)
    assert "--where: the condition is empty" in _one_line(res)  # not the file's condition
    cli("plan", meta, tmp_path / "p", *PLAN, "--config", conf, "--where", "score > 0.5")
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["selection"]["where"] == "score > 0.5"


@pytest.mark.parametrize(
    ("flag", "extra"),
    [("--mix", ["--source-column", "lang"]), ("--source-column", []), ("--carry-from", [])],
)
@pytest.mark.parametrize("value", ["", "  "])
def test_other_text_options_given_empty_are_refused(
    tmp_path: Path, meta: Path, flag: str, extra: list[str], value: str
) -> None:
    res = cli("plan", meta, tmp_path / "p", *PLAN, flag, value, *extra, expect=2)
    assert (
        _one_line(res) == f"varpack: error: {flag} is empty; give a value or leave the option out"
    )
    assert not (tmp_path / "p").exists()


def _reseal(plan: Path, change: Any) -> None:
    """Edit plan.json as a forger would: the change made, its checksum recomputed to fit."""
    path = plan / "plan.json"
    doc = json.loads(path.read_text())
    change(doc)
    doc[CHECKSUM_KEY] = plan_checksum(doc)
    path.write_text(json.dumps(doc, indent=2))


@pytest.mark.parametrize("sql", ["", "  \n"])
def test_validate_refuses_an_empty_condition_read_back_from_plan_json(
    tmp_path: Path, meta: Path, sql: str
) -> None:
    plan = tmp_path / "p"
    cli("plan", meta, plan, *PLAN, "--where", "score > 0.5")
    assert cli("validate", plan, "--metadata", meta).stdout.startswith("OK")
    _reseal(plan, lambda d: d["selection"].update(where=sql))
    line = _one_line(cli("validate", plan, "--metadata", meta, expect=2))
    assert f"{plan}: plan.json's selection where: the condition is empty" in line


@pytest.mark.mpi
@pytest.mark.parametrize("sql", ["", "  "])
def test_under_mpi_an_empty_condition_is_the_one_process_line(
    tmp_path: Path, meta: Path, sql: str
) -> None:
    cli("sort", meta, tmp_path / "sorted", "-q")
    args = ["--max-tokens", 2048, "--where", sql, "--carry-from", meta]
    one = cli("plan", tmp_path / "sorted", tmp_path / "one", *args, expect=2)
    got = mpiexec(2, "plan", tmp_path / "sorted", tmp_path / "p", *args, check=False)
    assert got.returncode == 2 and got.stderr.strip() == one.stderr.strip()
    assert "the condition is empty" in got.stderr
    assert not (tmp_path / "p").exists()
