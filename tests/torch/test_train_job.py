"""jobs/train.py as a job: launched by srun alone (Slurm variables, no torchrun) it trains as
under torchrun; --steps / --max-steps; metrics.jsonl; a user error in one line; Ctrl-C stops
every rank after the same step, saves, says so once, and --resume goes on from there.

torchrun itself prints a traceback and a failure block whenever a worker exits non-zero, and a
traceback on Ctrl-C (torch 2.13; ``varpack.torch.torchrun`` explains why): the tests check that
no rank adds one, and that ``python -m varpack.torch.torchrun`` leaves torchrun's out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

from plan_helpers import random_lengths, ranks, torchrun, write_tokens  # noqa: E402
from testkit import cli, write_metadata  # noqa: E402
from warm_start import warm_start  # noqa: E402

from varpack.torch.records import Records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jobs" / "train.py"
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("SLURM_", "TORCHELASTIC_"))}  # fmt: skip
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath, **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def srun(ntasks: int, *args: object) -> list[subprocess.CompletedProcess[str]]:
    """What ``srun --ntasks N python jobs/train.py ...`` starts: N processes that know only
    their SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID (no torchrun variables); forked from a
    process that imported train.py already (``warm_start``: seconds of CPU a process)."""
    port = str(_free_port())
    server = warm_start(TRAIN, _env())
    procs = [
        server.start(TRAIN, [str(a) for a in args], _env(SLURM_PROCID=str(r),
                     SLURM_NTASKS=str(ntasks), SLURM_LOCALID=str(r), MASTER_PORT=port), ROOT)
        for r in range(ntasks)
    ]  # fmt: skip
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rc={p.returncode}\n{out}\n{err[-3000:]}"
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def launcher(*args: object) -> subprocess.Popen[str]:
    """``python -m varpack.torch.torchrun --standalone --nproc-per-node 2 jobs/train.py ...`` in
    a session of its own (as a terminal's foreground job: Ctrl-C reaches the launcher)."""
    cmd = [sys.executable, "-m", "varpack.torch.torchrun", "--standalone", "--nproc-per-node=2",
           str(TRAIN), *map(str, args)]  # fmt: skip
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, start_new_session=True)  # fmt: skip


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("job")
    lens = random_lengths(np.random.default_rng(7), 400, 2, 40)
    write_tokens(tmp / "tok.parquet", list(lens), list(lens.values()), row_group_size=64)
    write_metadata(tmp / "meta" / "m.parquet", list(lens), list(lens.values()))
    cli("plan", tmp / "meta", tmp / "plan", "--dp", 2, "--grad-accum", 2, "--max-tokens", 96,
        "--pad-multiple", 16, "--order", "shuffle", "--seed", 3, "-q")  # fmt: skip
    return tmp


def test_srun_tasks_train_as_torchrun_ranks(data: Path) -> None:
    common = ["--plan", data / "plan", "--data", data / "tok.parquet", "--warmup-steps", "2"]
    ranks(
        2, TRAIN, *common, "--out", data / "torchrun", "--max-steps", 4
    )  # as torchrun starts them
    first = srun(2, *common, "--out", data / "srun", "--steps", 2)
    assert "step     1" in first[0].stdout and not first[1].stdout  # rank 0 logs
    # a --sync micro plan under DDP: one note per run (rank 0), not one per step
    assert first[0].stdout.count("[train] note: ") == 1 and "(--sync micro)" in first[0].stdout
    # resumed: 5 more steps asked, but --max-steps 4 (steps in all) comes first
    rest = srun(2, *common, "--out", data / "srun", "--resume", "--steps", 5, "--max-steps", 4)
    assert "resumed after step 2 (2 of the plan's" in rest[0].stdout
    want, got = _metrics(data / "torchrun"), _metrics(data / "srun")
    assert [m["step"] for m in got] == [1, 2, 3, 4] == [m["step"] for m in want]
    assert set(got[0]) == {"step", "epoch", "plan_step", "loss", "tokens", "lr", "step_time_s"}
    for a, b in zip(want, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert (b["tokens"], b["lr"]) == (a["tokens"], a["lr"]) and b["step_time_s"] > 0


def test_a_user_error_is_one_line_per_job(data: Path) -> None:
    args = ["--plan", data / "plan", "--data", data / "tok.parquet", "--vocab-size", 10]
    plain = torchrun(2, TRAIN, *args, "--out", data / "bad", check=False)
    said = [x for x in plain.stderr.splitlines() if x.startswith("varpack: error: ")]
    assert plain.returncode != 0 and len(said) == 1, plain.stderr  # once, not once per rank
    assert "the model's vocabulary has 10 entries" in said[0]
    # torchrun's own traceback and block stay (nothing a worker does removes them); the block
    # names the error (the worker's torchelastic error file) instead of a link to its docs
    assert plain.stderr.count("Traceback") == 1 and "ChildFailedError" in plain.stderr
    assert f"traceback : {said[0]}" in plain.stderr and "[rank" not in plain.stderr
    with launcher(*args, "--out", data / "bad") as proc:
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and out.splitlines() == said, out
    assert not (data / "bad" / "checkpoint.pt").exists()


def test_the_run_never_writes_into_its_inputs(data: Path) -> None:
    before = sorted(p.name for p in (data / "plan").iterdir())
    for out in (data / "plan", data / "plan" / "run"):
        args = ["--plan", data / "plan", "--data", data / "tok.parquet", "--out", out,
                "--max-steps", "1"]  # fmt: skip
        with warm_start(TRAIN, _env()).start(TRAIN, list(map(str, args)), _env(), ROOT) as run:
            _, err = run.communicate(timeout=300)
        assert run.returncode == 2 and "lies inside the input" in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in (data / "plan").iterdir()) == before


def _interrupt(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C to the launcher's process group once the first step is logged; all it printed."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[train] step" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=300)
    return "".join(lines) + rest


def test_ctrl_c_stops_every_rank_saves_and_resumes(data: Path) -> None:
    run = data / "ctrl-c"
    args = ["--plan", data / "plan", "--data", data / "tok.parquet", "--out", run,
            "--preset", "small", "--record"]  # fmt: skip
    with launcher(*args) as proc:
        out = _interrupt(proc)
    assert proc.returncode == 128 + signal.SIGINT, out
    stopped = [x for x in out.splitlines() if "interrupted" in x]
    assert len(stopped) == 1 and "Traceback" not in out, out
    assert stopped[0].startswith("[train] interrupted (SIGINT) after step ")
    assert f"saved {run / 'checkpoint.pt'}; resume with --resume" in stopped[0]
    step = int(stopped[0].split(" after step ")[1].split()[0])
    records = Records(run).read()
    assert [r["steps_done"] for r in records] == [step, step]  # every rank after the same step
    assert [m["step"] for m in _metrics(run)] == list(range(1, step + 1))

    resumed = ranks(2, TRAIN, *args, "--resume", "--steps", 2)
    assert f"resumed after step {step} ({step} of the plan's" in resumed.stdout
    assert [m["step"] for m in _metrics(run)] == list(range(1, step + 3))
    # plain torchrun: each rank stops cleanly and says nothing more; torchrun's own traceback
    # (SignalException) is the only one
    with subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(TRAIN), *map(str, args), "--resume"], env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
    ) as plain:  # fmt: skip
        out = _interrupt(plain)
    assert len([x for x in out.splitlines() if "interrupted (SIGINT)" in x]) == 1, out
    assert out.count("Traceback") == 1 and "SignalException" in out and "[rank" not in out, out
