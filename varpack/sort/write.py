"""Phase 6 of the sort: write the globally sorted rows and publish the output atomically.

Parts (the default): each rank writes its rows as one Parquet part into the temporary directory,
in parallel; rank 0 gathers the parts' names, row counts and checksums, writes ``_index.json``
(:func:`varpack.sort.output.make_index`) and renames the directory into place. Single file:
every rank's records at the offset an exclusive scan of the row counts gives, with collective
MPI-IO writes in rounds of at most :func:`varpack.sort.exchange.max_message_bytes`; rank 0 then
hashes the records, writes the header (with their sha256) and renames the file into place. The
on-disk formats are :mod:`varpack.sort.output`'s.

Collective: the writers take the :class:`~varpack.sort.job.Job` and call collectives on its
communicator (``gather``, ``exscan``, ``allreduce``, and ``MPI.File`` through ``job.MPI``); each
local step runs inside :meth:`~varpack.sort.job.Job.phase`, so a failed write on any rank is
agreed by all and leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from varpack.atomic import publish
from varpack.errors import WriteError
from varpack.fingerprint import Fingerprint, sha256_file
from varpack.sort import exchange, output
from varpack.sort import keys as keymod
from varpack.sort.job import Job


def index_meta(
    spec: keymod.KeySpec, float_keys: tuple[str, ...], fp: Fingerprint
) -> dict[str, Any]:
    """The description of the output (``_index.json`` / the single-file header)."""
    return {
        "keys": list(spec.keys),
        "descending": list(spec.descending),
        "order": list(spec.fields),
        "columns": {c: "float64" if c in float_keys else "int64" for c in spec.columns},
        "total_tokens": fp.tokens,
        "fingerprint": fp.hex,
    }


def write_parts(
    job: Job,
    table: dict[str, np.ndarray],
    meta: dict[str, Any],
    balance: dict[str, float],
    out: Path,
    overwrite: bool,
) -> dict[str, Any] | None:
    """One Parquet part per rank, then ``_index.json`` and the rename (rank 0; returns the index)."""
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
        (tmp / output.INDEX).write_text(json.dumps(index, indent=1) + "\n")
        publish(tmp, out, overwrite)
        return index

    return job.phase(finish)


def write_single(
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
    # the header's size is checked before anything is written; it is written with the records'
    # sha256 once they are all on disk
    header = job.phase(lambda: output.bin_header(meta, total, "0" * 64))
    start = comm.exscan(rows) or 0
    offset = output.HEADER_BYTES + start * dtype.itemsize
    data = records.view(np.uint8)
    step = exchange.max_message_bytes()
    rounds = comm.allreduce(-(-len(data) // step), op=MPI.MAX)

    def write() -> None:
        # collective calls: an I/O error is returned on every rank, so the agreement still holds
        try:
            _write_records(MPI.File.Open(comm, str(tmp), MPI.MODE_WRONLY | MPI.MODE_CREATE))
        except MPI.Exception as exc:
            raise WriteError(
                f"cannot write {out}: {exc.Get_error_string().strip()}; check that its directory "
                "is writable and has room, or write elsewhere"
            ) from None

    def _write_records(fh: Any) -> None:
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
        sha = sha256_file(tmp, skip=output.HEADER_BYTES)
        with open(tmp, "r+b") as fh:
            fh.write(output.bin_header(meta, total, sha))
        publish(tmp, out, overwrite)
        return output.read_header(out)

    return job.phase(finish)
