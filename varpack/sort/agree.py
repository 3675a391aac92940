"""MPI agreement shared by the commands that run on several ranks: ``sort``, ``validate``,
``inspect``.

Whether a command runs under MPI (:func:`launched`, :func:`world`: started as ``python -m
mpi4py``, or with ``mpi4py.MPI`` already imported, on more than one rank), how a rank's local
work is caught (:func:`caught`: a user error, an environment error or a bug), how every rank
learns that one failed (:func:`agree`: the error of the first failing rank, raised on all of
them as :class:`Agreed`), and how every rank then leaves with one exit code
(:func:`agreed_exit`, :func:`abort_quietly`) without leaving MPI's shared memory behind
(:func:`unlink_shared_memory`). The sort's :class:`~varpack.sort.job.Job` adds its own failure
report on top (the failing rank names itself; rank 0 removes the temporary output).

Nothing here imports mpi4py at module level: a one-process command never loads it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from varpack.errors import VarpackError

T = TypeVar("T")

#: where launchers give the number of ranks, the first set one counts (MPICH's mpiexec and
#: srun with PMI, Open MPI, then a Slurm step)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def launched() -> bool:
    """This process was started for MPI: ``python -m mpi4py ...``, or MPI is already loaded on
    more than one rank (how ``varpack sort`` decides to end its ranks together)."""
    mpi = sys.modules.get("mpi4py.MPI")
    return "mpi4py.run" in sys.modules or (mpi is not None and mpi.COMM_WORLD.Get_size() > 1)


def world() -> Any | None:
    """``COMM_WORLD`` when this process is one of several MPI ranks, else ``None``.

    A plain process (no ``python -m mpi4py``) never imports mpi4py; neither does a launcher
    that says it started one rank. Otherwise MPI is initialised and asked its size."""
    if "mpi4py.run" not in sys.modules and "mpi4py.MPI" not in sys.modules:
        return None
    sizes = [text for name in _SIZE_VARS if (text := os.environ.get(name, "").strip())]
    if sizes[:1] == ["1"] and "mpi4py.MPI" not in sys.modules:
        return None
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


class Bug(Exception):
    """Not a user error: a traceback, already printed by the rank that raised it."""


def caught(
    fn: Callable[[], T], os_error: Callable[[OSError], VarpackError] | None = None
) -> tuple[T | None, BaseException | None]:
    """Run ``fn``; return ``(result, None)``, or ``(None, error)`` for a user error (a
    :class:`VarpackError`), the environment (an ``OSError``: as it is, or the user error
    ``os_error`` makes of it) or a bug (any other :class:`Exception`, returned as a :class:`Bug`
    holding its traceback). Signals (``Interrupted``) and exits pass through."""
    try:
        return fn(), None
    except VarpackError as exc:
        return None, exc
    except OSError as exc:
        return None, exc if os_error is None else os_error(exc)
    except Exception:
        return None, Bug(traceback.format_exc().rstrip())


def exit_code(error: BaseException) -> int:
    """The exit code of an error :func:`caught` returned: a user error's own, else 1."""
    return error.exit_code if isinstance(error, VarpackError) else 1


class Agreed(Exception):
    """Raised on every rank after :func:`agree` found a failure: ``error`` is the first failing
    rank's (a :class:`VarpackError` or an ``OSError``; ``None`` for a bug, whose traceback that
    rank printed); every rank exits with ``code``."""

    def __init__(self, error: BaseException | None, code: int, rank: int) -> None:
        super().__init__(str(error) if error is not None else "")
        self.error = error
        self.code = code
        self.rank = rank


def agree(comm: Any, fn: Callable[[], T]) -> T:
    """Run ``fn`` on this rank, then agree with every rank of ``comm`` on whether any failed.

    On success every rank gets its own result. Otherwise the first failing rank's error (a
    bug's traceback is printed by the rank that hit it) travels to all ranks, which raise it as
    :class:`Agreed` with its exit code: a check that stops a one-process run at its first
    failure reports the same one when its work is shared out in order. Collectives belong
    outside ``fn``: every rank reaches each ``agree``, or none does. A signal whose exception a
    C callback swallowed on this rank is raised here (:func:`varpack.atomic.check_interrupted`)."""
    from varpack.atomic import check_interrupted

    check_interrupted()
    result, error = caught(fn)
    if isinstance(error, Bug):
        print(f"rank {comm.Get_rank()}: {error}", file=sys.stderr, flush=True)
    codes = comm.allgather(0 if error is None else exit_code(error))
    failed = [r for r, c in enumerate(codes) if c]
    if not failed:
        return result  # type: ignore[return-value]
    first = failed[0]
    sent = None if isinstance(error, Bug) else error
    shared = comm.bcast(sent if comm.Get_rank() == first else None, root=first)
    raise Agreed(shared, codes[first], first)


def agreed_exit(code: int) -> None:
    """Exit every rank with ``code`` after a failure all ranks agreed on.

    Launchers do not carry a code through reliably when ranks exit one by one: mpiexec kills the
    ranks still running when one exits non-zero, and the run may end with their SIGKILL status.
    So every rank first prints its line and meets the others; then rank 0 ends the job with
    ``Abort(code)``, whose status the launcher does pass on (MPI's own "Abort" banner is silenced:
    the lines above say it all). In-process (tests, size 1 without mpi4py) it is ``sys.exit``.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not launched() or mpi.Is_finalized():
        sys.exit(code)
    comm = mpi.COMM_WORLD
    sys.stdout.flush()
    sys.stderr.flush()
    comm.Barrier()  # every rank has printed its line
    if comm.Get_rank() == 0:
        abort_quietly(comm, code)
    comm.Barrier()  # never returns: rank 0's Abort ends this rank too
    os._exit(code)


def abort_quietly(comm: Any, code: int) -> None:
    """End every rank of ``comm`` with exit status ``code`` (the launcher passes it on).

    The lines already printed are what the user should read: wait a moment so the launcher
    forwards them, then silence MPI's own "Abort" banner.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), sys.stderr.fileno())
    comm.Abort(code)


#: MPICH's intra-node segments, as this process maps them (``/proc/self/maps``)
_SHM = re.compile(r"(/dev/shm/mpich_shm_\S+)$", re.MULTILINE)


def unlink_shared_memory() -> list[str]:
    """Unlink the names of the shared-memory segments MPI mapped at start-up; returns them.

    The mappings stay valid, so MPI works on, but the segments now vanish with the last process
    that maps them: a rank killed outright (SIGKILL, ``Abort``) can no longer leave them behind
    in ``/dev/shm``, where MPICH itself only removes them at a clean ``Finalize``. Call it after
    a ``Barrier`` (every local rank has attached them by then).
    """
    try:
        with open("/proc/self/maps") as fh:
            names = sorted(set(_SHM.findall(fh.read())))
    except OSError:  # not Linux: nothing to do
        return []
    for name in names:
        with contextlib.suppress(OSError):  # another local rank was first
            os.unlink(name)
    return names
