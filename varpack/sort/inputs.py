"""Split the input rows across ranks and read one rank's share.

Rank ``r`` of ``P`` owns the global rows ``[r*N//P, (r+1)*N//P)`` of the input in file order
(files sorted by path, row groups in file order), so shares are equal whatever the shard sizes.
The unit of reading is a row group: a rank reads every row group that overlaps its range and
keeps its slice, so a row group on a boundary is read (and validated) by both neighbours. A file
written as one huge row group is therefore read whole by every rank that shares it: write
metadata with row groups of ~1 M rows (the pyarrow default) to keep reads proportional.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from varpack.metadata.contract import Piece, check_exact_float, read_piece
from varpack.metadata.footer import check_loadable


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of one row group (offsets inside the row group)."""

    piece: Piece
    start: int
    stop: int


def share(pieces: Sequence[Piece], rank: int, size: int) -> list[Segment]:
    """The row-group slices making up ``rank``'s equal share of the rows.

    >>> ps = [Piece("a", 0, 5, 0), Piece("a", 1, 0, 5), Piece("b", 0, 3, 0)]
    >>> [(s.piece.path, s.start, s.stop) for s in share(ps, 0, 2)]
    [('a', 0, 4)]
    >>> [(s.piece.path, s.start, s.stop) for s in share(ps, 1, 2)]
    [('a', 4, 5), ('b', 0, 3)]
    """
    rows = np.array([p.num_rows for p in pieces], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(rows)])
    total = int(starts[-1])
    lo, hi = rank * total // size, (rank + 1) * total // size
    out = []
    for p, s in zip(pieces, starts[:-1].tolist(), strict=True):
        a, b = max(lo, s), min(hi, s + p.num_rows)
        if a < b:
            out.append(Segment(p, a - s, b - s))
    return out


def read_share(segments: Sequence[Segment], columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Read and validate the segments into NumPy columns (int64, or float64 for float keys).

    Each column is allocated once and filled segment by segment (one copy out of Arrow). A key
    stored as integers in one shard and floats in another comes out as float64, its integers
    checked to be exact (:func:`~varpack.metadata.contract.check_exact_float`).
    """
    keys = [c for c in columns if c not in ("sample_id", "seq_len")]
    n = sum(seg.stop - seg.start for seg in segments)
    check_loadable(n, len(columns), "this rank's share of the metadata")
    out = {c: np.empty(n, dtype=np.int64) for c in columns}
    pos = 0
    for seg in segments:
        table = read_piece(seg.piece, keys).slice(seg.start, seg.stop - seg.start)
        for c in columns:
            col = table.column(c)
            if pa.types.is_floating(col.type) and out[c].dtype != np.float64:
                check_float(out[c][:pos], c, segments)
                out[c] = out[c].astype(np.float64)
            k = 0
            for chunk in col.chunks:
                values = chunk.to_numpy(zero_copy_only=False)
                if out[c].dtype == np.float64 and values.dtype.kind in "iu":
                    check_float(values, c, [seg], k)
                out[c][pos + k : pos + k + len(chunk)] = values
                k += len(chunk)
        pos += table.num_rows
    return out


def check_float(values: np.ndarray, name: str, segments: Sequence[Segment], skip: int = 0) -> None:
    """Refuse integers of key ``name`` a float64 cannot hold (the key is float elsewhere);
    ``values`` are the rows of ``segments`` from row ``skip`` on, in order."""

    def place(k: int) -> str:
        k += skip
        for seg in segments:
            if k < seg.stop - seg.start:
                return f"{seg.piece.path}: row {seg.piece.file_row_offset + seg.start + k}"
            k -= seg.stop - seg.start
        return "this rank's share of the metadata"

    check_exact_float(values, name, place)


def locate(sample_id: int, ids: np.ndarray, segments: Sequence[Segment]) -> list[str]:
    """``"file row N"`` for each local occurrence of ``sample_id`` (error path only)."""
    starts = np.cumsum([0] + [s.stop - s.start for s in segments])
    places = []
    for row in np.flatnonzero(ids == sample_id):
        k = int(np.searchsorted(starts, row, side="right") - 1)
        seg = segments[k]
        places.append(
            f"{seg.piece.path} row {seg.piece.file_row_offset + seg.start + int(row - starts[k])}"
        )
    return places
