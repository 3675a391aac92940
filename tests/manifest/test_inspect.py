"""`varpack inspect`: text, JSON and the PNG plot."""

from __future__ import annotations

import json

import numpy as np
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
