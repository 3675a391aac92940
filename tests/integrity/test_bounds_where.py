"""A ``--where`` condition is bounded before polars sees it (polars' optimiser is superlinear in
an expression's size: 3,000 ``OR`` terms over 600 rows once took 20 GB and 756 s): at most
``MAX_CHARS`` characters, ``MAX_TERMS`` terms and ``MAX_DEPTH`` nested parentheses, the largest
of each still evaluated. And an evaluation that takes long ends on SIGTERM or SIGINT at once
(polars runs in a worker thread), exit 143 or 130, nothing left behind, on every command that
evaluates a condition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import cli, write_metadata

from varpack.errors import ConfigError
from varpack.metadata.condition import MAX_CHARS, MAX_DEPTH, MAX_TERMS
from varpack.metadata.where import where_ids

N = 600


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2)
    return write_metadata(
        tmp_path / "m.parquet", np.arange(N), np.arange(N) + 1, score=rng.random(N)
    )


@pytest.fixture
def no_polars(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a condition reaches polars' SQL layer."""
    import polars as pl

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("polars was handed the condition")

    monkeypatch.setattr(pl, "SQLContext", never)


def _ors(k: int) -> str:
    """``seq_len = 1 OR seq_len = 2 OR ...``: k comparisons, 3k - 1 terms."""
    return " OR ".join(f"seq_len = {i + 1}" for i in range(k))


def test_the_reviewers_3000_terms_are_refused_at_once(meta: Path, no_polars: None) -> None:
    sql = _ors(3000)  # 8,999 terms in 53 K characters
    with pytest.raises(ConfigError, match=f"more than the {MAX_CHARS:,} a condition may hold"):
        where_ids([str(meta)], sql)


def test_terms_are_bounded(meta: Path, no_polars: None) -> None:
    base = _ors(85)  # 254 terms, 2 K characters
    with pytest.raises(ConfigError, match=f"257 terms .* more than the {MAX_TERMS} .* as one term"):
        where_ids([str(meta)], base + " OR seq_len < 0")
    with pytest.raises(ConfigError, match="299 terms"):
        where_ids([str(meta)], _ors(100))


def test_the_largest_condition_runs(meta: Path) -> None:
    assert np.array_equal(where_ids([str(meta)], _ors(85) + " OR NOT TRUE"), np.arange(85))
    values = ", ".join(str(i) for i in range(1, 4000))  # an IN list is one term
    sql = f"seq_len IN ({values})"[: MAX_CHARS - 1].rsplit(",", 1)[0] + ")"
    assert len(sql) < MAX_CHARS
    got = where_ids([str(meta)], sql)
    assert np.array_equal(got, np.arange(N))


def test_length_and_nesting_are_bounded(meta: Path, no_polars: None) -> None:
    with pytest.raises(ConfigError, match=f"{MAX_CHARS + 1:,} characters, more than"):
        where_ids([str(meta)], "seq_len > 1" + " " * (MAX_CHARS - 10))
    deep = "(" * (MAX_DEPTH + 1) + "seq_len > 3" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(ConfigError, match=f"{MAX_DEPTH + 1} nested parentheses, more than"):
        where_ids([str(meta)], deep)


def test_the_deepest_nesting_runs(meta: Path) -> None:
    sql = "(" * MAX_DEPTH + "seq_len > 3" + ")" * MAX_DEPTH
    assert np.array_equal(where_ids([str(meta)], sql), np.arange(3, N))


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        (_ors(3000), f"{len(_ors(3000)):,} characters"),  # the reviewer's
        (_ors(100), "299 terms"),
        ("(" * 40 + "seq_len > 3" + ")" * 40, "40 nested parentheses"),
    ],
    ids=["characters", "terms", "nesting"],
)
def test_each_bound_is_one_line_and_writes_nothing(
    tmp_path: Path, meta: Path, sql: str, says: str
) -> None:
    for args in (["plan", meta, tmp_path / "p", "--max-tokens", 4096], ["check", meta]):
        res = cli(*args, "--where", sql, expect=2)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and len(lines[0]) < 1200, res.stderr
    assert not (tmp_path / "p").exists()


#: varpack with every --where evaluation slow inside polars: native work in a polars UDF
#: that never checks for signals (as polars' own optimiser did on a huge condition)
SLOW = """
import hashlib, os, sys
from pathlib import Path
import polars as pl

execute = pl.SQLContext.execute

def slow_execute(self, query, *args, **kwargs):
    lf = execute(self, query, *args, **kwargs)
    if "WHERE" not in query or "SLOW_WHERE" not in os.environ:
        return lf

    def slow(df):
        Path(os.environ["SLOW_WHERE"]).touch()
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2**31 - 1)  # half an hour or more
        return df

    return lf.map_batches(slow, schema=lf.collect_schema())

pl.SQLContext.execute = slow_execute
from varpack.cli import main
main(sys.argv[1:], prog_name="varpack")
"""


def _interrupt(tmp: Path, args: list[object], sig: int) -> tuple[int, str]:
    """Run ``varpack ARGS`` with a slow condition, send ``sig`` once polars is in it; the exit
    code and stderr (the process is killed, and the test fails, if it does not end)."""
    script = tmp / "slow_varpack.py"
    script.write_text(SLOW)
    marker = tmp / "in-polars"
    env = dict(os.environ, SLOW_WHERE=str(marker))
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env,
                            stderr=subprocess.PIPE, text=True, cwd=tmp)  # fmt: skip
    try:
        for _ in range(1200):  # until the evaluation is under way
            if marker.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)  # the work left would take hours
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", ["plan", "check", "validate"])
@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_ends_a_slow_condition_at_once(
    tmp_path: Path, meta: Path, command: str, sig: int, code: int
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    where = ["--where", "score > 0.5"]
    if command == "validate":  # the plan made first; validate evaluates its condition again
        cli("plan", meta, work / "p", "--max-tokens", 4096, *where, "-q")
        args: list[object] = ["validate", work / "p", "--metadata", meta]
    elif command == "plan":
        args = ["plan", meta, work / "p", "--max-tokens", 4096, *where]
    else:
        args = ["check", meta, *where]
    before = sorted(p.name for p in work.iterdir())
    rc, err = _interrupt(work, args, sig)
    assert rc == code, err
    assert err.strip().splitlines()[-1].startswith("varpack: error: interrupted by SIG"), err
    left = sorted(p.name for p in work.iterdir() if p.name not in ("slow_varpack.py", "in-polars"))
    assert left == before  # no plan, no temporary, no lock
