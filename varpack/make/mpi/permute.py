"""The shuffle order under MPI: each rank's run of an epoch's permuted stream.

One process draws the epoch's permutation (:mod:`varpack.plan.kernels.permute`): up to
:data:`~varpack.plan.kernels.permute.WHOLE` samples NumPy's own, above it in two levels (a bucket
label per sample, drawn block by block; each bucket shuffled by a generator of its own). Here the
ranks hold runs of the selected samples in input order, and each ends with a run of the permuted
stream (about ``N/P`` positions, in order):

* two levels: each rank draws its samples' labels and sends every sample to the rank that owns
  its bucket (buckets go whole to the rank where they start); an owner groups what it received
  by bucket, in input order (ranks in order), and shuffles each bucket with its generator;
* one pass (a small epoch): every rank draws the permutation (a few MB) and sends each sample
  to the rank that owns its position.

The samples move as typed buffers (:func:`~.moves.exchange`); each carries its columns along.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.moves import Rows, count, exchange, exchange_sorted
from varpack.plan.kernels import permute


def permuted_share(comm: Any, held: dict[str, Rows], seed: int, epoch: int, keep: bool) -> Rows:
    """This rank's run of epoch ``epoch``'s permuted stream, from every rank's ``held["rows"]``
    (runs of the selected samples in input order), which are let go once sent unless ``keep``."""
    rows = held["rows"] if keep else held.pop("rows")
    size = comm.Get_size()
    sizes = np.array(comm.allgather(count(rows)), dtype=np.int64)
    start, n = int(sizes[: comm.Get_rank()].sum()), int(sizes.sum())
    even = np.array([n * k // size for k in range(size)], dtype=np.int64)
    nb = permute.buckets(n, permute.WHOLE, permute.BUCKET)
    if nb == 0:
        del held
        return _one_pass(comm, rows, seed, epoch, start, n, even)
    label = permute.labels(seed, epoch, start, start + count(rows), n, nb)
    order, bounds = permute.grouped(label, nb)  # stable: input order inside each bucket
    bucket_start = np.concatenate(([0], np.cumsum(comm.allreduce(np.diff(bounds)))))
    owner = np.searchsorted(even, bucket_start[:-1], side="right") - 1  # nondecreasing
    counts = np.bincount(owner, weights=np.diff(bounds), minlength=size).astype(np.int64)
    got = exchange_sorted(comm, {**rows, "_label": label}, order, counts)
    del order, label, rows
    order, bounds = permute.grouped(got.pop("_label"), nb)  # ranks in order: input order inside
    for b in np.flatnonzero(np.diff(bounds)).tolist():
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        order[lo:hi] = order[lo:hi][permute.bucket_order(seed, epoch, b, hi - lo)]
    for k in list(got):  # one column's copy at a time
        got[k] = got[k][order]
    return got


def _one_pass(
    comm: Any, rows: Rows, seed: int, epoch: int, start: int, n: int, even: np.ndarray
) -> Rows:
    """A small epoch: NumPy's permutation, drawn on every rank; samples sent by position."""
    perm = permute.permutation(seed, epoch, n)
    at = np.empty(n, dtype=np.int64)
    at[perm] = np.arange(n, dtype=np.int64)
    pos = at[start : start + count(rows)]
    del perm, at
    got = exchange(comm, {**rows, "_pos": pos}, np.searchsorted(even, pos, side="right") - 1)
    del rows
    order = np.argsort(got.pop("_pos"))
    for k in list(got):
        got[k] = got[k][order]
    return got
