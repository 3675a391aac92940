"""``varpack plan --where`` under mpiexec: the one-process plan and its selection, byte for byte.

The condition runs on each rank's share of the ``--carry-from`` metadata's row groups; kept ids
meet the input's ids at their owners. The plans (plan.json's ``selection`` included) and the
summary line must be the one process's, and a condition's errors its one line.

The runs under mpiexec are made up front, one MPI job per rank count (``tests/mpi_batch.py``);
each test then checks its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from mpi_batch import Case, Ran, mpiexec_many
from testkit import cli, write_shards

pytestmark = pytest.mark.mpi


def _files(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.iterdir())}


def _data(tmp: Path, n: int = 6000) -> tuple[Path, Path]:
    """Metadata in shards of many row groups (a source and a score per sample), sorted."""
    rng = np.random.default_rng(4)
    ids = rng.permutation(4 * n)[:n]
    lens = rng.integers(1, 4000, n)
    source = rng.choice(np.array(["web", "code", "books"]), n)
    score = rng.random(n)
    meta = write_shards(tmp / "meta", ids, lens, [n // 3, 0, n - n // 3], source=source,
                        score=score)  # fmt: skip
    for f in sorted(meta.iterdir()):  # row groups of 500 rows: shares cut between them
        table = pq.read_table(f)
        pq.write_table(table, f, row_group_size=500)
    cli("sort", meta, tmp / "sorted", "-q")
    return meta, tmp / "sorted"


SELECTIONS = [
    ("source = 'web'", []),
    ("score > 0.3 AND source <> 'books'", ["--order", "shuffle", "--epochs", 2]),
    ("score < 0.02", ["--carry", "source", "--dp", 3]),
]
FAILING = [
    ("nope > 1", True, "--where 'nope > 1'"),
    ("score > 2", True, "selects none of the 6,000 samples"),
    ("score > 0.5", False, "add --carry-from PATH"),
]


def _selection(meta: Path, sql: str, extra: list[object]) -> list[object]:
    return ["--max-tokens", 4096, "--dp", 2, "--where", sql, "--carry-from", meta, *extra]


def _failing(meta: Path, sql: str, carry_from: bool) -> list[object]:
    return ["--max-tokens", 4096, "--where", sql, *(["--carry-from", meta] if carry_from else [])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Ran]]:
    """The data, and every plan of it under mpiexec, by name: its case and what it gave."""
    top = tmp_path_factory.mktemp("where-mpi")
    meta, sorted_out = _data(top)
    cases: dict[str, Case] = {}
    for i, (sql, extra) in enumerate(SELECTIONS):
        for ranks in (2, 3):
            out = top / f"select{i}-r{ranks}"
            cases[f"select{i}-{ranks}"] = (ranks, ["plan", sorted_out, out,
                                                   *_selection(meta, sql, extra)])  # fmt: skip
    for i, (sql, carry_from, _) in enumerate(FAILING):
        out = top / f"fail{i}"
        cases[f"fail{i}"] = (3, ["plan", sorted_out, out, *_failing(meta, sql, carry_from)])
    got = mpiexec_many(list(cases.values()), top / "jobs")
    return {name: (case, ran) for (name, case), ran in zip(cases.items(), got, strict=True)}


@pytest.mark.parametrize("sql, extra", SELECTIONS)
def test_selections_are_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, sql: str, extra: list[object]
) -> None:
    i = SELECTIONS.index((sql, extra))
    (_, (_, sorted_out, _, *args)), _ = runs[f"select{i}-2"]
    one = cli("plan", sorted_out, tmp_path / "one", *args)
    assert '"selection"' in (tmp_path / "one" / "plan.json").read_text()
    for ranks in (2, 3):
        (_, (_, _, out, *_)), got = runs[f"select{i}-{ranks}"]
        assert got.returncode == 0, got.stderr
        assert _files(Path(str(out))) == _files(tmp_path / "one"), (ranks, sql)
        assert got.stdout.replace(str(out), "OUT") == one.stdout.replace(
            str(tmp_path / "one"), "OUT"
        )


@pytest.mark.parametrize("sql, carry_from, line", FAILING)
def test_a_condition_fails_as_in_one_process(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, sql: str, carry_from: bool, line: str
) -> None:
    (_, (_, sorted_out, out, *args)), got = runs[f"fail{FAILING.index((sql, carry_from, line))}"]
    one = cli("plan", sorted_out, tmp_path / "one", *args, expect=None)
    assert one.exit_code != 0 and line in one.output
    assert got.returncode == one.exit_code and got.stdout == ""
    assert got.stderr.strip() == one.output.strip()
    assert not Path(str(out)).exists()
