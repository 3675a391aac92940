"""Per-rank state of a sort and the agreement protocol every phase runs under.

:class:`Job` holds the communicator, the temporary output to clean and the phase timer;
:meth:`Job.phase` runs a rank's local work and then agrees with every rank on whether any failed,
so all ranks reach every collective or none does. The phase modules (:mod:`.load`, :mod:`.ids`,
:mod:`.distribute`, :mod:`.write`) take a :class:`Job`; only the driver creates one. How a
rank's work is caught, how ranks leave together and MPI's shared memory are
:mod:`varpack.sort.agree`'s, shared with ``validate`` and ``inspect``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from varpack.atomic import drop_temp, remove_parents, write_error
from varpack.errors import VarpackError
from varpack.sort.agree import Bug, abort_quietly, caught, exit_code, unlink_shared_memory

__all__ = ["Job", "SortFailed", "abort_quietly", "unlink_shared_memory"]

T = TypeVar("T")


class SortFailed(Exception):
    """Another rank failed (its message is already printed); exit with ``code``."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code


class Job:
    """Per-rank state: the communicator, the temp path to clean, phase timing."""

    def __init__(self, comm: Any, quiet: bool) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.quiet = quiet or self.rank != 0
        self.tmp: Path | None = None  # the shared temporary output (rank 0 owns its lock)
        self.made: list[Path] = []  # parent directories rank 0 created for the output
        self.out: Path | None = None  # the output path, named by an environment failure
        self.t0 = self.t = time.perf_counter()
        if self.size > 1:
            comm.Barrier()  # every local rank has attached MPI's shared memory by now
        unlink_shared_memory()

    def phase(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on this rank, then agree with all ranks on whether any failed."""
        result, error = caught(fn, self._os_error)
        code, message = (0, "") if error is None else (exit_code(error), str(error))
        codes = self.comm.allgather(code)
        if max(codes):
            self.fail(code, message, codes, user=not isinstance(error, Bug))
        return result  # type: ignore[return-value]

    def _os_error(self, exc: OSError) -> VarpackError:
        """The environment (disk full, read-only, permission): one line naming the output."""
        return write_error(self.out or exc.filename or "the output", exc)

    def fail(self, code: int, message: str, codes: list[int], user: bool = False) -> None:
        """Every rank leaves the same way: the failing rank with its message, the others quietly
        (rank 0 with a summary); rank 0 removes the temporary output."""
        self.clean()
        if code:
            text = f"rank {self.rank}: {message}" if self.size > 1 else message
            if user:
                err = VarpackError(text)
                err.exit_code = code
                err.agreed = True  # type: ignore[attr-defined]  # every rank knows: exit cleanly
                raise err
            print(text, file=sys.stderr, flush=True)
            raise SortFailed(code)
        bad = [r for r, c in enumerate(codes) if c]
        summary = (
            f"sort failed on rank {', '.join(map(str, bad))} (message above); nothing was written"
        )
        raise SortFailed(max(codes), summary if self.rank == 0 else "")

    def clean(self, any_rank: bool = False) -> None:
        """Remove the temporary output and the parent directories made for it: rank 0 after an
        agreed failure, or ``any_rank`` when this rank alone ends the job (the temporary lies on
        a filesystem every rank shares; only rank 0 made parents)."""
        if self.rank == 0 or any_rank:
            if self.tmp is not None:
                drop_temp(self.tmp)
            remove_parents(self.made)
        self.tmp = None

    def report(self, name: str, rows: int, detail: str = "") -> None:
        """Rank 0: one progress line for the phase that just ended (times include the waits)."""
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        rate = rows / dt / 1e6 if dt > 0 else float("inf")
        if not self.quiet:  # plain stderr: one unwrapped line per phase
            line = f"sort: {name:<9} {rows:>13,} rows {dt:6.2f} s {rate:7.1f} M rows/s {detail}"
            print(line, file=sys.stderr, flush=True)
