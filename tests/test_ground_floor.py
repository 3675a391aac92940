"""The ground floor: atomic outputs and fingerprints."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.atomic import atomic_dir, check_output
from varpack.console import LogProgress, progress
from varpack.errors import OutputError, OutputExistsError
from varpack.fingerprint import fingerprint


def test_atomic_dir_publishes_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone too


def test_atomic_dir_refuses_existing_output_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        check_output(out, overwrite=False)
    with pytest.raises(OutputError, match="not an output varpack wrote"):
        check_output(out, overwrite=True)  # a directory varpack did not write is never replaced
    with atomic_dir(tmp_path / "ours", marker="test") as tmp:
        (tmp / "new.txt").write_text("new")
    with atomic_dir(tmp_path / "ours", overwrite=True, marker="test") as tmp:
        (tmp / "newer.txt").write_text("newer")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["_varpack.json", "newer.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "out"]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**62), st.integers(1, 2**20)),
        min_size=1,
        max_size=50,
        unique_by=lambda t: t[0],
    ),
    st.randoms(use_true_random=False),
)
def test_fingerprint_is_order_and_split_independent(pairs: list[tuple[int, int]], rnd) -> None:
    ids = np.array([p[0] for p in pairs], dtype=np.int64)
    lens = np.array([p[1] for p in pairs], dtype=np.int64)
    whole = fingerprint(ids, lens)
    perm = np.array(rnd.sample(range(len(ids)), len(ids)))
    cut = rnd.randint(0, len(ids))
    parts = fingerprint(ids[perm][:cut], lens[perm][:cut]) + fingerprint(
        ids[perm][cut:], lens[perm][cut:]
    )
    assert parts == whole
    assert whole.count == len(ids) and whole.tokens == int(lens.sum())


def test_fingerprint_sees_a_changed_length() -> None:
    ids = np.arange(100)
    lens = np.full(100, 7)
    changed = lens.copy()
    changed[42] = 8
    swapped = lens.copy()
    swapped[[1, 2]] = [6, 8]  # same count and token total, different pairs
    assert fingerprint(ids, lens).hex != fingerprint(ids, changed).hex
    assert fingerprint(ids, lens).hex != fingerprint(ids, swapped).hex


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_log_progress_writes_a_line_per_interval_with_rate_and_eta() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = LogProgress("lengths", 1000, interval=10.0, clock=clock, stream=out)
    for _ in range(9):  # 9 s, 90 rows: no line before the interval
        clock.now += 1
        bar.advance(0, 10)
    assert out.getvalue() == ""
    short = io.StringIO()
    quick = LogProgress("lengths", 5, interval=10.0, clock=clock, stream=short)
    quick.advance(0, 5)
    quick.finish()
    assert short.getvalue() == ""  # done within the first interval: silent
    clock.now += 1
    bar.advance(0, 10)  # 10 s, 100 rows
    clock.now += 5
    bar.advance(0, 100)  # 15 s: within the interval of the last line, nothing new
    clock.now += 5
    bar.advance(0, 100)  # 20 s, 300 rows
    clock.now += 30
    bar.advance(0, 700)  # 50 s, 1,000 rows
    bar.finish()
    assert out.getvalue().splitlines() == [
        "lengths: 100 / 1,000 (10.0%), 10/s, ETA 1m 30s",
        "lengths: 300 / 1,000 (30.0%), 15/s, ETA 47s",
        "lengths: 1,000 / 1,000 (100.0%), 20/s, ETA 0s",
        "lengths: done, 1,000 in 50s (20/s)",
    ]


def test_progress_logs_lines_when_stderr_is_not_a_terminal(monkeypatch, capsys) -> None:
    monkeypatch.setenv("VARPACK_PROGRESS_INTERVAL", "0")
    with progress("synth", 3) as bar:  # pytest's captured stderr is not a terminal
        assert isinstance(bar, LogProgress)
        bar.advance(0, 2)
        bar.advance(0, 1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("synth: 2 / 3 (66.7%), ") and "ETA" in lines[0]
    assert lines[-1].startswith("synth: done, 3 in ")
    with progress("synth", 3, quiet=True) as quiet:
        quiet.advance(0, 3)
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError), progress("synth", 3):
        raise RuntimeError  # a failure prints no "done" line
    assert "done" not in capsys.readouterr().err


def test_progress_is_a_rich_bar_on_a_terminal(monkeypatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress("synth", 3) as bar:
        assert not isinstance(bar, LogProgress)
        bar.advance(0, 3)
