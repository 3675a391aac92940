"""The MPI driver of ``varpack sort``: phases, error agreement, progress.

Phases (each ends at an agreement point where all ranks learn whether any rank failed):

1. **plan** — rank 0 checks the options and the output path, resolves the input files and draws
   the temporary output name; everything is broadcast.
2. **footers** — every rank reads the Parquet footers of a slice of the files; the row-group list
   is all-gathered, and each rank takes an equal share of the rows (:mod:`varpack.sort.inputs`).
3. **read** — each rank reads and validates its rows; the fingerprint (count, tokens, digest)
   and the key ranges are reduced across ranks.
4. **check ids** — ids are routed by hash (one ``Alltoallv``), sorted, and adjacent ids compared:
   a duplicate anywhere is found on exactly one rank and reported with its files and rows.
5. **sort** — keys encoded (:mod:`varpack.sort.keys`), routed by sampled splitters, exchanged,
   sorted, then shifted so every rank holds exactly ``N/P`` rows (``±1``) in global order.
6. **write** — each rank writes its part in parallel (or its slice of the single file with a
   collective MPI-IO write); rank 0 writes ``_index.json`` and renames the result into place.

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
from typing import Any, Literal, TypeVar

import numpy as np

from varpack.atomic import check_output, publish, remove, temp_sibling
from varpack.errors import InputError, VarpackError
from varpack.fingerprint import Fingerprint, fingerprint
from varpack.metadata.contract import (
    Piece,
    duplicate_error,
    first_duplicate,
    list_pieces,
    resolve_files,
)
from varpack.sort import bucket, exchange, output
from varpack.sort import keys as keymod
from varpack.sort.inputs import Segment, locate, read_share, share
from varpack.sort.splitters import choose_splitters, draw_sample

T = TypeVar("T")
NO_DUP = np.iinfo(np.int64).max


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
    files = _plan(job, input, out, single_file, overwrite, oversample)
    pieces, segments, total = _footers(job, input, files, spec)
    cols, float_keys, fp = _read(job, segments, spec)
    job.report("read", total, f"({len(files)} files, {len(pieces)} row groups, {job.size} ranks)")
    _check_ids(job, cols["sample_id"], segments)
    job.report("check ids", total)
    columns, after_exchange = _sort(job, cols, spec, float_keys, oversample, total)
    meta = _index_meta(spec, float_keys, fp)
    table = {c: columns[c] for c in spec.columns}
    if single_file:
        result = _write_single(job, table, meta, total, out, overwrite)
    else:
        balance = {"after_exchange_max_over_mean": round(after_exchange, 4)}
        result = _write_parts(job, table, meta, balance, out, overwrite)
    job.report("write", total, f"-> {out}")
    if not job.quiet:
        print(f"sort: done {total:,} rows in {time.perf_counter() - job.t0:.2f} s", file=sys.stderr)
    return result


def _plan(
    job: Job, input: Any, out: Path, single_file: bool, overwrite: bool, oversample: int
) -> list[str]:
    """Phase 1: rank 0 checks the options and the output, resolves the input files and draws the
    temporary name; all ranks get the files and note the temporary path (to clean on failure)."""

    def plan() -> tuple[list[str], str]:
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

    files, token = job.comm.bcast(job.phase(plan), root=0)
    job.tmp = temp_sibling(out, token)
    return files


def _footers(
    job: Job, input: Any, files: list[str], spec: keymod.KeySpec
) -> tuple[list[Piece], list[Segment], int]:
    """Phase 2: each rank reads the footers of a slice of the files; all learn every row group
    and take an equal share of the rows. Returns ``(pieces, this rank's segments, total rows)``."""
    rank, size = job.rank, job.size
    lo, hi = rank * len(files) // size, (rank + 1) * len(files) // size
    mine = job.phase(lambda: list_pieces(files[lo:hi], spec.keys))
    pieces: list[Piece] = [p for chunk in job.comm.allgather(mine) for p in chunk]
    total = sum(p.num_rows for p in pieces)

    def check_empty() -> None:
        if total == 0 and rank == 0:
            raise InputError(f"{input}: the metadata holds no rows; nothing to do")

    job.phase(check_empty)
    return pieces, share(pieces, rank, size), total


def _read(
    job: Job, segments: list[Segment], spec: keymod.KeySpec
) -> tuple[dict[str, np.ndarray], tuple[str, ...], Fingerprint]:
    """Phase 3: read this rank's rows; agree on which keys are float (a key column float on any
    rank is float everywhere) and reduce the input fingerprint."""
    MPI = job.MPI
    cols = job.phase(lambda: read_share(segments, spec.columns))
    floats_local = np.array([keymod.is_float_column(cols[k]) for k in spec.keys], dtype=np.int64)
    floats_all = np.zeros_like(floats_local)
    job.comm.Allreduce(floats_local, floats_all, op=MPI.MAX)
    float_keys = tuple(k for k, f in zip(spec.keys, floats_all.tolist(), strict=True) if f)
    for k in float_keys:
        cols[k] = cols[k].astype(np.float64, copy=False)
    fp: Fingerprint = job.comm.allreduce(
        _fingerprint(cols["sample_id"], cols["seq_len"]), op=MPI.SUM
    )
    return cols, float_keys, fp


def _check_ids(job: Job, ids: np.ndarray, segments: list[Segment]) -> None:
    """Phase 4: a duplicated id anywhere fails every rank; rank 0 reports all its places."""
    dup = _first_duplicate(job, ids)
    if dup == NO_DUP:  # the same on every rank (an allreduce)
        return
    places = job.comm.gather(locate(dup, ids, segments), root=0)

    def report_dup() -> None:
        if job.rank == 0:
            raise duplicate_error(dup, [p for ps in places for p in ps])

    job.phase(report_dup)


def _sort(
    job: Job,
    cols: dict[str, np.ndarray],
    spec: keymod.KeySpec,
    float_keys: tuple[str, ...],
    oversample: int,
    total: int,
) -> tuple[dict[str, np.ndarray], float]:
    """Phase 5: encode the keys over the global key ranges, sample sort, shift to equal shares.

    Returns the decoded columns in global order and the largest rank's share over the mean
    after the exchange. Takes ``cols`` over: it is emptied once encoded, so the key columns
    are freed before the exchange (at 100 M rows they are gigabytes).
    """
    MPI, comm = job.MPI, job.comm
    stats = keymod.local_stats(cols, spec, float_keys)
    lo_all, hi_all = np.empty_like(stats[:, 0]), np.empty_like(stats[:, 1])
    comm.Allreduce(np.ascontiguousarray(stats[:, 0]), lo_all, op=MPI.MIN)
    comm.Allreduce(np.ascontiguousarray(stats[:, 1]), hi_all, op=MPI.MAX)
    layout = keymod.make_layout(spec, np.stack([lo_all, hi_all], axis=1), float_keys)
    key = keymod.encode(cols, layout)
    payload = {c: cols[c] for c in spec.payload}
    cols.clear()
    key, payload, after_exchange = _sample_sort(job, key, payload, oversample, total)
    key, payload = _shift(job, key, payload, total)
    columns = {**keymod.decode(key, layout), **payload}
    del key
    job.report(
        "sort",
        total,
        f"({layout.words * 8} B keys; largest rank {after_exchange:.3f} x mean before the shift)",
    )
    return columns, after_exchange


def _index_meta(
    spec: keymod.KeySpec, float_keys: tuple[str, ...], fp: Fingerprint
) -> dict[str, Any]:
    """Phase 6's description of the output (``_index.json`` / the single-file header)."""
    return {
        "keys": list(spec.keys),
        "descending": list(spec.descending),
        "order": list(spec.fields),
        "columns": {c: "float64" if c in float_keys else "int64" for c in spec.columns},
        "total_tokens": fp.tokens,
        "fingerprint": fp.hex,
    }


def _fingerprint(ids: np.ndarray, lens: np.ndarray, block: int = 1 << 16) -> Fingerprint:
    """The additive fingerprint, block by block: cache-sized temporaries, ~5x faster."""
    fp = Fingerprint()
    for i in range(0, len(ids), block):
        fp = fp + fingerprint(ids[i : i + block], lens[i : i + block])
    return fp


def _first_duplicate(job: Job, ids: np.ndarray) -> int:
    """The smallest duplicated id over all ranks, or ``NO_DUP``.

    A sorted copy of the ids is range-partitioned by sampled splitters (one ``Alltoallv``), so
    equal ids meet on one rank, where a sorted adjacent check finds them.
    """
    mine = np.sort(ids)
    if job.size > 1:
        mine = _exchange_sorted(job, mine, {}, 1024)[0]
        mine.sort(kind="stable")  # P sorted runs: timsort merges them in O(n log P)
    dup = first_duplicate(mine)
    return int(job.comm.allreduce(NO_DUP if dup is None else dup, op=job.MPI.MIN))


def _exchange_sorted(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], oversample: int, seed: int = 0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Send the slices of a locally sorted array to their ranks by sampled splitters."""
    comm = job.comm
    sample, weight = draw_sample(key, oversample, seed=seed * job.size + job.rank)
    samples = exchange.allgatherv(comm, sample)
    weights = np.repeat(comm.allgather(weight), comm.allgather(len(sample)))
    counts = bucket.split_counts(key, choose_splitters(samples, weights, job.size))
    key = exchange.alltoallv(comm, key, counts)
    return key, {c: exchange.alltoallv(comm, v, counts) for c, v in payload.items()}


def _sample_sort(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], oversample: int, total: int
) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """Sort locally, exchange by sampled splitters, merge; returns the pre-shift balance."""
    key, payload = _local_sort(key, payload)
    if job.size > 1:
        job.report("partition", total, f"(local sort, {job.size} ranks)")
        key, payload = _exchange_sorted(job, key, payload, oversample, seed=1)
        job.report("exchange", total, f"({key.dtype.itemsize + 8 * len(payload)} B/row)")
        key, payload = _local_sort(key, payload, runs=True)
    sizes = job.comm.allgather(len(key))
    mean = sum(sizes) / job.size
    return key, payload, (max(sizes) / mean if mean else 1.0)


def _local_sort(
    key: np.ndarray, payload: dict[str, np.ndarray], runs: bool = False
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sort keys (and their payload) in place of the old arrays.

    ``runs``: the input is a concatenation of P sorted runs (after the exchange), which timsort
    (``kind="stable"``) merges in O(n log P); a random input is faster with the default sort.
    """
    kind: Literal["stable"] | None = "stable" if runs else None
    if not payload:
        key.sort(kind=kind)
        return key, payload
    order = np.argsort(key, kind=kind)  # keys are unique, so stability does not matter
    return key[order], {c: v[order] for c, v in payload.items()}


def _shift(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], total: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Move boundary rows so rank ``r`` holds global rows ``[r*N//P, (r+1)*N//P)`` exactly."""
    if job.size == 1:
        return key, payload
    offset = job.comm.exscan(len(key)) or 0
    counts = bucket.shift_counts(len(key), offset, total, job.size)
    if not job.comm.allreduce(int(counts[job.rank] != len(key)), op=job.MPI.MAX):
        return key, payload
    key = exchange.alltoallv(job.comm, key, counts)
    return key, {c: exchange.alltoallv(job.comm, v, counts) for c, v in payload.items()}


def _write_parts(
    job: Job,
    table: dict[str, np.ndarray],
    meta: dict[str, Any],
    balance: dict[str, float],
    out: Path,
    overwrite: bool,
) -> dict[str, Any] | None:
    import pyarrow as pa

    tmp = job.tmp
    assert tmp is not None
    name = output.part_name(job.rank)
    sha = job.phase(lambda: output.write_part(pa.table(table), tmp / name))
    rows = len(table["sample_id"])
    gathered = job.comm.gather((name, rows, sha), root=0)

    def finish() -> dict[str, Any] | None:
        if job.rank != 0:
            return None
        files, counts, shas = zip(*gathered, strict=True)
        mean = sum(counts) / len(counts)
        bal = {**balance, "max_over_mean": round(max(counts) / mean, 4) if mean else 1.0}
        index = output.make_index({**meta, "balance": bal}, files, counts, shas)
        import json

        (tmp / output.INDEX).write_text(json.dumps(index, indent=1) + "\n")
        publish(tmp, out, overwrite)
        return index

    return job.phase(finish)


def _write_single(
    job: Job,
    table: dict[str, np.ndarray],
    meta: dict[str, Any],
    total: int,
    out: Path,
    overwrite: bool,
) -> dict[str, Any] | None:
    """One file: header, then every rank's records at offsets from an exclusive scan (MPI-IO)."""
    MPI, comm = job.MPI, job.comm
    tmp = job.tmp
    assert tmp is not None
    dtype = output.record_dtype(meta["columns"])
    rows = len(table["sample_id"])
    records = np.empty(rows, dtype=dtype)
    for c in table:
        records[c] = table[c]
    del table
    header = job.phase(lambda: output.bin_header(meta, total))
    start = comm.exscan(rows) or 0
    offset = output.HEADER_BYTES + start * dtype.itemsize
    data = records.view(np.uint8)
    step = exchange.max_message_bytes()
    rounds = comm.allreduce(-(-len(data) // step), op=MPI.MAX)

    def write() -> None:
        # collective calls: an I/O error is returned on every rank, so the agreement still holds
        fh = MPI.File.Open(comm, str(tmp), MPI.MODE_WRONLY | MPI.MODE_CREATE)
        try:
            head = (
                np.frombuffer(header, dtype=np.uint8)
                if job.rank == 0
                else np.zeros(0, dtype=np.uint8)
            )
            fh.Write_at_all(0, head)
            for k in range(rounds):
                chunk = data[k * step : (k + 1) * step]
                fh.Write_at_all(offset + k * step if len(chunk) else 0, chunk)
        finally:
            fh.Close()

    job.phase(write)

    def finish() -> dict[str, Any] | None:
        if job.rank != 0:
            return None
        publish(tmp, out, overwrite)
        return output.read_header(out)

    return job.phase(finish)
