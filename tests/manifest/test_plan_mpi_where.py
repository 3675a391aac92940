"""``varpack plan --where`` under mpiexec: the one-process plan and its selection, byte for byte.

The condition runs on each rank's share of the ``--carry-from`` metadata's row groups; kept ids
meet the input's ids at their owners. The plans (plan.json's ``selection`` included) and the
summary line must be the one process's, and a condition's errors its one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from testkit import cli, mpiexec, write_shards

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


@pytest.mark.parametrize(
    "sql, extra",
    [
        ("source = 'web'", []),
        ("score > 0.3 AND source <> 'books'", ["--order", "shuffle", "--epochs", 2]),
        ("score < 0.02", ["--carry", "source", "--dp", 3]),
    ],
)
def test_selections_are_the_one_process_plan(tmp_path: Path, sql: str, extra: list[object]) -> None:
    meta, sorted_out = _data(tmp_path)
    args = ["--max-tokens", 4096, "--dp", 2, "--where", sql, "--carry-from", meta, *extra]
    one = cli("plan", sorted_out, tmp_path / "one", *args)
    assert '"selection"' in (tmp_path / "one" / "plan.json").read_text()
    for ranks in (2, 3):
        out = tmp_path / f"r{ranks}"
        got = mpiexec(ranks, "plan", sorted_out, out, *args)
        assert _files(out) == _files(tmp_path / "one"), (ranks, sql)
        assert got.stdout.replace(str(out), "OUT") == one.stdout.replace(
            str(tmp_path / "one"), "OUT"
        )


@pytest.mark.parametrize(
    "sql, carry_from, line",
    [
        ("nope > 1", True, "--where 'nope > 1'"),
        ("score > 2", True, "selects none of the 6,000 samples"),
        ("score > 0.5", False, "add --carry-from PATH"),
    ],
)
def test_a_condition_fails_as_in_one_process(
    tmp_path: Path, sql: str, carry_from: bool, line: str
) -> None:
    meta, sorted_out = _data(tmp_path)
    args = ["--max-tokens", 4096, "--where", sql, *(["--carry-from", meta] if carry_from else [])]
    one = cli("plan", sorted_out, tmp_path / "one", *args, expect=None)
    assert one.exit_code != 0 and line in one.output
    got = mpiexec(3, "plan", sorted_out, tmp_path / "out", *args, check=False)
    assert got.returncode == one.exit_code and got.stdout == ""
    assert got.stderr.strip() == one.output.strip()
    assert not (tmp_path / "out").exists()
