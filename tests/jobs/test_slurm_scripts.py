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


#: a stub srun: records its arguments; makes the output a varpack command names (its second
#: argument after the subcommand, and --arrow-copy's); fails where $FAIL_ON is in the command
STUB = r"""#!/bin/bash
echo "$*" >> "$SRUN_LOG"
if [ -n "${FAIL_ON:-}" ] && [[ "$*" == *"$FAIL_ON"* ]]; then exit 1; fi
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    lengths | sort | plan) mkdir -p "${args[$((i + 2))]}"; break ;;
  esac
done
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = --arrow-copy ]; then touch "${args[$((i + 1))]}"; fi
done
"""


def _submit(tmp_path: Path, script: str, *args: object, tasks: int = 2, expect: int = 0,
            **env: str) -> tuple[list[str], str]:  # fmt: skip
    """Run a jobs/*.slurm script as sbatch would (``tasks`` tasks), with a stub srun: the steps
    it launched, and its stderr."""
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir(exist_ok=True)
    log = tmp_path / "srun.log"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
               SLURM_NTASKS=str(tasks), SLURM_JOB_ID="77", SRUN_LOG=str(log), **env)  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "jobs" / script), *map(str, args)], env=env,
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == expect, proc.stderr
    steps = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return steps, proc.stderr


def _dry_run(tmp_path: Path, script: str, *args: object) -> list[str]:
    return _submit(tmp_path, script, *args)[0]


def _stages(steps: list[str]) -> list[str]:
    """Each launched step's stage: lengths, sort, plan, validate or train."""
    names = ("lengths", "sort", "plan", "validate", "train.py")
    return [next(n for n in names if f" {n} " in f" {s} ".replace("jobs/", "")) for s in steps]


def test_the_flow_runs_each_stage_once_with_its_options(tmp_path: Path) -> None:
    work = tmp_path / "work"
    steps = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 64, "lengths:",
                     "--keep", "source", "validate:", "--replay", "plan:", "--seed", 3, "--",
                     "--steps", 3, "lengths:")  # fmt: skip
    assert [s.split()[2:4] if s.startswith("--ntasks=1") else s.split()[:2] for s in steps] == [
        ["varpack", "lengths"],
        ["--mpi=pmix", "python"],
        ["varpack", "plan"],
        ["varpack", "validate"],
        ["--kill-on-bad-exit=1", "python"],
    ]
    assert steps[0].endswith(f"lengths tok/ {work}/meta --arrow-copy {work}/tokens.arrow --keep "
                             "source")  # fmt: skip
    assert steps[1].endswith(f"-m varpack sort {work}/meta {work}/sorted")
    assert steps[2].endswith(f"plan {work}/sorted {work}/plan --dp 2 --max-tokens 64 --seed 3")
    assert steps[3].endswith(f"validate {work}/plan --metadata {work}/meta --replay")
    assert steps[4].endswith(f"--out {work}/run --steps 3 lengths:") and "--resume" not in steps[4]
    (work / "run").mkdir()
    (work / "run" / "checkpoint.pt").write_bytes(b"")
    again = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 64, "lengths:", "--keep",
                     "source", "validate:", "--replay", "plan:", "--seed", 3)  # fmt: skip
    assert len(again) == 1 and again[0].endswith(f"--out {work}/run --resume")
    assert _dry_run(tmp_path, "sort.slurm", "m/", "s/") == [
        "--mpi=pmix python -m mpi4py jobs/sort_metadata.py m/ s/"
    ]


def test_a_resubmitted_flow_runs_again_what_its_options_change(tmp_path: Path) -> None:
    work = tmp_path / "work"
    plan = ["tok/", work, "--max-tokens", 64]
    assert _stages(_dry_run(tmp_path, "flow.slurm", *plan)) == [
        "lengths", "sort", "plan", "validate", "train.py"]  # fmt: skip
    assert _stages(_dry_run(tmp_path, "flow.slurm", *plan)) == ["train.py"]  # the same: reused
    # another plan option: the plan is made again over the old one, the sort is kept
    steps = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 128)
    assert _stages(steps) == ["plan", "validate", "train.py"]
    assert steps[0].endswith("--max-tokens 128 --overwrite") and "--resume" not in steps[2]
    # validate's own options: the plan stays
    steps = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 128, "validate:", "-h")
    assert _stages(steps) == ["validate", "train.py"]
    # a lengths option: every stage after it runs again, each over its old output
    steps = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 128, "lengths:",
                     "--keep", "source")  # fmt: skip
    assert _stages(steps) == ["lengths", "sort", "plan", "validate", "train.py"]
    assert all(s.endswith("--overwrite") for s in steps[:3])
    # a stage that fails is not recorded: the next submission runs it again
    _submit(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 96, expect=1, FAIL_ON="plan")
    assert _stages(_dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 96)) == [
        "plan", "validate", "train.py"]  # fmt: skip


def test_a_flow_never_makes_the_plan_again_under_a_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 64)
    (work / "run").mkdir()
    (work / "run" / "checkpoint.pt").write_bytes(b"")
    for args, tasks in ((["--max-tokens", 128], 2), (["--max-tokens", 64], 4),
                        (["--max-tokens", 64, "sort:", "--key", "seq_len"], 2)):  # fmt: skip
        steps, err = _submit(tmp_path, "flow.slurm", "tok/", work, *args, tasks=tasks, expect=2)
        assert steps == [] and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"flow.slurm: error: {work}/plan would be made again")
        assert "holds a checkpoint" in err and "varpack replan" in err
    (step,) = _dry_run(tmp_path, "flow.slurm", "tok/", work, "--max-tokens", 64)
    assert step.endswith("--resume")  # the options that made the plan: the run goes on


def test_train_slurm_resumes_when_out_holds_a_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (step,) = _dry_run(tmp_path, "train.slurm", "plan/", "tok.arrow", out, "--log-every", 10)
    assert step == (f"--kill-on-bad-exit=1 python jobs/train.py --plan plan/ --data tok.arrow "
                    f"--out {out} --log-every 10")  # fmt: skip
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    (step,) = _dry_run(tmp_path, "train.slurm", "plan/", "tok.arrow", out)
    assert step.endswith(f"--out {out} --resume")
