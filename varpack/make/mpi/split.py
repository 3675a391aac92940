"""``--oversize split`` under MPI: every rank's long documents cut into pieces, the pieces sent to
the rank whose share of the order they sort into.

One process cuts every document longer than ``--split-len`` into pieces and merges them with the
whole documents by (length, id, offset) (:func:`varpack.plan.kernels.split.split_units`); a split
document's number counts the long documents in input order. Here each rank cuts its own long
documents (numbered from the count on the ranks before it), sends each piece to the last rank
whose first whole document sorts at or before it (ranks without whole documents take none), and
merges what it receives with its whole documents. The global order is the one process's; the
shares are then evened out (row counts), since pieces of the budget's length all sort together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.moves import Rows, count, move_micro
from varpack.plan.kernels.inputs import frozen
from varpack.plan.kernels.split import merge_pieces, pieces


def split_share(comm: Any, rows: Rows, split_len: int) -> Rows:
    """This rank's units (``ids``, ``lens``, ``alone``, ``offsets``, ``group``) of the split
    input, in the global (length, id, offset) order."""
    rank, size = comm.Get_rank(), comm.Get_size()
    ids, lens = rows["ids"], rows["lens"]
    long = lens > split_len
    before = sum(comm.allgather(int(long.sum()))[:rank])
    part = pieces(ids[long], lens[long], split_len)
    group = part.group + before
    whole_ids, whole_lens = ids[~long], lens[~long]
    firsts = comm.allgather((int(whole_lens[0]), int(whole_ids[0])) if len(whole_ids) else None)
    dest = _owners(firsts, part.lens, part.ids)
    cols = {"ids": part.ids, "lens": part.lens, "offsets": part.offsets, "group": group}
    order = np.argsort(dest, kind="stable")
    sent, off = {k: v[order] for k, v in cols.items()}, np.arange(len(order) + 1)
    got, _ = move_micro(comm, sent, off, dest[order])
    got = {k: v[np.lexsort((got["offsets"], got["ids"], got["lens"]))] for k, v in got.items()}
    n = len(whole_ids) + count(got)
    out = {k: np.empty(n, np.int64) for k in ("ids", "lens", "offsets", "group")}
    merge_pieces(frozen(whole_ids, np.int64), frozen(whole_lens, np.int64), np.zeros(len(whole_ids), np.bool_), got["ids"], got["lens"],
           got["offsets"], got["group"], out["ids"], out["lens"], out["offsets"], out["group"])  # fmt: skip
    out["alone"] = np.zeros(n, dtype=bool)
    return _even(comm, out, size)


def _owners(
    firsts: list[tuple[int, int] | None], plens: np.ndarray, pids: np.ndarray
) -> np.ndarray:
    """The rank each piece sorts into: the last rank whose first whole document's (length, id)
    is at or before the piece's; before every one, the first rank holding any (else rank 0)."""
    held = [(r, f) for r, f in enumerate(firsts) if f is not None]
    dest = np.full(len(plens), held[0][0] if held else 0, dtype=np.int64)
    for r, (flen, fid) in held:
        dest[(flen < plens) | ((flen == plens) & (fid <= pids))] = r
    return dest


def _even(comm: Any, rows: Rows, size: int) -> Rows:
    """Rows moved so that every rank holds an equal run of the global order."""
    counts = np.array(comm.allgather(count(rows)), dtype=np.int64)
    total, start = int(counts.sum()), int(counts[: comm.Get_rank()].sum())
    mine = start + np.arange(count(rows), dtype=np.int64)
    evened, _ = move_micro(comm, rows, np.arange(count(rows) + 1), mine * size // max(total, 1))
    return evened
