"""The Slurm scripts in jobs/: valid bash, and the steps they launch (``srun`` replaced by a stub
that records its arguments), including the stage options and the automatic ``--resume``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "jobs").glob("*.slurm"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_is_valid_bash(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _dry_run(tmp_path: Path, script: str, *args: object) -> list[str]:
    """Run a jobs/*.slurm script as sbatch would (2 tasks), with a stub srun: its steps."""
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir(exist_ok=True)
    log = tmp_path / "srun.log"
    stub.write_text(f'#!/bin/bash\necho "$*" >> {log}\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
               SLURM_NTASKS="2", SLURM_JOB_ID="77")  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "jobs" / script), *map(str, args)], env=env,
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = log.read_text().splitlines()
    log.unlink()
    return steps


def test_the_flow_runs_each_stage_once_with_its_options(tmp_path: Path) -> None:
    work = tmp_path / "work"
    steps = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 64, "--", "--steps", 3)
    assert [s.split()[2:4] if s.startswith("--ntasks=1") else s.split()[:2] for s in steps] == [
        ["varpack", "lengths"],
        ["--mpi=pmix", "python"],
        ["varpack", "plan"],
        ["varpack", "validate"],
        ["--kill-on-bad-exit=1", "python"],
    ]
    assert f"lengths tok/ {work}/meta --arrow-copy {work}/tokens.arrow" in steps[0]
    assert "-m varpack sort" in steps[1]
    assert steps[2].endswith(f"plan {work}/sorted {work}/plan --dp 2 --max-tokens 64")
    assert steps[4].endswith(f"--out {work}/run --steps 3") and "--resume" not in steps[4]
    for stage in ("meta", "sorted", "plan", "run"):  # the stages done: a second job trains on
        (work / stage).mkdir(parents=True, exist_ok=True)
    (work / "run" / "checkpoint.pt").write_bytes(b"")
    again = _dry_run(tmp_path, "flow.slurm", "tok/", work)
    assert len(again) == 1 and again[0].endswith(f"--out {work}/run --resume")


def test_train_slurm_resumes_when_out_holds_a_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (step,) = _dry_run(tmp_path, "train.slurm", "plan/", "tok.arrow", out, "--log-every", 10)
    assert step == (f"--kill-on-bad-exit=1 python jobs/train.py --plan plan/ --data tok.arrow "
                    f"--out {out} --log-every 10")  # fmt: skip
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    (step,) = _dry_run(tmp_path, "train.slurm", "plan/", "tok.arrow", out)
    assert step.endswith(f"--out {out} --resume")
