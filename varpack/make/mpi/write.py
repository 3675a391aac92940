"""The rank files under MPI: each written by one rank, from the parts every rank planned.

Rank file ``r`` (data-parallel rank ``r``) belongs to MPI rank ``r % P``. Every rank builds its
part of each rank file (its steps' rows, :func:`varpack.planfile.tables.plan_tables`), cut at the
epochs, and sends the parts of the files it does not own to their owners as Arrow IPC
(non-blocking: nothing waits on a collective while an owner writes), in rounds of one file per
owner, so that a rank holds one round's parts at a time. An owner then takes the
parts of each of its files in the global step order (epoch by epoch, ranks in order) and writes
them in row groups of :data:`~varpack.planfile.format.ROW_GROUP` rows as they come, which gives
the bytes of the one-process writer; with ``--warmup reorder``, whose micro-batches change steps
across ranks, it sorts the whole file by step first. Owners write in parallel; a failure on any
rank is agreed once every part has been received; rank 0 gathers the checksums for plan.json.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from varpack.fingerprint import sha256_file
from varpack.plan import PlanArrays
from varpack.planfile.format import (
    ROW_GROUP,
    manifest_schema,
    rank_file,
    table_carry,
    write_rank_file,
    writer_options,
)
from varpack.planfile.tables import plan_tables
from varpack.sort.agree import agree, caught

if TYPE_CHECKING:
    from varpack.planfile.tables import Carried

_PART = 23  # the tag of every part: between two ranks, parts travel in the order they are taken
_CHUNK = 1 << 28  # bytes per message of a part


def _ipc(table: pa.Table) -> np.ndarray:
    """A table as Arrow IPC bytes (a view of Arrow's buffer: no copy)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return np.frombuffer(sink.getvalue(), dtype=np.uint8)


def _read_ipc(data: np.ndarray) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _send(comm: Any, data: np.ndarray | None, dest: int) -> list[Any]:
    """Post a part (its chunk sizes first, then the raw bytes: no pickled copy); ``None``
    tells the owner this rank failed to build it."""
    if data is None:
        return [comm.isend(None, dest=dest, tag=_PART)]
    sizes = [min(_CHUNK, len(data) - a) for a in range(0, len(data), _CHUNK)] or [0]
    requests = [comm.isend(sizes, dest=dest, tag=_PART)]
    for i, n in enumerate(sizes):
        chunk = data[i * _CHUNK : i * _CHUNK + n]
        requests.append(comm.Isend([chunk, _byte()], dest=dest, tag=_PART))
    return requests


def _recv(comm: Any, source: int) -> np.ndarray | None:
    """A part posted by :func:`_send` (``None``: the sender failed)."""
    sizes = comm.recv(source=source, tag=_PART)
    if sizes is None:
        return None
    data = np.empty(sum(sizes), dtype=np.uint8)
    at = 0
    for n in sizes:
        comm.Recv([data[at : at + n], _byte()], source=source, tag=_PART)
        at += n
    return data


def _byte() -> Any:
    from mpi4py import MPI

    return MPI.BYTE


def _by_epoch(table: pa.Table, epochs: list[dict[str, int]]) -> list[pa.Table]:
    """A rank's part of a rank file cut at the epochs' first steps (rows are in step order)."""
    step = table.column("step").to_numpy()
    cuts = np.searchsorted(step, [e["first_step"] for e in epochs[1:]], side="left")
    bounds = [0, *cuts.tolist(), len(step)]
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class _RowGroups:
    """A rank file written row group by row group from the tables fed to it in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.held: list[pa.Table] = []
        self.count = self.rows = 0

    def add(self, table: pa.Table) -> None:
        if self.schema is None:
            self.schema = manifest_schema(table.column_names, table_carry(table.schema))
        if table.schema != self.schema:
            table = table.select(self.schema.names).cast(self.schema)
        self.held.append(table)
        self.count += table.num_rows
        while self.count >= ROW_GROUP:
            self._flush(ROW_GROUP)

    def _flush(self, n: int) -> None:
        assert self.schema is not None
        pending = pa.concat_tables(self.held)
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self.path, self.schema, **writer_options(self.schema.names)
            )
        self.writer.write_table(pending.slice(0, n).combine_chunks(), row_group_size=ROW_GROUP)
        rest = pending.slice(n)
        self.held, self.count, self.rows = [rest], rest.num_rows, self.rows + n

    def close(self) -> dict[str, Any]:
        if self.count:
            self._flush(self.count)
        assert self.writer is not None
        self.writer.close()
        return {"file": self.path.name, "rows": self.rows, "sha256": sha256_file(self.path)}


def _sorted_file(parts: list[pa.Table], path: Path) -> dict[str, Any]:
    """A rank file whose parts are not in step order (the warm-up reorder), sorted first."""
    table = pa.concat_tables(parts).combine_chunks()
    key = table.column("step").to_numpy() * 2**31 + table.column("micro").to_numpy()
    return write_rank_file(table.take(pa.array(np.argsort(key, kind="stable"))), path)


class _Missing(Exception):
    """A part that never came: its sender failed and reports why."""


def _guarded(
    tables: Iterator[pa.Table], count: int, errors: list[BaseException]
) -> Iterator[tuple[int, pa.Table | None]]:
    """``(r, table)`` for every rank file; once building one failed (the error goes to
    ``errors``, agreed later), ``None`` for the rest, so that every owner still hears from
    every rank."""
    for r in range(count):
        table, error = (None, None) if errors else caught(partial(next, tables))
        errors += [error] if error is not None else []
        yield r, table


def write_rank_files(
    comm: Any, p: PlanArrays, carried: Carried | None, tmp: Path
) -> list[dict[str, Any]] | None:
    """Write every rank file into ``tmp``; returns their plan.json entries on rank 0 (None
    elsewhere). Files go in rounds of P (one per owner): a rank holds one round's parts at a
    time."""
    size, rank = comm.Get_size(), comm.Get_rank()
    entries: dict[int, Any] = {}
    errors: list[BaseException] = []
    tables = _guarded(plan_tables(p, carried, in_order=True), p.cfg.dp, errors)
    epochs = len(p.epochs)
    for _ in range(0, p.cfg.dp, size):
        sends, mine = [], None
        for r, table in itertools.islice(tables, size):
            parts = [None] * epochs if table is None else _by_epoch(table, p.epochs)
            if r % size == rank:
                mine = (r, parts)
                continue
            for part in parts:
                data, error = (None, None) if part is None else caught(partial(_ipc, part))
                errors += [error] if error is not None else []
                sends += _send(comm, data, r % size)
            del parts
        if mine is not None:
            entry, error = _write_owned(comm, *mine, len(p.epochs), p.cfg.warmup, tmp)
            errors += [error] if error is not None else []
            entries[mine[0]] = entry
        for request in sends:
            request.wait()
        del sends, mine
        pa.default_memory_pool().release_unused()  # the parts' buffers: back to the system

    def check() -> dict[int, Any]:
        # a missing part is the echo of its sender's own error, which that rank reports
        for error in errors:
            if not isinstance(error, _Missing):
                raise error
        return entries

    done = agree(comm, check)
    every = comm.gather(done, root=0)
    if every is None:
        return None
    merged = {r: e for part in every for r, e in part.items()}
    return [merged[r] for r in range(p.cfg.dp)]


def _write_owned(
    comm: Any, r: int, mine: list[pa.Table | None], epochs: int, warmup: str, tmp: Path
) -> tuple[dict[str, Any] | None, BaseException | None]:
    """Receive every rank's parts of rank file ``r`` (in order) and write it; a failure is
    returned (the parts are still all received, so no sender waits)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    path = tmp / rank_file(r)
    out = _RowGroups(path)
    whole: list[pa.Table] = []
    error: BaseException | None = None
    for e in range(epochs):
        for k in range(size):
            data = None if k == rank else _recv(comm, k)
            if error is not None:
                continue
            if k != rank and data is None:  # the sender failed to build it: agreed later
                error = _Missing(f"rank {k} could not send its part of {path.name}")
                continue
            part = mine[e] if data is None else _read_ipc(data)
            if part is None:  # this rank failed to build its own part: agreed later
                error = _Missing(f"no part of {path.name} from rank {rank}")
                continue
            if warmup == "reorder":
                whole.append(part)
            else:
                _, error = caught(partial(out.add, part))
    if error is not None:
        return None, error
    if warmup == "reorder":
        return caught(lambda: _sorted_file(whole, path))
    return caught(out.close)
