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
:mod:`.output`, and bulk data moves only through :mod:`.exchange`. Only :mod:`.job` (the per-rank state and the agreement protocol), :mod:`.agree` (its parts shared with
``validate`` and ``inspect``), :func:`sort_metadata` (for ``COMM_WORLD``) and :mod:`.exchange`
import mpi4py.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from varpack.atomic import (
    check_output,
    is_varpack_output,
    make_parents,
    new_temp,
    temp_sibling,
)
from varpack.errors import Interrupted, VarpackError
from varpack.metadata.contract import resolve_files
from varpack.sort import exchange
from varpack.sort import keys as keymod
from varpack.sort.distribute import sort_rows
from varpack.sort.ids import check_ids
from varpack.sort.job import Job, SortFailed, abort_quietly
from varpack.sort.load import read_footers, read_rows
from varpack.sort.output import is_sorted_output
from varpack.sort.write import index_meta, write_parts, write_single

__all__ = ["Job", "SortFailed", "sort_metadata"]


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
    except Interrupted as exc:
        _interrupted(job, exc)
        raise
    except BaseException:
        print(f"rank {job.rank}: {traceback.format_exc().rstrip()}", file=sys.stderr, flush=True)
        job.clean(any_rank=True)  # best effort: Abort ends every rank, including rank 0
        job.comm.Abort(1)
        raise


def _interrupted(job: Job, exc: Interrupted) -> None:
    """A signal on this rank: remove the shared temporary, then end every rank with its code.

    The other ranks may wait in a collective that will never complete, so with more than one
    rank this is an ``Abort`` (the launcher ends them all). Launchers forward a signal to every
    rank; a rank other than 0 waits a moment so that rank 0, if it got the signal too, speaks
    for all (one line). MPI's own "Abort" banner is silenced: the line above says it all.
    """
    job.clean(any_rank=True)
    if job.size == 1:
        return  # the CLI prints the line and exits with the code
    if job.rank != 0:
        time.sleep(0.5)
    line = f"varpack: error: {exc} (rank {job.rank}); the partial output was removed"
    print(line, file=sys.stderr, flush=True)
    abort_quietly(job.comm, exc.exit_code)


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

    job.out = out

    def prepare() -> tuple[list[str], str]:
        exchange.max_message_bytes()  # a bad VARPACK_SORT_MAX_MESSAGE fails here, agreed
        if oversample < 1:
            raise VarpackError(f"--oversample must be >= 1 (got {oversample})")
        if job.rank != 0:
            return [], ""
        files = resolve_files(input)
        specs = input if isinstance(input, list | tuple) else [input]
        dirs = [Path(s) for s in specs if Path(s).is_dir()]
        check_output(out, overwrite, [*dirs, *files], owned=_sort_output)
        token = uuid.uuid4().hex[:12]
        job.made = make_parents(out)
        job.tmp = new_temp(out, token, directory=not single_file)
        return [str(p) for p in files], token

    files, token = job.comm.bcast(job.phase(prepare), root=0)
    job.tmp = temp_sibling(out, token)
    return files


def _sort_output(path: Path) -> bool:
    """What ``--overwrite`` may replace: an earlier sort output (either form) or a varpack output."""
    return is_sorted_output(path) or is_varpack_output(path)
