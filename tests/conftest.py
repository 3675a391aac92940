"""Fixtures shared by every test folder (helpers to import live in ``testkit.py``), and what makes
the whole suite fast under ``pytest -n N`` (``make test``): the heaviest modules first, numba's
kernels compiled once before the workers need them, MPI ranks that wait without spinning."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (``derandomize``), so a run of the suite
# is reproducible and CI cannot fail on a draw no one can replay; ``HYPOTHESIS_PROFILE=explore``
# draws new ones (and keeps failures in the example database) when hunting for bugs.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

HERE = Path(__file__).resolve().parent

# An MPICH rank waiting in a collective polls; with 3 or 4 ranks on 2 cores (and a second test
# worker beside them) the pollers take CPU from the ranks that work. This makes them yield it.
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
# One thread per process for torch (and Arrow's pool): the workers already fill the cores, and a
# trainer run in a worker (train.py's main in-process) would otherwise spin a second thread on
# each small op, CPU that buys no wall time. Subprocesses inherit it, as they set it themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: cost of a test, to order modules (seconds of CPU, roughly): ``slow`` runs trainers or many
#: processes, ``mpi`` launches ranks (most modules batch their cases in one job per rank
#: count), anything else is about a tenth of a second
WEIGHTS = {"slow": 10.0, "mpi": 1.0}
WARM_LOCK = "VARPACK_TEST_WARM_LOCK"
_WARM = pytest.StashKey[tuple[list[subprocess.Popen[bytes]], Path]]()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def module_weight(items: list[pytest.Item]) -> float:
    return sum(
        max([WEIGHTS[m.name] for m in item.iter_markers() if m.name in WEIGHTS], default=0.1)
        for item in items
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest modules first, each module's tests together and in their order: with
    ``--dist loadfile`` a worker that runs out takes the next module, so the run ends on light
    modules on every worker, not on a two-minute trainer test."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(modules.values(), key=module_weight, reverse=True)  # stable: ties keep order
    items[:] = [item for group in ordered for item in group]


def _kernels_cold() -> bool:
    """A clean clone, or planner sources changed since the kernels were compiled: no cache
    under the current key (``varpack.plan.numba_cache``) for the planner's basic, composing
    and CP kernels."""
    from varpack.plan.numba_cache import PLAN, cached

    found = [
        any(cached(p) for p in (PLAN / d / "__pycache__").glob(f"{m}.*.nbi"))
        for d, m in (("kernels", "pack"), ("kernels", "compose"), ("cp", "place"))
    ]
    return not all(found)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Controller of ``-n N`` in a clean clone: compile the kernels in two processes while the
    workers start and collect (``tests/warm_kernels.py``); the workers wait for them before the
    first test. A worker waits on a shared lock that the two processes hold until they end."""
    config = session.config
    xdist = getattr(config.option, "dist", "no") != "no"
    if hasattr(config, "workerinput") or not xdist or not _kernels_cold():
        return
    work = Path(tempfile.mkdtemp(prefix="varpack-warm-"))
    lock = work / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "warm_kernels.py"), str(work / part), part],
            pass_fds=(fd,),
            stdout=subprocess.DEVNULL,
        )
        for part in ("composed", "others")
    ]
    os.close(fd)  # the lock stays held until both processes end
    os.environ[WARM_LOCK] = str(lock)
    config.stash[_WARM] = (procs, work)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker waits for the warm-up (if there is one) before its first test."""
    lock = os.environ.get(WARM_LOCK)
    if lock and hasattr(session.config, "workerinput") and Path(lock).exists():
        fd = os.open(lock, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.close(fd)


def pytest_unconfigure(config: pytest.Config) -> None:
    procs, work = config.stash.get(_WARM, ([], None))
    for proc in procs:
        proc.wait()
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
