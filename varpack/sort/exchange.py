"""The only bulk MPI data movement of the sort: ``Alltoallv`` / ``Allgatherv`` on NumPy buffers.

Records travel as raw bytes under a contiguous MPI datatype of one record, so counts and
displacements are in records (a 16-byte key is one element), never pickled. A message between
two ranks is cut into rounds of at most ``max_bytes`` so that no count exceeds the 32-bit MPI
limit whatever the data size (``VARPACK_SORT_MAX_MESSAGE`` overrides the limit; tests set it tiny
to exercise the rounds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.errors import env_int

#: default per-pair bytes per round: well below 2**31 so 32-bit counts never overflow.
MAX_BYTES = 1 << 30


def max_message_bytes() -> int:
    return env_int("VARPACK_SORT_MAX_MESSAGE", MAX_BYTES, low=1)


def _record_type(itemsize: int) -> Any:
    from mpi4py import MPI

    dtype = MPI.BYTE.Create_contiguous(itemsize)
    dtype.Commit()
    return dtype


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def alltoallv(
    comm: Any, send: np.ndarray, counts: np.ndarray, max_bytes: int | None = None
) -> np.ndarray:
    """Send ``send[displ[d]:displ[d]+counts[d]]`` to rank ``d``; return what all ranks sent here.

    ``send`` must already be grouped by destination (rank order). The result holds the pieces
    in source-rank order.
    """
    from mpi4py import MPI

    size = comm.Get_size()
    counts = np.asarray(counts, dtype=np.int64)
    recv_counts = np.empty(size, dtype=np.int64)
    comm.Alltoall(counts, recv_counts)
    recv = np.empty(int(recv_counts.sum()), dtype=send.dtype)
    item = max(send.dtype.itemsize, 1)
    per_round = max(1, (max_bytes or max_message_bytes()) // item)
    local = int(max(counts.max(initial=0), recv_counts.max(initial=0)))
    rounds = comm.allreduce(-(-local // per_round), op=MPI.MAX)
    sdis = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rdis = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    sbuf, rbuf = _bytes(send), _bytes(recv)
    rtype = _record_type(item)
    try:
        for k in range(rounds):
            done = k * per_round
            sc = np.clip(counts - done, 0, per_round)
            rc = np.clip(recv_counts - done, 0, per_round)
            comm.Alltoallv(
                [sbuf, (sc.tolist(), np.where(sc > 0, sdis + done, 0).tolist()), rtype],
                [rbuf, (rc.tolist(), np.where(rc > 0, rdis + done, 0).tolist()), rtype],
            )
    finally:
        rtype.Free()
    return recv


def allgatherv(comm: Any, send: np.ndarray) -> np.ndarray:
    """Concatenate every rank's (small) array in rank order, on every rank."""
    counts = np.asarray(comm.allgather(len(send)), dtype=np.int64)
    recv = np.empty(int(counts.sum()), dtype=send.dtype)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rtype = _record_type(max(send.dtype.itemsize, 1))
    try:
        comm.Allgatherv(
            [_bytes(send), rtype], [_bytes(recv), (counts.tolist(), displs.tolist()), rtype]
        )
    finally:
        rtype.Free()
    return recv
