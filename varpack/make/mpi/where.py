"""``--where`` under MPI: the condition evaluated over every rank's share of the metadata.

One process runs the SQL condition with polars over the whole ``--carry-from`` metadata and keeps
the input's samples whose id it returns (:mod:`varpack.metadata.where`). Here rank 0 first
resolves the query against the files' schema (a condition's errors are the one process's line);
then each rank runs it over its share of the metadata's row groups (a pyarrow dataset of those
fragments, scanned by polars, which reads only the columns the condition names) and sends every
kept id to the rank that owns it (a hash, as :mod:`.carry` does); each rank then asks the owners
which of its input ids were kept. No rank holds more than its share of ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.carry import owner
from varpack.make.mpi.read import group_rows, share
from varpack.metadata.where import Where, check_sql, members, none_kept, where_ids
from varpack.sort.agree import agree


def where_share(
    comm: Any, ids: np.ndarray, lens: np.ndarray, sql: str, source: str
) -> tuple[np.ndarray, np.ndarray, Where]:
    """This rank's input ``ids``/``lens`` (a run of the sort output) that the condition keeps,
    and the record of what it kept over every rank."""
    from varpack.metadata.contract import resolve_files

    text = check_sql(sql)
    files = [str(f) for f in resolve_files(source)]
    rank, size = comm.Get_rank(), comm.Get_size()
    agree(comm, lambda: where_ids(files, text, plan_only=True) if rank == 0 else None)
    kept = agree(comm, lambda: where_ids(files, text, _share(files, rank, size)))
    mask = _asked(comm, ids, kept)
    every = comm.allgather((len(ids), int(lens.sum()), int(mask.sum()), int(lens[mask].sum())))
    samples, tokens, n, kept_tokens = (sum(e[k] for e in every) for k in range(4))

    def check() -> None:
        if n == 0:
            raise none_kept(text, samples, source)

    agree(comm, check)
    return ids[mask], lens[mask], Where(text, source, samples, tokens, n, kept_tokens)


def _share(files: list[str], rank: int, size: int) -> Any:
    """This rank's whole row groups of ``files`` (those whose first row falls in its share of
    the rows) as a polars LazyFrame."""
    import polars as pl
    import pyarrow.dataset as ds

    dataset = ds.dataset(files, format="parquet")
    groups = [g for f in dataset.get_fragments() for g in f.split_by_row_group()]
    sizes = group_rows(groups)
    a, b = share(int(sizes.sum()), rank, size)
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    mine = [g for g, first in zip(groups, firsts.tolist(), strict=True) if a <= first < b]
    part = ds.FileSystemDataset(mine, dataset.schema, dataset.format, dataset.filesystem)
    return pl.scan_pyarrow_dataset(part)


def _asked(comm: Any, ids: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Which of this rank's ``ids`` any rank kept: kept ids go to their owners, which answer."""
    size = comm.Get_size()
    dest = owner(kept, size)
    got = comm.alltoall([kept[dest == r] for r in range(size)])
    owned = np.unique(np.concatenate(got)) if got else np.zeros(0, np.int64)
    ask = owner(ids, size)
    order = np.argsort(ask, kind="stable")
    bounds = np.searchsorted(ask[order], np.arange(size + 1))
    asked = comm.alltoall([ids[order[bounds[r] : bounds[r + 1]]] for r in range(size)])
    answers = comm.alltoall([members(q, owned) for q in asked])
    mask = np.empty(len(ids), dtype=bool)
    mask[order] = np.concatenate(answers) if answers else np.zeros(0, bool)
    return mask
