"""Bounds of ``plan --mix``: the blend's rows are estimated before anything is drawn, and a total
whose blend would not fit in memory is refused in one line (naming the rows, the GiB needed and
available, and the flag to lower), nothing written, nothing allocated for it."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
from testkit import cli, write_metadata

import varpack.make as make
from varpack.plan.mix import Mix, blend_rows, mix_units
from varpack.planfile.format import read_meta


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2)
    n = 300
    src = rng.choice(["web", "books"], n, p=[0.7, 0.3])
    lens = np.where(src == "books", rng.integers(900, 5000, n), rng.integers(5, 600, n))
    return write_metadata(tmp_path / "m.parquet", np.arange(n), lens, source=src)


MIX = ("--max-tokens", 1024, "--source-column", "source", "--mix", "web=0.6,books=0.4")


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("varpack: error: "), stderr
    return lines[0]


@pytest.mark.parametrize("oversize", ["drop", "split"])
@pytest.mark.parametrize(
    ("unit", "total"), [("tokens", 10**12), ("tokens", 10**30), ("samples", 10**11)]
)
def test_a_total_beyond_memory_is_refused_before_drawing(
    tmp_path: Path, meta: Path, unit: str, total: int, oversize: str
) -> None:
    """Totals of a trillion tokens and more: one line, in well under the memory they would take
    (the process grows by less than 200 MB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = cli("plan", meta, tmp_path / "p", *MIX, "--oversize", oversize, "--mix-unit", unit,
              f"--total-{unit}", total, expect=2)  # fmt: skip
    line = _one_line(out.stderr)
    assert f"--total-{unit} {total:,}: the blend would plan about " in line
    assert "GiB to plan" in line and "GiB are available; lower --total-" in line
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 200 * 2**20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.parquet"]


def test_the_bound_follows_the_memory_available(tmp_path: Path, meta: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A blend that plans here is refused where 1 MiB is available, naming its rows."""
    args = (meta, tmp_path / "p", *MIX, "--oversize", "split", "--total-tokens", 3_000_000, "-q")
    cli("plan", *args)
    rows = sum(f["planned_pieces"] for f in read_meta(tmp_path / "p")["mix"]["sources"].values())
    monkeypatch.setattr(make, "available_memory", lambda: 2**20)
    line = _one_line(cli("plan", *args[:1], tmp_path / "q", *args[2:], expect=2).stderr)
    estimate = int(line.split("about ")[1].split(" rows")[0].replace(",", ""))
    assert 0.9 * rows <= estimate <= 1.1 * rows + 10, (estimate, rows)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("by_tokens", [True, False])
def test_the_estimate_is_close_to_what_the_blend_draws(by_tokens: bool) -> None:
    """The estimate (rows per source times its repeat factor) within 10 % of the rows drawn,
    documents of several pieces counted as their pieces."""
    rng = np.random.default_rng(3)
    n = 5000
    codes = rng.integers(0, 3, n)
    lens = rng.integers(1, 4000, n)
    units = -(-lens // 1024)  # pieces of a 1,024-token budget
    for total in (10_000, 1_000_000, 30_000_000) if by_tokens else (700, 5000, 40_000):
        mix = Mix({"a": 0.5, "b": 0.3, "c": 0.2}, "tokens" if by_tokens else "samples", total)
        est = blend_rows(codes, lens, units, ["a", "b", "c"], mix)
        drawn, _ = mix_units(codes, lens, ["a", "b", "c"], mix, 0)
        got = int(units[drawn].sum())
        assert abs(est - got) <= 0.1 * got + 3, (total, est, got)
