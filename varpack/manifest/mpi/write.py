"""The rank files under MPI: each written by one rank, from the parts every rank planned.

Rank file ``r`` (data-parallel rank ``r``) belongs to MPI rank ``r % P``. Every rank builds its
part of each rank file (its steps' rows, :func:`varpack.manifest.tables.plan_tables`), one file
at a time, and sends it to the file's owner as Arrow IPC; the owner lays the parts out in the
global step order (epoch by epoch, ranks in order) and writes the file with the one-process
writer, in parallel with the other owners. No rank holds more than its own files; rank 0
gathers their checksums for plan.json.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from varpack.manifest.format import rank_file, write_rank_file
from varpack.manifest.tables import plan_tables
from varpack.plan import PlanArrays
from varpack.sort.agree import agree

#: rank files an owner writes at once
WRITERS = 2

if TYPE_CHECKING:
    from varpack.manifest.carry import Carried


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _by_epoch(table: pa.Table, epochs: list[dict[str, int]]) -> list[bytes]:
    """A rank's part of a rank file cut at the epochs' first steps (rows are in step order)."""
    step = table.column("step").to_numpy()
    cuts = np.searchsorted(step, [e["first_step"] for e in epochs[1:]], side="left")
    bounds = [0, *cuts.tolist(), len(step)]
    return [_ipc(table.slice(a, b - a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _in_step_order(table: pa.Table) -> pa.Table:
    """A rank file's rows by (step, micro): the parts' order already, unless the warm-up
    reorder moved micro-batches into steps other ranks planned."""
    step = table.column("step").to_numpy()
    micro = table.column("micro").to_numpy().astype(np.int64)
    key = step * (int(micro.max()) + 1 if len(micro) else 1) + micro
    if (np.diff(key) > 0).all():
        return table
    return table.take(pa.array(np.argsort(key, kind="stable")))


def _write_parts(parts: list[list[bytes]], epochs: int, path: Path) -> dict[str, Any]:
    """One rank file from every rank's parts, laid out epoch by epoch, ranks in order."""
    tables = [_read_ipc(part[e]) for e in range(epochs) for part in parts]
    table = _in_step_order(pa.concat_tables(tables).combine_chunks())
    del tables, parts
    return write_rank_file(table, path)


def write_rank_files(
    comm: Any, p: PlanArrays, carried: Carried | None, tmp: Path
) -> list[dict[str, Any]] | None:
    """Write every rank file into ``tmp``; returns their plan.json entries on rank 0 (None
    elsewhere). An owner writes its files in worker threads, at most :data:`WRITERS` at once
    (Parquet encoding releases the GIL), while the next parts arrive."""
    size = comm.Get_size()
    entries: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []
    pending: list[tuple[int, Future[dict[str, Any]]]] = []

    def settle(r: int, job: Future[dict[str, Any]]) -> None:
        try:
            entries[r] = job.result()
        except Exception as exc:  # agreed below, once every rank has sent its parts
            errors.append(exc)

    pool = ThreadPoolExecutor(max_workers=WRITERS)
    try:
        for r, table in enumerate(plan_tables(p, carried, in_order=True)):
            parts = agree(comm, partial(_by_epoch, table, p.epochs))
            del table
            got = comm.gather(parts, root=r % size)
            del parts
            if got is not None:
                while len(pending) >= WRITERS:
                    settle(*pending.pop(0))
                job = pool.submit(_write_parts, got, len(p.epochs), tmp / rank_file(r))
                pending.append((r, job))
                del got
        for r, job in pending:
            settle(r, job)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    def check() -> dict[int, dict[str, Any]]:
        if errors:
            raise errors[0]
        return entries

    mine = agree(comm, check)
    every = comm.gather(mine, root=0)
    if every is None:
        return None
    merged = {r: e for part in every for r, e in part.items()}
    return [merged[r] for r in range(p.cfg.dp)]
