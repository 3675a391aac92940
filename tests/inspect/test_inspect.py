"""`varpack inspect`: text, JSON and the PNG plot."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from testkit import cli, write_metadata


def test_inspect_text_json_and_plot(tmp_path, rng):
    lens = rng.integers(1, 300, 2000)
    write_metadata(tmp_path / "m.parquet", np.arange(2000), lens)
    plan = tmp_path / "plan"
    cli(
        "plan",
        tmp_path / "m.parquet",
        plan,
        "--max-tokens",
        1024,
        "--dp",
        4,
        "--grad-accum",
        2,
        "--lr-scaling",
        "linear",
        "--base-batch-size",
        100,
        "--order",
        "shuffle",
    )
    text = cli("inspect", plan).stdout
    assert "time vs ideal" in text and "mixing" in text and "padding" in text
    info = json.loads(cli("inspect", plan, "--json").stdout)
    assert info["layout"]["dp"] == 4 and info["stats"]["real_tokens"] == int(lens.sum())
    assert len(info["ranks"]) == 4 and info["ranks"][0]["shapes"] >= 1
    png = tmp_path / "plan.png"
    cli("inspect", plan, "--plot", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_figures_read_with_separators_fill_and_legend(tmp_path, rng):
    lens = rng.integers(1000, 3000, 1500)
    write_metadata(tmp_path / "m.parquet", np.arange(1500), lens)
    plan = tmp_path / "plan"
    made = cli("plan", tmp_path / "m.parquet", plan, "--max-tokens", 8192, "--dp", 2)
    stats = json.loads((plan / "plan.json").read_text())["stats"]
    fill = stats["real_tokens"] / (stats["num_micro_batches"] * 8192)
    assert stats["budget_fill"] == fill
    summary, legend = made.stdout.splitlines()
    assert "1,500 samples -> " in summary and f"{int(lens.sum()):,} tokens" in summary
    assert f"budget fill {100 * fill:.1f}%" in summary
    assert legend.strip().startswith("(time vs ideal = ")
    text = cli("inspect", plan).stdout
    rows = dict(line.split("  ", 1) for line in text.splitlines() if "  " in line)
    assert rows["real tokens"].strip() == f"{int(lens.sum()):,}"
    assert "1,500 samples" in rows["input"] and "max-tokens 8,192" in rows["batching"]
    assert rows["budget fill"].strip().startswith(f"{100 * fill:.2f}% (real tokens / (micro")
    assert "(time vs ideal = estimated time (ranks wait at every micro-batch: the slowest" in text
    assert not re.search(r"\d{4}", rows["real tokens"])  # no 4 digits without a separator
    fixed = tmp_path / "fixed"
    cli("plan", tmp_path / "m.parquet", fixed, "--batching", "fixed", "--batch-size", 4, "-q")
    assert json.loads((fixed / "plan.json").read_text())["stats"]["budget_fill"] is None
    assert "n/a (no token budget)" in cli("inspect", fixed).stdout


#: what the legend says each model's estimated time sums
WAITS = {
    "micro": "(time vs ideal = estimated time (ranks wait at every micro-batch: the slowest rank "
    "of each slot (micro-batch j of a step on every rank), summed over the slots) / the ideal",
    "step": "(time vs ideal = estimated time (ranks wait once a step: the slowest rank's sum over "
    "each step, summed over the steps) / the ideal",
}


@pytest.mark.parametrize(
    "options, sync",
    [([], "micro"), (["--sync", "step"], "step"), (["--pp", 2, "--grad-accum", 4], "step")],
)
def test_the_legend_describes_the_plans_own_sync(tmp_path, rng, options, sync):
    """plan, validate and inspect explain "time vs ideal" by the model the plan was balanced
    for: a micro plan's figure is not described as one that waits once a step."""
    write_metadata(tmp_path / "m.parquet", np.arange(900), rng.integers(100, 3000, 900))
    plan = tmp_path / "plan"
    made = cli("plan", tmp_path / "m.parquet", plan, "--max-tokens", 8192, "--dp", 2, *options)
    assert json.loads((plan / "plan.json").read_text())["config"]["sync"] == sync
    (other,) = set(WAITS) - {sync}
    for out in (made.stdout, cli("validate", plan).stdout, cli("inspect", plan).stdout):
        assert WAITS[sync] in " ".join(out.split()) and WAITS[other] not in " ".join(out.split())
