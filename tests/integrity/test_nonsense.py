"""Nonsense is refused, not turned into output: a memory capacity that holds no token, fitted
figures a plan would refuse, a trainer told to take no step and counts below what they can mean
(footers declaring rows they do not hold: test_inputs.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize(
    ("rows", "flags", "says"),
    [
        ([(1000, 1e30), (2000, 2e30)], [], "beyond what a plan accepts"),
        ([(1000, 5), (2000, 9), (3000, 13)], ["--holdout", 1], "leaves 0 of 3 rows to fit"),
        ([(1000, 5), (2000, 9)], ["--holdout", 2], "leaves 1 of 2 rows to fit"),
    ],
)
def test_calibrate_refuses_figures_a_plan_would_refuse(
    tmp_path: Path, rows: list[tuple[float, float]], flags: list[object], says: str
) -> None:
    path = tmp_path / "steps.csv"
    path.write_text("tokens,peak_memory\n" + "".join(f"{t},{m}\n" for t, m in rows))
    result = cli("calibrate", path, tmp_path / "c.json", *flags, expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]  # no numpy warnings either
    assert not (tmp_path / "c.json").exists()


def test_a_time_model_a_plan_would_refuse_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    path.write_text("tokens,step_time\n1000,1e30\n2000,2e30\n4000,4e30\n")
    flags = ["--model-preset", "qwen2.5-0.5b"]
    result = cli("calibrate", path, tmp_path / "c.json", *flags, expect=2)
    assert "step time fit gives" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "c.json").exists()


def _trainer() -> Any:
    """jobs/train.py as a module, to parse its options in this process."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("varpack_train_job", ROOT / "jobs" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        ("--seed", "-1"),
        ("--seed", str(2**64)),
    ],
)
def test_the_trainer_refuses_counts_that_mean_nothing(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    args = ["--plan", "p", "--data", "d", "--out", "o", flag, value]
    with pytest.raises(SystemExit) as info:
        _trainer().parse_args(args)
    assert info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_the_trainer_takes_no_step_for_max_steps_0(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    args = ["--plan", tmp_path / "p", "--data", tmp_path / "d", "--out", tmp_path / "o"]
    cmd = [sys.executable, str(ROOT / "jobs" / "train.py"), *map(str, args), "--max-steps", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 2 and "argument --max-steps: 0 is below 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was made
