"""``--carry`` under MPI: the carried columns joined by sample id, each rank reading a share.

One process reads the id column and the carried columns of the whole carry source and looks up
every planned id (:mod:`varpack.make.carry`). Here rank ``k`` reads a contiguous share of the
source's row groups (:func:`read_share`, its checks agreed: a null names the first one of the
whole source and counts them all) and every row goes to the rank that owns its id (a hash of
the id); after planning, each rank asks the owners for the values of its planned ids and they
answer with Arrow tables (:func:`join_share`). No rank holds more than its share of the source
and the values of its own samples; the values, and so the rank files, are the one process's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.make.carry import (
    empty_error,
    join,
    missing_error,
    null_error,
    repeated_error,
    rows_of,
    source_dataset,
    source_id_column,
)
from varpack.make.mpi.read import group_rows, share
from varpack.planfile.tables import Carried
from varpack.sort.agree import agree


@dataclass
class Source:
    """This rank's rows of the carry source, by owner: the ids it owns and their values."""

    where: str
    id_col: str
    ids: np.ndarray  # int64, the ids this rank owns
    table: pa.Table  # the carried columns of those rows


def owner(ids: np.ndarray, size: int) -> np.ndarray:
    """The rank that owns each id: a multiplicative hash, so that runs of ids spread out.

    >>> owner(np.array([0, 1, 2, 3]), 2).tolist()
    [0, 0, 1, 0]
    """
    mixed = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)
    return (mixed % np.uint64(size)).astype(np.int64)


def read_share(comm: Any, path: str, names: Sequence[str]) -> Source:
    """Read this rank's share of the carry source's row groups and send each row to the owner
    of its id; the checks of :func:`varpack.make.carry.read_carry_source`, agreed."""
    where = str(path)

    def read() -> tuple[str, np.ndarray, pa.Table]:
        dataset, files = source_dataset(path)
        id_col = source_id_column(dataset, files, names, where)
        groups = [g for f in dataset.get_fragments() for g in f.split_by_row_group()]
        sizes = group_rows(groups)
        a, b = share(int(sizes.sum()), comm.Get_rank(), comm.Get_size())
        ends = np.cumsum(sizes)
        first, last = np.searchsorted(ends, a, side="right"), np.searchsorted(ends, b, side="left")
        mine = [g for i, g in enumerate(groups) if first <= i <= last and sizes[i] and a < b]
        cols = [id_col, *names]
        schema = dataset.schema
        parts = [g.to_table(columns=cols) for g in mine]
        table = pa.concat_tables(parts) if parts else schema.empty_table().select(cols)
        lo = a - (int(ends[first - 1]) if first else 0)
        table = table.slice(lo, b - a)
        return id_col, table.column(id_col).cast(pa.int64()).to_numpy(), table.select(list(names))

    id_col, ids, table = agree(comm, read)
    _check_nulls(comm, where, id_col, ids, table)
    dest = owner(ids, comm.Get_size())
    order = np.argsort(dest, kind="stable")
    bounds = np.searchsorted(dest[order], np.arange(comm.Get_size() + 1))
    sends = []
    for r in range(comm.Get_size()):
        at = order[bounds[r] : bounds[r + 1]]
        sends.append((ids[at], table.take(pa.array(at))))
    got = comm.alltoall(sends)
    owned = pa.concat_tables([t for _, t in got]) if got else table.slice(0, 0)
    return Source(where, id_col, np.concatenate([i for i, _ in got]), owned)


def _check_nulls(comm: Any, where: str, id_col: str, ids: np.ndarray, table: pa.Table) -> None:
    """A carried column with nulls: the one-process line (the first null of the whole source,
    and how many there are), whichever rank read them."""
    mine = []
    for name in table.column_names:
        col = table.column(name)
        first = int(ids[int(pc.index(pc.is_null(col), True).as_py())]) if col.null_count else 0
        mine.append((col.null_count, first))
    every = comm.allgather(mine)

    def check() -> None:
        for k, name in enumerate(table.column_names):
            counts = [part[k] for part in every]
            total = sum(c for c, _ in counts)
            if total:
                raise null_error(where, name, total, id_col, next(f for c, f in counts if c))

    agree(comm, check)


def join_share(comm: Any, source: Source, ids: np.ndarray) -> Carried:
    """The carried values of this rank's planned ``ids`` (which may repeat: pieces of one
    document), asked of the ids' owners; the errors of :func:`varpack.make.carry.join`
    (a repeated source id, planned ids missing from the source), agreed."""
    size = comm.Get_size()
    uniq = np.unique(ids)
    dest = owner(uniq, size)
    asked = comm.alltoall([uniq[dest == r] for r in range(size)])
    order = np.argsort(source.ids, kind="stable")
    twice = _repeated(source.ids[order])
    answers = []
    for want in asked:
        rows = rows_of(source.ids, want, order) if len(source.ids) else np.full(len(want), -1)
        found = rows >= 0
        answers.append((found, source.table.take(pa.array(rows[found]))))
    got = comm.alltoall(answers)
    found = np.zeros(len(uniq), dtype=bool)
    tables = []
    keyed = []
    for r, (hit, values) in enumerate(got):
        at = np.flatnonzero(dest == r)
        found[at] = hit
        keyed.append(at[hit])
        tables.append(values)
    _check_join(comm, source, ids, uniq, found, twice)
    table = pa.concat_tables(tables) if tables else source.table.slice(0, 0)
    placed = np.concatenate(keyed) if keyed else np.zeros(0, np.int64)
    return join(ids, uniq[placed], table, source.where)


def _repeated(sorted_ids: np.ndarray) -> int | None:
    """The smallest id that appears twice in a sorted array, if any."""
    twice = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    return int(sorted_ids[twice[0]]) if len(twice) else None


def _check_join(
    comm: Any,
    source: Source,
    ids: np.ndarray,
    uniq: np.ndarray,
    found: np.ndarray,
    twice: int | None,
) -> None:
    """The one-process errors of a join: the smallest repeated source id, then the first
    planned id missing from the source (in plan order) and how many are."""
    lost = ~found[np.searchsorted(uniq, ids)] if len(ids) else np.zeros(0, bool)
    first = int(ids[np.argmax(lost)]) if lost.any() else None
    every = comm.allgather((twice, first, int(lost.sum()), len(source.ids)))

    def check() -> None:
        if sum(n for _, _, _, n in every) == 0:
            raise empty_error(source.where)
        repeated = [t for t, _, _, _ in every if t is not None]
        if repeated:
            raise repeated_error(source.where, min(repeated))
        missing = sum(n for _, _, n, _ in every)
        if missing:
            raise missing_error(
                source.where, next(f for _, f, _, _ in every if f is not None), missing
            )

    agree(comm, check)
