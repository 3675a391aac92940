"""Phases 2 and 3 of the sort: each rank loads an equal share of the input rows.

**footers**: each rank reads the Parquet footers of a slice of the files; the row-group list is
all-gathered and each rank takes an equal share of the rows (:func:`varpack.sort.inputs.share`).
**read**: each rank reads and validates its rows (:func:`varpack.sort.inputs.read_share`); the
ranks agree on which key columns are float (float on any rank is float everywhere) and sum the
input fingerprint (count, tokens, digest).

Collective: every function here takes the :class:`~varpack.sort.job.Job` and calls
collectives on its communicator (small ``allgather`` / ``Allreduce`` of counts and flags); the
local work runs inside :meth:`~varpack.sort.job.Job.phase` so that an error on one rank is
agreed by all. Nothing here imports mpi4py: the reduction ops come from ``job.MPI``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.fingerprint import Fingerprint, fingerprint
from varpack.metadata.contract import Piece, list_pieces
from varpack.sort import keys as keymod
from varpack.sort.inputs import Segment, check_float, read_share, share
from varpack.sort.job import Job


def read_footers(
    job: Job, input: Any, files: list[str], spec: keymod.KeySpec
) -> tuple[list[Piece], list[Segment], int]:
    """Phase 2: each rank reads the footers of a slice of the files; all learn every row group
    and take an equal share of the rows. Returns ``(pieces, this rank's segments, total rows)``."""
    rank, size = job.rank, job.size
    lo, hi = rank * len(files) // size, (rank + 1) * len(files) // size
    mine = job.phase(lambda: list_pieces(files[lo:hi], spec.keys))
    pieces: list[Piece] = [p for chunk in job.comm.allgather(mine) for p in chunk]
    total = sum(p.num_rows for p in pieces)

    def check_empty() -> None:
        if total == 0 and rank == 0:
            raise InputError(f"{input}: the metadata holds no rows; nothing to do")

    job.phase(check_empty)
    return pieces, share(pieces, rank, size), total


def read_rows(
    job: Job, segments: list[Segment], spec: keymod.KeySpec
) -> tuple[dict[str, np.ndarray], tuple[str, ...], Fingerprint]:
    """Phase 3: read this rank's rows; agree on which keys are float (a key column float on any
    rank is float everywhere) and reduce the input fingerprint."""
    MPI = job.MPI
    cols = job.phase(lambda: read_share(segments, spec.columns))
    floats_local = np.array([keymod.is_float_column(cols[k]) for k in spec.keys], dtype=np.int64)
    floats_all = np.zeros_like(floats_local)
    job.comm.Allreduce(floats_local, floats_all, op=MPI.MAX)
    float_keys = tuple(k for k, f in zip(spec.keys, floats_all.tolist(), strict=True) if f)

    def as_float() -> None:  # integers of a key that is float on another rank must be exact
        for k in float_keys:
            check_float(cols[k], k, segments)
            cols[k] = cols[k].astype(np.float64, copy=False)

    job.phase(as_float)
    fp: Fingerprint = job.comm.allreduce(
        block_fingerprint(cols["sample_id"], cols["seq_len"]), op=MPI.SUM
    )
    return cols, float_keys, fp


def block_fingerprint(ids: np.ndarray, lens: np.ndarray, block: int = 1 << 16) -> Fingerprint:
    """The additive fingerprint, block by block: cache-sized temporaries, ~5x faster."""
    fp = Fingerprint()
    for i in range(0, len(ids), block):
        fp = fp + fingerprint(ids[i : i + block], lens[i : i + block])
    return fp
