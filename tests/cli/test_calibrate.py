"""varpack calibrate: the memory and time models recovered from measured rows; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from testkit import cli

from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_flops
from varpack.plan.models import PRESETS


def _csv(path: Path, rows: list[tuple[float, ...]], header: str) -> Path:
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


def test_recovers_a_and_b_and_plans_with_them(tmp_path):
    tokens = np.array([512, 1024, 2048, 3000, 4096, 6000, 8192, 12000])
    flops = sample_flops(tokens, PRESETS["qwen2.5-0.5b"])
    rows = [(t, 3000 * t + 7e6, 2e-13 * f + 0.05) for t, f in zip(tokens, flops, strict=True)]
    src = _csv(tmp_path / "steps.csv", rows, "tokens,peak_memory,step_time")
    out = tmp_path / "calib.json"
    res = cli("calibrate", src, out, "--model-preset", "qwen2.5-0.5b", "--memory-capacity",
              str(10**9), "--holdout", "3")  # fmt: skip
    assert "bucket size" in res.stdout
    got = json.loads(out.read_text())
    assert got["memory_per_token"] == pytest.approx(3000) and got["memory_fixed"] == pytest.approx(
        7e6
    )
    assert got["time_per_flop"] == pytest.approx(2e-13) and got["time_fixed"] == pytest.approx(0.05)
    assert got["held_out"] == 2 and got["time_error_held_out"]["max_pct"] < 1e-6
    assert abs(got["bucket_size"] - (10**9 - 7_000_000) // 3000) <= 1  # float fit
    cfg = PlanConfig(
        cp=2, cost="time", model_preset="qwen2.5-0.5b", memory_capacity=10**9,
        **{k: got[k] for k in ("memory_per_token", "memory_fixed", "time_per_flop", "time_fixed")},
    ).resolved()  # fmt: skip
    assert cfg.bucket() == got["bucket_size"] and cfg.max_tokens == 2 * got["bucket_size"]


def test_flops_column_and_memory_only(tmp_path):
    src = _csv(tmp_path / "a.csv", [(100, 1000, 2.0, 10), (200, 2000, 4.0, 20)],
               "tokens,peak_memory,step_time,flops")  # fmt: skip
    cli("calibrate", src, tmp_path / "o.json")
    got = json.loads((tmp_path / "o.json").read_text())
    assert got["time_per_flop"] == pytest.approx(0.2) and got["memory_per_token"] == pytest.approx(
        10
    )
    mem = _csv(tmp_path / "m.csv", [(100, 1000), (300, 2000)], "tokens,peak_memory")
    cli("calibrate", mem, tmp_path / "m.json")
    assert "time_per_flop" not in json.loads((tmp_path / "m.json").read_text())


@pytest.mark.parametrize(
    ("header", "rows", "extra", "message"),
    [
        ("size,peak_memory", [(1, 2), (2, 3)], [], "no 'tokens' column"),
        ("tokens,peak_memory", [(1, "x"), (2, 3)], [], ":2: peak_memory 'x' is not a number"),
        ("tokens,peak_memory", [(1, 5), (1, 6)], [], "at least two different sizes"),
        ("tokens,peak_memory", [(1, 9), (2, 5)], [], "does not grow with the work"),
        ("tokens,step_time", [(1, 9), (2, 5)], [], "step_time needs a flops column"),
        ("tokens,step_time", [(1, 9), (2, 5)], ["--hidden", "8"], "give all of --hidden"),
        ("tokens,peak_memory", [(1, -1), (2, 5)], [], "must be finite and >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, header, rows, extra, message):
    src = _csv(tmp_path / "a.csv", rows, header)
    res = cli("calibrate", src, tmp_path / "o.json", *extra, expect=2)
    assert message in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_output_kept_apart(tmp_path):
    src = _csv(tmp_path / "a.csv", [(100, 1000), (300, 2000)], "tokens,peak_memory")
    (tmp_path / "o.json").write_text("{}")
    assert "exists" in cli("calibrate", src, tmp_path / "o.json", expect=2).stderr
    cli("calibrate", src, src, expect=2)
    assert src.read_text().startswith("tokens")
