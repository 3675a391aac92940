"""The oversize options through the CLI: split, the bounded alone, the figures every command
reports (tokens kept, split, dropped) and ``check --max-tokens``'s preview; bad combinations are
one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import cli, write_metadata

from varpack.planfile.format import load_plan

IDS = [1, 2, 3, 4, 5, 6]
LENS = [10, 500, 20, 30, 900, 60]  # 1,520 tokens; 500 and 900 exceed a budget of 100


@pytest.fixture
def meta(tmp_path):
    return write_metadata(tmp_path / "m.parquet", IDS, LENS)


def test_plan_split_summary_validate_inspect(meta, tmp_path):
    out = tmp_path / "plan"
    res = cli("plan", meta, out, "--max-tokens", 100, "--oversize", "split")
    assert (
        "tokens kept 1,520 of 1,520 (100.00%), split 1,400 (92.11%: 2 documents in 14 pieces), "
        "dropped 0 (0.00%)" in res.stdout
    )
    plan = load_plan(out)
    assert plan.meta["config"]["split_len"] == 100
    assert plan.meta["stats"]["tokens"]["split"] == 1400
    res = cli("validate", out, "--metadata", meta, "--replay")
    assert res.stdout.startswith("OK ") and "split 1,400 (92.11%" in res.stdout
    res = cli("inspect", out)
    assert (
        "kept 1,520 of 1,520 (100.00%), split 1,400 (92.11%: 2 documents in 14 pieces)"
        in res.stdout
    )
    assert "pieces of <= 100 tokens, positions restart" in res.stdout


def test_plan_drop_reports_dropped_share(meta, tmp_path):
    res = cli("plan", meta, tmp_path / "p", "--max-tokens", 100, "--oversize", "drop")
    assert "tokens kept 120 of 1,520 (7.89%), split 0 (0.00%" in res.stdout
    assert "dropped 1,400 (92.11%)" in res.stdout
    res = cli("validate", tmp_path / "p")
    assert "dropped 1,400 (92.11%)" in res.stdout


def test_error_suggests_split_first(meta, tmp_path):
    res = cli("plan", meta, tmp_path / "p", "--max-tokens", 100, expect=2)
    assert "; pass --oversize split (pieces of the budget), raise --max-tokens" in res.stderr


def test_alone_warns_above_twice_the_budget(meta, tmp_path):
    res = cli("plan", meta, tmp_path / "p", "--max-tokens", 100, "--oversize", "alone", "-q",
              "--max-alone-tokens", 1000)  # fmt: skip
    assert res.stderr.strip().splitlines() == [
        "varpack: warning: --oversize alone: 2 micro-batches exceed 2 x --max-tokens 100; "
        "the largest, sample_id 5, holds 900 tokens (9.0 x the budget)"
    ]
    assert load_plan(tmp_path / "p").meta["config"]["max_alone_tokens"] == 1000


def test_alone_refused_above_the_bound(meta, tmp_path):
    res = cli("plan", meta, tmp_path / "p", "--max-tokens", 100, "--oversize", "alone", expect=2)
    assert res.stderr.strip() == (
        "varpack: error: --oversize alone: 2 samples would make micro-batches above "
        "--max-alone-tokens 400 (4 x --max-tokens 100): sample_id 2 (500 tokens), 5 (900 tokens); "
        "split them (--oversize split), drop them (--oversize drop), or raise --max-alone-tokens"
    )
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--split-len", 50], "--split-len applies to --oversize split only"),
        (["--split-positions", "continue"], "--split-positions applies to --oversize split"),
        (["--oversize", "split", "--split-len", 101], "--split-len 101 exceeds 100"),
        (["--oversize", "split", "--pad-multiple", 64, "--split-len", 65], "exceeds 64"),
        (["--oversize", "split", "--batching", "blocks"], "conflicts with --batching blocks"),
        (
            ["--oversize", "split", "--layout", "padded", "--pp", 2, "--grad-accum", 2],
            "conflicts with --pp in the padded layout",
        ),  # fmt: skip
        (["--oversize", "split", "--cp", 2, "--bucket-size", 50], "conflicts with --cp with"),
        (["--max-alone-tokens", 500], "--max-alone-tokens applies to --oversize alone only"),
        (["--oversize", "alone", "--max-alone-tokens", 50], "is below --max-tokens 100"),
        (
            ["--oversize", "alone", "--max-shapes", 2],
            "--oversize alone conflicts with --max-shapes",
        ),
    ],
)
def test_bad_combinations_exit_2_one_line_nothing_written(meta, tmp_path, args, match):
    out = tmp_path / "plan"
    res = cli("plan", meta, out, "--max-tokens", 100, *args, expect=2)
    assert res.stderr.startswith("varpack: error:") and match in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_check_previews_every_choice(meta):
    res = cli("check", meta, "--max-tokens", 100)
    lines = res.stdout.splitlines()
    at = lines.index(
        "--max-tokens 100: 2 documents (1,400 tokens, 92.1% of all tokens) do not fit alone"
    )
    assert lines[at + 1 :] == [
        "  --oversize error  stops planning and names them",
        "  --oversize drop   drops 2 documents, 1,400 tokens (92.1% of all tokens)",
        "  --oversize split  splits 2 documents (1,400 tokens, 92.1%) into 14 pieces of <= 100 "
        "tokens; keeps 100%",
        "  --oversize alone  2 micro-batches alone, the largest 900 tokens (9.0 x the budget); "
        "2 above 2 x (warned), 2 above 4 x (refused by default)",
    ]
    doc = json.loads(cli("check", meta, "--max-tokens", 100, "--split-len", 30, "--json").stdout)
    assert doc["oversize"]["split"] == {
        "split_len": 30,
        "documents": 3,  # 60 > 30 too
        "pieces": 17 + 30 + 2,
        "tokens": 1460,
        "share": 1460 / 1520,
    }
    assert "every document fits" in cli("check", meta, "--max-tokens", 1000).stdout


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--split-len", "5"], "--split-len needs --max-tokens"),
        (["--max-tokens", "100", "--split-len", "101"], "--split-len 101 exceeds 100"),
    ],
)
def test_check_bad_preview_options_one_line(meta, args, match):
    proc = subprocess.run(
        [sys.executable, "-m", "varpack", "check", str(meta), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("varpack: error:") and match in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
