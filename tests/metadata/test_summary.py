"""``varpack check``: the summary figures, the histogram and the JSON form."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli, write_metadata, write_shards

from varpack.metadata.summary import bar, log2_histogram, render, summarize


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 2**40), min_size=1, max_size=300))
def test_histogram_bins_hold_their_lengths(lens: list[int]) -> None:
    arr = np.array(lens, dtype=np.int64)
    bins = log2_histogram(arr)
    assert sum(b.count for b in bins) == len(lens)
    assert sum(b.tokens for b in bins) == sum(lens)
    for b in bins:
        assert b.hi == 2 * b.lo and b.lo & (b.lo - 1) == 0
        assert b.count == sum(b.lo <= x < b.hi for x in lens)
    assert bins[0].count > 0 and bins[-1].count > 0  # trimmed to the occupied range
    assert all(x.hi == y.lo for x, y in zip(bins, bins[1:], strict=False))  # contiguous


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=500))
def test_percentiles_are_observed_lengths(lens: list[int]) -> None:
    s = summarize(np.array(lens), files=1)
    srt = sorted(lens)
    for name, q in [("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)]:
        v = s.percentiles[name]
        assert v in lens
        # inverted CDF: the smallest length with at least q% of samples at or below it
        k = int(np.ceil(q / 100 * len(lens)))
        assert v == srt[max(k, 1) - 1]
    assert s.min == srt[0] and s.max == srt[-1] and s.tokens == sum(lens)


def test_bar_resolution() -> None:
    assert bar(1.0, 10) == "█" * 10
    assert bar(0.55, 10) == "█████▌"
    assert bar(0.0, 10) == ""


def test_check_text(tmp_path: Path) -> None:
    lens = np.array([1, 2, 3, 4, 100, 1000, 1000, 7])
    write_shards(tmp_path / "m", np.arange(8) * 3, lens, [3, 5])
    out = cli("check", tmp_path / "m").stdout
    assert "files        2" in out
    assert "samples      8" in out
    assert f"tokens       {lens.sum():,}" in out
    assert "min 1  mean 264.6  max 1,000" in out
    assert "p50 4  p90 1,000" in out
    rows = [line for line in out.splitlines() if line.strip().startswith("[")]
    assert len(rows) == 10  # [1,2) ... [512,1024)
    assert rows[0].split()[:3] == ["[1,", "2)", "1"]
    assert rows[-1].split()[:4] == ["[512,", "1,024)", "2", "25.0%"]
    assert render(summarize(lens, 2)) == out.rstrip("\n")


def test_check_json_and_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 5000, 1000)
    score = rng.random(1000)
    write_metadata(tmp_path / "m.parquet", rng.permutation(1000), lens, score=score)
    data = json.loads(cli("check", tmp_path / "m.parquet", "--json", "--key", "score").stdout)
    assert data["files"] == 1 and data["count"] == 1000
    assert data["tokens"] == int(lens.sum())
    assert data["mean"] == float(lens.mean())
    assert data["percentiles"]["p90"] == int(np.percentile(lens, 90, method="inverted_cdf"))
    assert sum(b["count"] for b in data["histogram"]) == 1000
    assert data["keys"]["score"]["max"] == float(score.max())
    text = cli("check", tmp_path / "m.parquet", "--key", "score").stdout
    assert "key score" in text


BARS = "█▏▎▍▌▋▊▉"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 2**40), min_size=1, max_size=300), st.integers(0, 3000))
def test_histogram_columns_are_aligned(lens: list[int], repeats: int) -> None:
    """Every column ends where its header ends and every bar starts in the same column, whatever
    the widths of the bin labels and counts (a 4-digit count next to a 1-digit one)."""
    arr = np.concatenate([np.array(lens, dtype=np.int64), np.full(repeats, lens[0])])
    header, *rows = render(summarize(arr, 1)).split("\n\n", 1)[1].splitlines()
    ends = [m.end() for m in re.finditer(r"\S+", header)]
    assert len(ends) == 4 and header.endswith("tokens")
    for row in rows:
        assert all(row[e - 1] != " " and row[e : e + 2] in ("  ", "") for e in ends), row
        bar_at = [i for i, ch in enumerate(row) if ch in BARS]
        assert not bar_at or bar_at[0] == ends[-1] + 2, row
    assert any(ch in BARS for row in rows for ch in row)
