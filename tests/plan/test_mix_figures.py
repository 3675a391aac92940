"""A blend's figures say what they measure, the same way everywhere: the tolerance is a fixed
promise (2 points by default, whatever the steps' size), ``plan``'s line, ``inspect`` and the
plot's reference line all speak of it, and of how many steps hold it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.plan.figures.words import points


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(8)
    n = 5000
    src = rng.choice(["chat", "docs", "code"], n, p=[0.6, 0.15, 0.25])
    lens = np.where(src == "docs", rng.integers(1000, 6000, n), rng.integers(20, 900, n))
    path = tmp_path_factory.mktemp("fig") / "m.parquet"
    pq.write_table(pa.table({"sample_id": np.arange(n), "seq_len": lens, "source": src}), path)
    return path


def _plan(meta: Path, out: Path, *extra: object) -> tuple[Any, dict[str, Any]]:
    got = cli("plan", meta, out, "--max-tokens", 4096, "--dp", 2, "--grad-accum", 2,
              "--order", "shuffle", "--oversize", "split", "--source-column", "source",
              "--mix", "chat=0.3,docs=0.5,code=0.2", *extra)  # fmt: skip
    return got, json.loads((out / "plan.json").read_text())


@pytest.mark.parametrize("grad_accum", [2, 64])
def test_the_default_tolerance_is_two_points_at_any_step_size(
    tmp_path: Path, meta: Path, grad_accum: int
) -> None:
    got, doc = _plan(meta, tmp_path / "p", "--grad-accum", grad_accum, "--total-tokens", 30_000_000)
    mix = doc["mix"]
    assert mix["tolerance"] == 0.02
    s = mix["steps"]
    line = got.stdout.splitlines()[0]
    assert (f"{s['within']:,} of {s['steps']:,} steps hold every source within 2 points of its "
            f"target, 95% within {points(s['p95'])}") in line  # fmt: skip
    outside = sum(1 for sh in mix["shares"].values() if sh["outside"])
    assert ("--mix-tolerance" in got.stderr) == (outside > 0) == (s["within"] < s["steps"])
    if grad_accum == 64:  # steps of 512 K tokens hold the weights
        assert s["within"] >= 0.9 * s["steps"] and s["p95"] <= 0.02
    else:  # steps of 16 K tokens do not all hold them: said, not excused
        assert s["within"] < 0.95 * s["steps"] and s["p95"] > 0.02
        assert f"95% of the steps are within {points(s['p95'])}" in got.stderr


def test_a_tolerance_given_is_the_one_counted(tmp_path: Path, meta: Path) -> None:
    _, doc = _plan(meta, tmp_path / "p", "--mix-tolerance", 0.3, "-q")
    s = doc["mix"]["steps"]
    assert doc["mix"]["tolerance"] == 0.3 and s["within"] == s["steps"] > 0
    for sh in doc["mix"]["shares"].values():
        assert sh["held"] == 1.0 and sh["outside"] == 0
    _, tight = _plan(meta, tmp_path / "q", "--mix-tolerance", 0.001, "-q")
    assert tight["mix"]["steps"]["within"] < s["within"]


def test_inspect_shows_the_figures_plan_prints(tmp_path: Path, meta: Path) -> None:
    got, doc = _plan(meta, tmp_path / "p")
    mix = doc["mix"]
    text = cli("inspect", tmp_path / "p").stdout
    assert f"by tokens of column source, total {mix['total']:,}; tolerance 2 points" in text
    held = got.stdout.splitlines()[0].rsplit("); ", 1)[1]  # "K of N steps hold ..., 95% within D"
    assert held.startswith(f"{mix['steps']['within']:,} of ") and held in text
    for name, fig in mix["sources"].items():
        sh = mix["shares"][name]
        row = next(r for r in text.splitlines() if r.strip().startswith(f"{name} "))
        assert f"weight {fig['weight']:.3g}, target {100 * fig['target']:.2f}% of the tokens" in row
        assert f"{fig['planned_samples']:,} of {fig['samples']:,} samples" in row
        assert f"in {fig['planned_pieces']:,} pieces" in row
        assert f"steps {100 * sh['min']:.1f} .. {100 * sh['max']:.1f}%" in row
        assert f"{100 * sh['held']:.1f}% of the steps within 2 points" in row
        assert f"steps {100 * sh['min']:.1f}..{100 * sh['max']:.1f}%" in got.stdout  # plan's
    described = json.loads(cli("inspect", tmp_path / "p", "--json").stdout)
    assert described["mix"]["steps"] == mix["steps"]


@pytest.mark.parametrize("tolerance", [None, 0.07])
def test_the_plot_draws_the_tolerance_the_summary_counts(
    tmp_path: Path, meta: Path, monkeypatch: pytest.MonkeyPatch, tolerance: float | None
) -> None:
    """The plot's reference line sits at plan.json's tolerance, its title says how many steps
    hold it, and its dashed lines are the targets the summary measures against."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    extra = () if tolerance is None else ("--mix-tolerance", tolerance)
    _, doc = _plan(meta, tmp_path / "p", *extra, "-q")
    mix = doc["mix"]
    saved: list[Figure] = []
    original = Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), original(fig, *a, **k))
    )
    cli("inspect", tmp_path / "p", "--plot", tmp_path / "mix.png")
    (fig,) = saved
    cdf = next(a for a in fig.axes if a.get_title().startswith("steps within a distance"))
    (line,) = [ln for ln in cdf.get_lines() if ln.get_label().startswith("tolerance")]
    assert line.get_xdata()[0] == pytest.approx(100 * mix["tolerance"])
    assert line.get_label() == f"tolerance {points(mix['tolerance'])}"
    s = mix["steps"]
    assert f"{s['within']:,} of {s['steps']:,} steps hold every source" in cdf.get_title()
    shares = next(a for a in fig.axes if a.get_title().startswith("token share of each step"))
    dashed = sorted(ln.get_ydata()[0] for ln in shares.get_lines() if ln.get_linestyle() == "--")
    assert dashed == pytest.approx(sorted(100 * f["target"] for f in mix["sources"].values()))
