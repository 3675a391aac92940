"""The MPI driver of ``varpack sort``: phases, error agreement, progress.

Phases (each ends at an agreement point where all ranks learn whether any rank failed), each in
a module of its own apart from the first:

1. **prepare** (here) — rank 0 checks the options and the output path, resolves the input files
   and draws the temporary output name; everything is broadcast.
2. **footers** (:mod:`.load`) — every rank reads the Parquet footers of a slice of the files; the
   row-group list is all-gathered, and each rank takes an equal share of the rows
   (:mod:`varpack.sort.inputs`).
3. **read** (:mod:`.load`) — each rank reads and validates its rows; the ranks agree on which
   key columns are float, and the fingerprint (count, tokens, digest) is reduced across ranks.
4. **check ids** (:mod:`.ids`) — ids are routed by sampled splitters (one ``Alltoallv``), sorted,
   and adjacent ids compared: a duplicate anywhere is found on exactly one rank and reported with
   its files and rows.
5. **sort** (:mod:`.distribute`) — keys encoded over the key ranges reduced across ranks
   (:mod:`varpack.sort.keys`), routed by sampled splitters, exchanged, sorted, then shifted so
   every rank holds exactly ``N/P`` rows (``±1``) in global order.
6. **write** (:mod:`.write`) — each rank writes its part in parallel (or its slice of the single
   file with a collective MPI-IO write); rank 0 writes ``_index.json`` and renames the result
   into place.

The phase modules take the :class:`Job` and call collectives on its communicator; the pure NumPy
steps they use live in :mod:`.keys`, :mod:`.splitters`, :mod:`.bucket`, :mod:`.inputs` and
:mod:`.output`, and bulk data moves only through :mod:`.exchange`. This module and
:mod:`.exchange` are the only ones that import mpi4py.

A user error on any rank (:class:`~varpack.errors.VarpackError`) is printed by that rank as
``rank R: message``; all ranks then exit 2 and rank 0 deletes the temporary output. A bug inside
a phase is agreed the same way (exit 1, with its traceback); anything escaping the phases (for
example an MPI failure inside a collective) calls ``Abort`` so no rank waits forever.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from varpack.atomic import check_output, remove, temp_sibling
from varpack.errors import VarpackError
from varpack.metadata.contract import resolve_files
from varpack.sort import keys as keymod
from varpack.sort.distribute import sort_rows
from varpack.sort.ids import check_ids
from varpack.sort.load import read_footers, read_rows
from varpack.sort.write import index_meta, write_parts, write_single

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
        self.tmp: Path | None = None
        self.t0 = self.t = time.perf_counter()

    def phase(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on this rank, then agree with all ranks on whether any failed."""
        code, message, result = 0, "", None
        try:
            result = fn()
        except VarpackError as exc:
            code, message = 2, str(exc)
        except Exception:
            code, message = 1, traceback.format_exc().rstrip()
        codes = self.comm.allgather(code)
        if max(codes):
            self.fail(code, message, codes)
        return result  # type: ignore[return-value]

    def fail(self, code: int, message: str, codes: list[int]) -> None:
        if self.rank == 0 and self.tmp is not None:
            remove(self.tmp)
        if code:
            text = f"rank {self.rank}: {message}" if self.size > 1 else message
            if code == 2:
                err = VarpackError(text)
                err.agreed = True  # type: ignore[attr-defined]  # every rank knows: exit cleanly
                raise err
            print(text, file=sys.stderr, flush=True)
            raise SortFailed(code)
        bad = [r for r, c in enumerate(codes) if c]
        summary = (
            f"sort failed on rank {', '.join(map(str, bad))} (message above); nothing was written"
        )
        raise SortFailed(max(codes), summary if self.rank == 0 else "")

    def report(self, name: str, rows: int, detail: str = "") -> None:
        """Rank 0: one progress line for the phase that just ended (times include the waits)."""
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        rate = rows / dt / 1e6 if dt > 0 else float("inf")
        if not self.quiet:  # plain stderr: one unwrapped line per phase
            line = f"sort: {name:<9} {rows:>13,} rows {dt:6.2f} s {rate:7.1f} M rows/s {detail}"
            print(line, file=sys.stderr, flush=True)


def sort_metadata(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    keys: Sequence[str] = ("seq_len",),
    descending: Sequence[str] = (),
    single_file: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    oversample: int = 1024,
    comm: Any = None,
) -> dict[str, Any] | None:
    """Sort the metadata at ``input`` into ``out`` on all ranks of ``comm`` (default COMM_WORLD).

    Returns the index on rank 0 (``None`` elsewhere). Raises :class:`VarpackError` on the rank
    that found a user error and :class:`SortFailed` on the others; calls ``Abort`` on anything
    that escapes the agreement points.
    """
    from mpi4py import MPI

    job = Job(comm if comm is not None else MPI.COMM_WORLD, quiet)
    try:
        return _run(
            job,
            input,
            out,
            keymod.KeySpec(tuple(keys), tuple(descending)),
            single_file,
            overwrite,
            oversample,
        )
    except (VarpackError, SortFailed):
        raise
    except BaseException:
        print(f"rank {job.rank}: {traceback.format_exc().rstrip()}", file=sys.stderr, flush=True)
        if job.tmp is not None:
            remove(job.tmp)  # best effort: Abort ends every rank, including rank 0
        job.comm.Abort(1)
        raise


def _run(
    job: Job,
    input: Any,
    out_path: Any,
    spec: keymod.KeySpec,
    single_file: bool,
    overwrite: bool,
    oversample: int,
) -> dict[str, Any] | None:
    """The phases in order. Each helper runs its local work in :meth:`Job.phase` and its
    collectives outside it, so every rank reaches every collective or none does."""
    out = Path(out_path)
    files = _prepare(job, input, out, single_file, overwrite, oversample)
    pieces, segments, total = read_footers(job, input, files, spec)
    cols, float_keys, fp = read_rows(job, segments, spec)
    job.report("read", total, f"({len(files)} files, {len(pieces)} row groups, {job.size} ranks)")
    check_ids(job, cols["sample_id"], segments)
    job.report("check ids", total)
    columns, after_exchange = sort_rows(job, cols, spec, float_keys, oversample, total)
    meta = index_meta(spec, float_keys, fp)
    table = {c: columns[c] for c in spec.columns}
    if single_file:
        result = write_single(job, table, meta, total, out, overwrite)
    else:
        balance = {"after_exchange_max_over_mean": round(after_exchange, 4)}
        result = write_parts(job, table, meta, balance, out, overwrite)
    job.report("write", total, f"-> {out}")
    if not job.quiet:
        print(f"sort: done {total:,} rows in {time.perf_counter() - job.t0:.2f} s", file=sys.stderr)
    return result


def _prepare(
    job: Job, input: Any, out: Path, single_file: bool, overwrite: bool, oversample: int
) -> list[str]:
    """Phase 1: rank 0 checks the options and the output, resolves the input files and draws the
    temporary name; all ranks get the files and note the temporary path (to clean on failure)."""

    def prepare() -> tuple[list[str], str]:
        if oversample < 1:
            raise VarpackError(f"--oversample must be >= 1 (got {oversample})")
        if job.rank != 0:
            return [], ""
        check_output(out, overwrite)
        files = [str(p) for p in resolve_files(input)]
        token = uuid.uuid4().hex[:12]
        out.parent.mkdir(parents=True, exist_ok=True)
        if not single_file:
            temp_sibling(out, token).mkdir()
        return files, token

    files, token = job.comm.bcast(job.phase(prepare), root=0)
    job.tmp = temp_sibling(out, token)
    return files
