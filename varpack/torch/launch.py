"""Where this process sits in a distributed job, read from its launcher (torchrun or srun).

:func:`launch_env` is the one place that reads the launcher's environment: ``torchrun``'s
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` when they are set, else Slurm's ``SLURM_PROCID``,
``SLURM_NTASKS`` and ``SLURM_LOCALID`` (one ``srun`` task per rank, no torchrun), else one
process. :class:`~varpack.torch.loader.PlanLoader` and ``jobs/train.py`` both use it.
:func:`export_torch_env` gives a Slurm task what ``init_process_group("env://")`` reads: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` (the first host of the step, 127.0.0.1 on one
node) and ``MASTER_PORT`` (from the job id), each only where not set already.

A Slurm job's batch script (or an ``salloc`` shell) has ``SLURM_PROCID=0`` and the allocation's
``SLURM_NTASKS`` too, but it is not a task of a step: where ``SLURM_JOB_ID`` is set and
``SLURM_STEP_NUM_TASKS`` (set by ``srun`` only) is not, the Slurm variables are not read, so a
plain ``python jobs/train.py`` there runs as one process instead of waiting for peers. A task of
a step counts the step's tasks (``SLURM_STEP_NUM_TASKS``), not the allocation's.

Nothing here waits: an environment that cannot make a job (a rank outside the world, ``RANK``
without ``WORLD_SIZE``, a local rank beyond its global one or its node, ``MASTER_ADDR`` missing
for an ``env://`` rendezvous, more tasks on a node than it shows GPUs) is a
:class:`LaunchError` before any rendezvous, never a wait for peers that cannot come.

:func:`record_error` writes a worker's one-line error to torchelastic's error file, so that
torchrun's failure block names it (``varpack.torch.torchrun`` leaves the block out).

Imports: ``varpack.errors`` only (no torch).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from typing import NamedTuple

from varpack.errors import ConfigError, env_int


class LaunchError(ConfigError):
    """A launch environment that cannot make a job. ``own``: it is about this process alone (its
    rank, its device), so this process says it; else every rank has it and rank 0 alone says it."""

    def __init__(self, message: str, own: bool = False) -> None:
        super().__init__(message)
        self.own = own


class LaunchEnv(NamedTuple):
    """This process's global rank, the world size and its rank on this node, and who said so."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" (RANK/WORLD_SIZE), "slurm" (srun tasks) or "none"


