"""Each rank's share of a ``varpack sort`` output: a contiguous run of its rows, read alone.

Ranks take runs of the global order that weigh the same (:func:`weighted_share`: rows and
the micro-batches they will make), cut at block boundaries. A parts
output is read part by part, only the parts a run overlaps (each checked against its sha256 by
the ranks that read it); a single-file output is memory-mapped and its records' sha256 checked
by rank 0 alone (one pass over the file, no memory).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.fingerprint import sha256_file
from varpack.sort import output

_CHUNK = 1 << 20  # records per read


def num_rows(path: str | os.PathLike[str]) -> int:
    """Rows of a sort output (from its index or header)."""
    p = Path(path)
    if p.is_file():
        return int(output.read_header(p)["num_rows"])
    return sum(int(part["rows"]) for part in output.load_index(p)["parts"])


def share(total: int, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s run of ``total`` rows.

    >>> [share(10, r, 3) for r in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    return total * rank // size, total * (rank + 1) // size


def read_run(
    path: str | os.PathLike[str], start: int, stop: int, verify: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(sample_ids, seq_lens)`` int64 of rows ``start:stop`` of a sort output."""
    p = Path(path)
    if p.is_file():
        doc = output.read_header(p)
        if verify and sha256_file(p, skip=output.HEADER_BYTES) != doc["sha256"]:
            raise InputError(
                f"{p}: the records' sha256 does not match the header; the file was "
                "modified or damaged after the sort: sort the metadata again"
            )
        return _read_records(p, np.dtype([(n, c) for n, c in doc["dtype"]]), start, stop)
    return _read_parts(p, start, stop)


def _read_records(p: Path, dtype: np.dtype, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``start:stop`` of a single-file output, read in chunks (no mapping of the file, no
    copy of the records beyond one chunk)."""
    ids = np.empty(stop - start, np.int64)
    lens = np.empty(stop - start, np.int64)
    with open(p, "rb") as fh:
        for a in range(start, stop, _CHUNK):
            b = min(a + _CHUNK, stop)
            fh.seek(output.HEADER_BYTES + a * dtype.itemsize)
            records = np.fromfile(fh, dtype=dtype, count=b - a)
            if len(records) != b - a:
                raise InputError(f"{p}: the file ends before row {a + len(records)}; sort again")
            ids[a - start : b - start] = records["sample_id"]
            lens[a - start : b - start] = records["seq_len"]
    return ids, lens


def _int64(a: np.ndarray) -> np.ndarray:
    return np.array(a, dtype=np.int64)


def _row_range(part: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of a Parquet part, reading only the row groups that hold them."""
    sizes = [part.metadata.row_group(g).num_rows for g in range(part.metadata.num_row_groups)]
    ends = np.cumsum(sizes)
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(ends, hi - 1, side="right")) if hi > lo else first
    groups = list(range(first, min(last + 1, len(sizes))))
    table = part.read_row_groups(groups, columns=["sample_id", "seq_len"])
    skip = lo - (int(ends[first - 1]) if first else 0)
    return table.slice(skip, hi - lo)


def _read_parts(p: Path, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    index = output.load_index(p)
    ids, lens = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    at = 0
    for part in index["parts"]:
        a, b = at, at + int(part["rows"])
        at = b
        if b <= start or a >= stop or a == b:
            continue
        f = p / part["file"]
        if sha256_file(f) != part["sha256"]:
            raise InputError(
                f"{f}: sha256 does not match {output.INDEX}; the output was modified, sort the "
                "metadata again"
            )
        meta = pq.ParquetFile(f)
        if meta.metadata.num_rows != b - a:
            raise InputError(f"{f}: {meta.metadata.num_rows} rows, {output.INDEX} says {b - a}")
        lo, hi = max(start, a) - a, min(stop, b) - a
        piece = _row_range(meta, lo, hi)
        ids.append(_int64(piece.column("sample_id").to_numpy()))
        lens.append(_int64(piece.column("seq_len").to_numpy()))
    return np.concatenate(ids), np.concatenate(lens)


#: rows per block of the weighted shares, at most (a share starts at a block boundary)
BLOCK = 1 << 16
#: bytes a rank holds per row (its columns, twice while rows move) and per micro-batch (the
#: planner's per-micro-batch columns): the weights that even out the ranks' peaks
ROW_BYTES, MICRO_BYTES = 34.0, 90.0


def weighted_share(
    comm: Any, path: str | os.PathLike[str], total: int, per_micro: float
) -> tuple[int, int]:
    """This rank's run of rows such that every rank holds about the same memory: a row weighs
    :data:`ROW_BYTES` plus :data:`MICRO_BYTES` times its share of a micro-batch (its length
    over ``per_micro``, the tokens of a micro-batch; in curriculum order the long samples sit
    at the end, one or two to a micro-batch). Each rank weighs an equal run of rows in blocks of
    :data:`BLOCK`; the ranks add up the blocks' weights and cut at the block boundaries where
    the running weight passes each rank's share (the same cut on every rank)."""
    from varpack.sort.agree import agree

    rank, size = comm.Get_rank(), comm.Get_size()
    block = max(1, min(BLOCK, total // (16 * size)))  # small inputs: finer blocks
    a, b = share(total, rank, size)
    nblocks = -(-total // block) if total else 0
    blocks = agree(comm, partial(_weigh, path, a, b, block, nblocks, per_micro))
    blocks = comm.allreduce(blocks)
    cum = np.concatenate(([0.0], np.cumsum(blocks)))
    cuts = np.searchsorted(cum, cum[-1] * np.arange(size + 1) / size, side="left")
    cuts[0], cuts[-1] = 0, len(blocks)
    return min(int(cuts[rank]) * block, total), min(int(cuts[rank + 1]) * block, total)


def _weigh(
    path: str | os.PathLike[str], a: int, b: int, block: int, nblocks: int, per_micro: float
) -> np.ndarray:
    """The weight of each block's rows among rows ``a:b``, read a chunk at a time (sums per
    block, no per-row temporaries: this runs before the shares, on the whole input)."""
    blocks = np.zeros(nblocks, dtype=np.float64)
    for lo in range(a, b, _CHUNK):
        hi = min(b, lo + _CHUNK)
        _, lens = read_run(path, lo, hi, verify=False)
        edges = np.arange(lo // block * block, hi, block, dtype=np.int64)
        edges[0] = lo
        tokens = np.add.reduceat(lens, edges - lo).astype(np.float64)
        rows = np.diff(np.append(edges, hi)).astype(np.float64)
        first = lo // block
        blocks[first : first + len(edges)] += ROW_BYTES * rows + MICRO_BYTES * tokens / max(
            per_micro, 1.0
        )
    return blocks


def group_rows(groups: list[Any]) -> np.ndarray:
    """Rows of each row-group fragment (``split_by_row_group``), from the footers: a split
    fragment's ``count_rows()`` counts its whole file."""
    return np.array([sum(rg.num_rows for rg in g.row_groups) for g in groups], dtype=np.int64)
