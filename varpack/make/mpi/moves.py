"""Moving runs of rows between ranks: the pieces of ``plan`` under MPI that are sequential.

A rank's share of an epoch is a dict of row columns (``ids``, ``lens``, ``alone``, ...) in the
plan's stream order, cut into micro-batches by ``off``. Three moves keep the plan the one process
makes:

* :func:`relay_pack`: greedy packing is sequential (whether a sample fits depends on what the
  micro-batch holds), but its state is empty at every micro-batch start. Rank ``k`` packs its
  rows after the rows of rank ``k-1``'s last, still open micro-batch, and hands its own last one
  on: the cuts are the one process's. From four ranks on, where a micro-batch that starts at a
  row ends (which depends on that row alone: :mod:`varpack.plan.kernels.cuts`) is found by every
  rank for its rows at once, and the relay only walks those cuts, a step a micro-batch;
* :func:`move_micro`: whole micro-batches to the ranks a rule names (a nondecreasing rank per
  micro-batch, so the global order stays): the tail that ``complete`` splits, then whole steps;
* :func:`relayed`: the agreement around a relay, so that a failure on one rank stops the ranks
  after it instead of leaving them waiting.

Only few rows move (a micro-batch per rank, the last steps), so they travel pickled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from varpack.plan.kernels.cuts import follow

Rows = dict[str, np.ndarray]
T = TypeVar("T")
_RELAY = 71


def take(rows: Rows, a: int, b: int) -> Rows:
    """Rows ``a:b`` of every column."""
    return {k: v[a:b] for k, v in rows.items()}


def join(parts: list[Rows], like: Rows) -> Rows:
    """Columns of ``parts`` one after the other (``like`` gives the columns when there are none)."""
    parts = [p for p in parts if p and len(next(iter(p.values())))]
    if not parts:
        return {k: v[:0] for k, v in like.items()}
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in like}


def join_into(parts: list[Rows], into: Rows) -> Rows:
    """:func:`join` that replaces the columns of ``into`` one at a time, dropping ``parts``'
    references to each old column as it goes (parts may be ``into`` or views of it), so that a
    share is never held twice: only one column's old and new arrays at a time."""
    parts = [p for p in parts if p and len(next(iter(p.values())))]
    for k in list(into):
        if len(parts) == 1:  # one part (a view, or the columns themselves): no copy
            column = parts[0][k]
        elif parts:
            column = np.concatenate([p[k] for p in parts])
            for p in parts:
                p[k] = column[:0]  # the old column (or a view of it) let go
        else:
            column = np.empty(0, into[k].dtype)
        into[k] = column
    return into


def count(rows: Rows) -> int:
    return len(next(iter(rows.values())))


def relayed(comm: Any, work: Callable[[Any], tuple[T, Any]], start: Any) -> T:
    """Run ``work(received) -> (result, handed_on)`` on ranks 0, 1, .. in turn: rank 0 gets
    ``start``, rank ``k`` what rank ``k-1`` handed on. A failure travels down the chain (the
    ranks after it skip their work) and then every rank agrees on it (one line, one code)."""
    from varpack.sort.agree import agree, caught

    rank, size = comm.Get_rank(), comm.Get_size()
    got = start if rank == 0 else comm.recv(source=rank - 1, tag=_RELAY)
    failed = isinstance(got, _Failed)
    out: tuple[T, Any] | None = None
    error: BaseException | None = None
    if not failed:
        out, error = caught(lambda: work(got))
    if rank < size - 1:
        comm.send(_Failed() if failed or error is not None else out[1], dest=rank + 1, tag=_RELAY)  # type: ignore[index]

    def check() -> None:
        if error is not None:
            raise error

    agree(comm, check)
    assert out is not None
    return out[0]


class _Failed:
    """What a rank hands on after its work (or an earlier rank's) failed."""


#: ranks from which every rank finding its rows' cuts at once (about 15 ns a row of its share)
#: beats packing in turn (about 5 ns a row of the whole stream)
CUTS_FROM = 4


def relay_pack(
    comm: Any,
    rows: Rows,
    pack_rows: Callable[[Rows], np.ndarray],
    cuts: Callable[[Rows], np.ndarray],
) -> tuple[Rows, np.ndarray]:
    """Pack every rank's rows as one stream (see the module doc); ``pack_rows(rows)`` gives the
    micro-batch starts (and the end) of a run of rows packed from an empty micro-batch,
    ``cuts(rows)`` each row's next cut (:func:`varpack.plan.kernels.cuts.next_cuts`).

    From :data:`CUTS_FROM` ranks on, every rank finds its rows' cuts at once; in turn it then
    only ends the micro-batch handed in (:func:`_first_cut`) and walks the cuts from there, one
    step a micro-batch, and the rows handed in join its own after the relay. With fewer ranks
    each packs its rows in turn."""
    last = comm.Get_rank() == comm.Get_size() - 1
    nxt = cuts(rows) if count(rows) and comm.Get_size() >= CUTS_FROM else None

    def work(before: Rows | None) -> tuple[tuple[Rows | None, np.ndarray, int], Rows]:
        carried = 0 if before is None else count(before)
        if nxt is None:  # packed in turn: the rows handed in join the rank's own first
            if before is not None and carried:
                join_into([before, rows], rows)
                before, carried = None, 0
            off = pack_rows(rows) if count(rows) else np.zeros(1, np.int64)
        elif before is None or not carried:
            off = follow(nxt, 0)
        else:
            off = np.concatenate(([0], follow(nxt, _first_cut(before, rows, pack_rows)) + carried))
        if last or len(off) < 2:
            return (before, off, carried + count(rows)), take(rows, 0, 0)
        cut = int(off[-2])  # the last micro-batch may still take the next rank's rows
        return (before, off[:-1], cut), _rows_from(before, rows, cut)

    before, off, end = relayed(comm, work, None)
    mine = rows if before is None else join_into([before, rows], rows)
    return (mine if end == count(mine) else take(mine, 0, end)), off