def _has(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def launch_env() -> LaunchEnv:
    """``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun), else ``SLURM_PROCID``/``SLURM_NTASKS``
    /``SLURM_LOCALID`` (srun), else rank 0 of 1; a non-integer is one line naming the variable,
    an inconsistent set a :class:`LaunchError`."""
    if _has("RANK") or _has("WORLD_SIZE"):
        given, missing = ("RANK", "WORLD_SIZE") if _has("RANK") else ("WORLD_SIZE", "RANK")
        if not _has(missing):
            raise LaunchError(
                f"environment variable {given} is set but {missing} is not: a launcher sets both "
                f"(torchrun does); set {missing} too, or unset {given} to run one process"
            )
        rank, world = env_int("RANK", 0), env_int("WORLD_SIZE", 1, low=1)
        env = LaunchEnv(rank, world, env_int("LOCAL_RANK", 0), "torchrun")
        return _checked(env, ("RANK", "WORLD_SIZE", "LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE", 0))
    srun_task = not _has("SLURM_JOB_ID") or _has("SLURM_STEP_NUM_TASKS")
    if _has("SLURM_PROCID") and _has("SLURM_NTASKS") and srun_task:
        tasks = "SLURM_STEP_NUM_TASKS" if _has("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
        rank, world = env_int("SLURM_PROCID", 0), env_int(tasks, 1, low=1)
        env = LaunchEnv(rank, world, env_int("SLURM_LOCALID", 0), "slurm")
        return _checked(env, ("SLURM_PROCID", tasks, "SLURM_LOCALID"), 0)
    return LaunchEnv(0, 1, 0, "none")


def _checked(env: LaunchEnv, names: tuple[str, str, str], local_world: int) -> LaunchEnv:
    """``env`` if its numbers can make a job: rank < world, local rank <= rank (ranks are
    numbered node by node) and < the node's ranks where the launcher says how many."""
    rank, world, local = names
    fix = (
        "launch with torchrun, which sets them, or unset them"
        if env.launcher == "torchrun"
        else "launch the tasks with srun, which sets them, or unset them"
    )
    if env.rank >= env.world_size:
        raise LaunchError(
            f"{rank}={env.rank} is not below {world}={env.world_size} (the ranks are 0 .. "
            f"{env.world_size - 1}); {fix}",
            own=True,
        )
    if env.local_rank > env.rank or (local_world and env.local_rank >= local_world):
        bound = f"LOCAL_WORLD_SIZE={local_world}" if local_world else f"{rank}={env.rank}"
        raise LaunchError(
            f"{local}={env.local_rank} does not fit {bound}: a local rank counts the ranks on "
            f"its node; {fix}",
            own=True,
        )
    return env


def best_rank() -> int:
    """This process's rank as its launcher says it, 0 where that is unreadable: who speaks for
    the job when the launch environment itself is wrong."""
    for name in ("RANK", "SLURM_PROCID"):
        text = os.environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return 0


def rendezvous(env: LaunchEnv) -> tuple[str, int]:
    """Where the ranks of ``env`` meet (``init_process_group("env://")`` reads these): refused
    before any wait when the environment does not say. Under srun they are set here (see
    :func:`export_torch_env`)."""
    if env.world_size > 1 and not (_has("MASTER_ADDR") and _has("MASTER_PORT")):
        unset = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not _has(n)]
        raise LaunchError(
            f"WORLD_SIZE={env.world_size} but {' and '.join(unset)} "
            f"{'is' if len(unset) == 1 else 'are'} not set: the ranks would not know where "
            "to meet; launch with torchrun (or srun alone), or export MASTER_ADDR (rank 0's host) "
            "and MASTER_PORT"
        )
    port = env_int("MASTER_PORT", 29500, low=1)
    if port > 65535:
        raise LaunchError(f"MASTER_PORT={port} is not a port (1..65535); export another one")
    return os.environ.get("MASTER_ADDR", "127.0.0.1").strip(), port


def cuda_index(local_rank: int, devices: int) -> int:
    """The GPU this process takes among the ``devices`` it sees: its local rank, or 0 where it
    sees one (``srun --gpus-per-task 1``); more local ranks than GPUs would share one.

    >>> cuda_index(3, 8), cuda_index(3, 1)
    (3, 0)
    """
    if local_rank < devices:
        return local_rank
    if devices == 1:
        return 0
    raise LaunchError(
        f"local rank {local_rank} but this node shows {devices} GPUs: two ranks would share one; "
        "launch one task per GPU (srun --ntasks-per-node or torchrun --nproc-per-node = GPUs "
        "per node, or srun --gpus-per-task 1)",
        own=True,
    )


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (``scontrol show hostnames`` where there is one).

    >>> first_host("gpu[007-012,020],cpu3")
    'gpu007'
    >>> first_host("node-a,node-b")
    'node-a'
    """
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.split()  # fmt: skip
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    m = re.match(r"([^,\[]*)(?:\[(\d+)[^\]]*\])?([^,]*)", nodelist.strip())
    return "".join(g or "" for g in m.groups()) if m else nodelist


def _nodes() -> str:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if _has(name):
            return os.environ[name].strip()
    return ""


def master_addr() -> str:
    """``MASTER_ADDR``, else the host of task 0 (the first of the step's nodes; 127.0.0.1 when
    the step has one node or Slurm does not say)."""
    if _has("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"].strip()
    nodes = _nodes()
    one_node = env_int("SLURM_STEP_NUM_NODES", env_int("SLURM_NNODES", 1, low=1), low=1) == 1
    if not nodes or one_node or ("," not in nodes and "[" not in nodes):
        return "127.0.0.1"
    return first_host(nodes)


def master_port() -> int:
    """``MASTER_PORT``, else one derived from ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` (10000 to
    29999: every task of a step agrees without talking; jobs sharing a node rarely collide),
    else torch's 29500."""
    if _has("MASTER_PORT"):
        return env_int("MASTER_PORT", 29500, low=1)
    if not _has("SLURM_JOB_ID"):
        return 29500
    job, step = env_int("SLURM_JOB_ID", 0), env_int("SLURM_STEP_ID", 0)
    return 10000 + (job % 2000) * 10 + step % 10


def export_torch_env(env: LaunchEnv) -> None:
    """Under srun alone, set what torch's ``env://`` rendezvous reads (unless already set)."""
    if env.launcher != "slurm":
        return
    os.environ.setdefault("RANK", str(env.rank))
    os.environ.setdefault("WORLD_SIZE", str(env.world_size))
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
    if env.world_size > 1:
        os.environ["MASTER_ADDR"] = master_addr()
        os.environ["MASTER_PORT"] = str(master_port())


def record_error(message: str) -> None:
    """Write a one-line error where torchelastic reads a failed worker's reason
    (``TORCHELASTIC_ERROR_FILE``, set by torchrun): its failure block then shows this line
    instead of a link to its docs. Nothing happens outside torchrun."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        pass
