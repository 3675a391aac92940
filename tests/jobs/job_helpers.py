"""Running jobs/train.py as the processes a launcher starts: the data, the environment of one
task, and reading what it said."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

from testkit import cli
from warm_start import Rank, warm_start

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jobs" / "train.py"
#: the launcher variables a test starts without (it sets the ones it means)
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def make_data(tmp: Path, *plans: tuple[str, int], pattern: str = "count") -> Path:
    """A small tokenized dataset (``varpack synth --tokenized``, vocabulary 256: the tiny
    preset's) and one plan per ``(name, dp)``, made by the CLI."""
    cli("synth", tmp / "tok", "--tokenized", "--pattern", pattern, "--dist", "uniform",
        "--min-len", 8, "--max-len", 48, "-n", 240, "--vocab-size", 256, "--shards", 1, "-q")  # fmt: skip
    cli("lengths", tmp / "tok", tmp / "meta", "--arrow-copy", tmp / "tok.arrow", "-q")
    for name, dp in plans:
        cli("plan", tmp / "meta", tmp / name, "--dp", dp, "--grad-accum", 2, "--max-tokens", 96,
            "--order", "shuffle", "--seed", 3, "-q")  # fmt: skip
    return tmp


def env(**extra: object) -> dict[str, str]:
    """This environment without any launcher's variables, one thread, this checkout first."""
    out = {k: v for k, v in os.environ.items()
           if k not in LAUNCH and not k.startswith(("SLURM_", "TORCHELASTIC_"))}  # fmt: skip
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    out.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)
    out.update({k: str(v) for k, v in extra.items()})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: object, **variables: object) -> Rank:
    """``python jobs/train.py ARGS`` with these launcher variables, in a session of its own,
    stdout and stderr piped: forked from a process that imported train.py already (its imports
    are seconds of CPU a process; ``warm_start``)."""
    return warm_start(TRAIN, env()).start(TRAIN, [str(a) for a in args], env(**variables), ROOT)


def srun_tasks(ntasks: int, *args: object) -> list[Rank]:
    """What ``srun --ntasks N python jobs/train.py ARGS`` starts: N tasks that know only their
    SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID (and a free port to meet on)."""
    port = free_port()
    return [start(*args, SLURM_PROCID=r, SLURM_NTASKS=ntasks, SLURM_LOCALID=r, MASTER_PORT=port)
            for r in range(ntasks)]  # fmt: skip


def finish(proc: Rank, timeout: float = 300) -> tuple[int, str, str]:
    """Its exit code, stdout and stderr; killed (with its children) if it outlives ``timeout``:
    a hang fails the test instead of stalling it."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout}s\n{out}\n{err[-3000:]}") from None
    return proc.returncode, out, err


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