def _first_cut(before: Rows, rows: Rows, pack_rows: Callable[[Rows], np.ndarray]) -> int:
    """Where the micro-batch of the rows handed in ends among ``rows`` (``count(rows)``: it
    takes them all): packed over a growing head of ``rows``."""
    carried, n, reach = count(before), count(rows), 64
    while True:
        head = min(n, reach)
        starts = pack_rows(join([before, take(rows, 0, head)], rows))
        if len(starts) > 2 or head == n:  # it ended inside the head, or took every row
            return int(starts[1]) - carried if len(starts) > 2 else n
        reach *= 4


def _rows_from(before: Rows | None, rows: Rows, cut: int) -> Rows:
    """Rows ``cut:`` of ``before`` followed by ``rows`` (views where they lie in ``rows``)."""
    carried = 0 if before is None else count(before)
    if before is None or cut >= carried:
        return take(rows, cut - carried, count(rows))
    return join([take(before, cut, carried), rows], rows)


def move_micro(comm: Any, rows: Rows, off: np.ndarray, dest: np.ndarray) -> tuple[Rows, np.ndarray]:
    """Send micro-batch ``i`` (rows ``off[i]:off[i+1]``) to rank ``dest[i]`` (nondecreasing);
    returns this rank's micro-batches after the move, in the global order."""
    size, rank = comm.Get_size(), comm.Get_rank()
    bounds = np.searchsorted(dest, np.arange(size + 1), side="left")
    sends: list[Any] = []
    for r in range(size):
        a, b = int(bounds[r]), int(bounds[r + 1])
        sends.append(
            None if a == b else (take(rows, int(off[a]), int(off[b])), off[a : b + 1] - off[a])
        )
    kept, sends[rank] = sends[rank], None  # this rank's own part stays as it is (no copy)
    got = comm.alltoall(sends)
    del sends  # views of the whole columns: they would keep the old columns alive below
    got[rank] = kept
    parts = [g for g in got if g is not None]
    offs, at = [np.zeros(1, np.int64)], 0
    for _, part_off in parts:
        offs.append(part_off[1:] + at)
        at += int(part_off[-1])
    return join_into([p[0] for p in parts], rows), np.concatenate(offs)


def owners(first: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The rank holding global micro-batch ``index`` when rank ``r`` holds those from
    ``first[r]`` on (``first`` nondecreasing; ranks holding none share their successor's start)."""
    return np.searchsorted(first, index, side="right") - 1


def move_rows(comm: Any, rows: Rows, dest: np.ndarray) -> Rows:
    """Send row ``i`` to rank ``dest[i]`` (nondecreasing, so the global order stays); few rows
    move (a window at each rank's start), so they travel pickled. ``rows`` is changed in place,
    a column at a time (no second copy of a share)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    bounds = np.searchsorted(dest, np.arange(size + 1), side="left")
    sends: list[Any] = [
        None if bounds[r] == bounds[r + 1] or r == rank else take(rows, bounds[r], bounds[r + 1])
        for r in range(size)
    ]
    got = comm.alltoall(sends)
    del sends  # views of the whole columns: they would keep the old columns alive below
    a, b = int(bounds[rank]), int(bounds[rank + 1])
    before = [g for g in got[:rank] if g is not None]
    after = [g for g in got[rank + 1 :] if g is not None]
    for k in list(rows):
        kept = rows[k][a:b]
        if before or after:
            kept = np.concatenate([*(g[k] for g in before), kept, *(g[k] for g in after)])
        rows[k] = kept
    return rows


def exchange(comm: Any, rows: Rows, dest: np.ndarray) -> Rows:
    """Send row ``i`` to rank ``dest[i]`` (any order): see :func:`exchange_sorted`."""
    order = np.argsort(dest, kind="stable")
    return exchange_sorted(comm, rows, order, np.bincount(dest, minlength=comm.Get_size()))


def exchange_sorted(comm: Any, rows: Rows, order: np.ndarray, counts: np.ndarray) -> Rows:
    """Send rows ``order[:counts[0]]`` to rank 0, the next ``counts[1]`` to rank 1, ..., column
    by column as typed buffers (no pickling: this moves a whole share; ``rows``' columns are
    left as they are). A rank receives the rows of rank 0, 1, .. in turn, each source's rows in
    the order sent."""
    from mpi4py.util.dtlib import from_numpy_dtype

    counts = np.asarray(counts, dtype=np.int64)
    recv_counts = np.array(comm.alltoall(counts.tolist()), dtype=np.int64)
    sdispl = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rdispl = np.concatenate(([0], np.cumsum(recv_counts)[:-1]))
    out: Rows = {}
    for name, column in rows.items():
        send = np.ascontiguousarray(column[order])
        recv = np.empty(int(recv_counts.sum()), dtype=send.dtype)
        kind = from_numpy_dtype(send.dtype)
        comm.Alltoallv([send, (counts, sdispl), kind], [recv, (recv_counts, rdispl), kind])
        del send  # one column's copy at a time
        out[name] = recv
    return out
