"""Nonsense is refused, not turned into output: a memory capacity that holds no token, a
trainer told to take no step, counts below what they can mean, and sizes that files declare
but do not hold (see also test_inputs.py for footers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import cli

from varpack.errors import InputError
from varpack.plan.calibrate import bucket_size

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def steps_csv(tmp_path: Path) -> Path:
    path = tmp_path / "steps.csv"
    rows = ["tokens,peak_memory"] + [f"{t},{1_000_000 + 250 * t}" for t in (1000, 2000, 4000, 8000)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("capacity", [1, 1_000, 1_000_000])
def test_a_capacity_that_holds_no_token_is_refused(
    tmp_path: Path, steps_csv: Path, capacity: int
) -> None:
    out = tmp_path / "calib.json"
    result = cli("calibrate", steps_csv, out, "--memory-capacity", capacity, expect=2)
    assert "leaves no room for a token" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_the_bucket_is_positive_and_bounded(tmp_path: Path, steps_csv: Path) -> None:
    out = tmp_path / "calib.json"
    cli("calibrate", steps_csv, out, "--memory-capacity", 1_000_000 + 250 * 100)
    assert json.loads(out.read_text())["bucket_size"] == 100
    assert bucket_size(2**62, 1e-9, 0.0) == 2**31 - 1  # a plan holds int32 lengths
    with pytest.raises(InputError):
        bucket_size(10, 1.0, 10.0)


def _train_args(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    cmd = [sys.executable, str(ROOT / "jobs" / "train.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-steps", "0"),
        ("--max-steps", "-3"),
        ("--workers", "-1"),
        ("--log-every", "0"),
        ("--ckpt-every", "-1"),
        ("--warmup-steps", "-1"),
        ("--cp", "0"),
        ("--vocab-size", "0"),
        ("--lr", "0"),
        ("--lr", "nan"),
        ("--lr", "inf"),
        ("--max-steps", "two"),
    ],
)
def test_the_trainer_refuses_counts_that_mean_nothing(
    tmp_path: Path, flag: str, value: str
) -> None:
    pytest.importorskip("torch")
    args = ["--plan", tmp_path / "p", "--data", tmp_path / "d", "--out", tmp_path / "o"]
    proc = _train_args(*args, flag, value)
    assert proc.returncode == 2, proc.stderr
    assert f"argument {flag}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was made
