"""``plan --mix`` refused in one line, nothing written: totals too small to give every source a
share or to fill one step (tokens or samples, whole documents or pieces), and ``--mix`` under
``mpiexec`` (with ``--oversize split`` too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from testkit import cli, mpiexec, write_metadata


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    n = 400
    src = rng.choice(["web", "code", "books"], n, p=[0.5, 0.3, 0.2])
    lens = np.where(src == "books", rng.integers(600, 3000, n), rng.integers(5, 500, n))
    return write_metadata(tmp_path / "m.parquet", np.arange(n), lens, source=src)


MIX = ("--max-tokens", 1024, "--source-column", "source", "--mix", "web=0.5,code=0.3,books=0.2")


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("varpack: error: "), stderr
    return lines[0]


@pytest.mark.parametrize("oversize", ["drop", "split"])
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--total-tokens", 1), "--total-tokens 1: source 'web' (weight 0.5) would get no tokens; "
                                "give a total of at least 5"),
        (("--total-tokens", 2), "source 'books' (weight 0.2) would get no tokens"),
        (("--mix-unit", "samples", "--total-samples", 1), "--total-samples 1: source 'web'"),
        (("--mix-unit", "samples", "--total-samples", 10, "--dp", 4, "--grad-accum", 4),
         "--total-samples 10: the blend draws 10 samples"),
    ],
)  # fmt: skip
def test_a_total_too_small_is_one_line(
    tmp_path: Path, meta: Path, args: tuple[object, ...], words: str, oversize: str
) -> None:
    out = cli("plan", meta, tmp_path / "p", *MIX, "--oversize", oversize, *args, expect=2)
    line = _one_line(out.stderr)
    assert words in line
    if "draws" in line:  # whole samples, or the pieces of split ones
        assert "fewer than one step's dp x grad_accum = 16 micro-batches" in line
        assert ("pieces)" in line) == (oversize == "split")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.parquet"]


def test_a_blend_of_fewer_samples_than_a_step_is_one_line(tmp_path: Path, meta: Path) -> None:
    out = cli("plan", meta, tmp_path / "p", *MIX, "--oversize", "drop", "--total-tokens", 5,
              "--dp", 4, expect=2)  # fmt: skip
    assert ("--total-tokens 5: the blend draws 3 samples, fewer than one step's dp x "
            "grad_accum = 4 micro-batches; give a larger total") in _one_line(out.stderr)  # fmt: skip
    assert not (tmp_path / "p").exists()


def test_the_smallest_total_the_line_names_plans(tmp_path: Path, meta: Path) -> None:
    """The total the refusal names gives every source a share (a step of one micro-batch)."""
    out = cli(
        "plan", meta, tmp_path / "p", *MIX, "--oversize", "drop", "--total-tokens", 2, expect=2
    )
    least = int(_one_line(out.stderr).split("at least ")[1].split()[0])
    cli("plan", meta, tmp_path / "p", *MIX, "--oversize", "drop", "--total-tokens", least, "-q")
    assert cli("validate", tmp_path / "p").stdout.startswith("OK")


def test_replay_of_a_blend_is_one_line_and_validate_without_it_passes(
    tmp_path: Path, meta: Path
) -> None:
    """``validate --replay`` cannot draw a blend again from the metadata alone (the sources
    come from a column it does not read): one line, not a list of rows that "differ"."""
    cli("plan", meta, tmp_path / "p", *MIX, "--oversize", "drop", "-q")
    out = cli("validate", tmp_path / "p", "--metadata", meta, "--replay", expect=2)
    assert "a --mix plan is not re-planned by --replay" in _one_line(out.stderr)
    assert "replay:" not in out.stdout
    assert cli("validate", tmp_path / "p", "--metadata", meta).stdout.startswith("OK")


@pytest.mark.parametrize("split", [False, True])
def test_a_blend_under_mpiexec_is_refused_in_one_line(
    tmp_path: Path, meta: Path, split: bool
) -> None:
    cli("sort", meta, tmp_path / "sorted", "-q")
    extra = ("--oversize", "split") if split else ()
    got = mpiexec(2, "plan", tmp_path / "sorted", tmp_path / "out", *MIX, "--carry-from", meta,
                  *extra, check=False)  # fmt: skip
    assert got.returncode == 2 and got.stdout == ""
    assert "--mix is not planned across MPI ranks yet" in _one_line(got.stderr)
    assert not (tmp_path / "out").exists()
