"""Phase 5 of the sort: the distributed sample sort, from local rows to global order.

The keys are encoded over the global key ranges (:mod:`varpack.sort.keys`) into unique composite
keys; each rank sorts its rows, the ranks draw a weighted sample and choose splitters
(:mod:`varpack.sort.splitters`), every rank sends each other rank its slice
(:mod:`varpack.sort.bucket`, :mod:`varpack.sort.exchange`), and the P received sorted runs are
merged. Last, boundary rows are shifted so that rank ``r`` holds exactly global rows
``[r*N//P, (r+1)*N//P)`` (``N/P`` rows, ``±1``), and the keys are decoded back into columns.

Collective: the functions taking the :class:`~varpack.sort.job.Job` call collectives on its
communicator (``Allreduce`` of key ranges, the sample gather, ``Alltoallv`` through
:mod:`varpack.sort.exchange`, ``exscan``). No user error can arise once the rows are read, so
they run on every rank outside :meth:`~varpack.sort.job.Job.phase` (anything escaping is a
bug, and the driver aborts the job). :func:`local_sort` is pure NumPy.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from varpack.sort import bucket, exchange
from varpack.sort import keys as keymod
from varpack.sort.job import Job
from varpack.sort.splitters import choose_splitters, draw_sample


def sort_rows(
    job: Job,
    cols: dict[str, np.ndarray],
    spec: keymod.KeySpec,
    float_keys: tuple[str, ...],
    oversample: int,
    total: int,
) -> tuple[dict[str, np.ndarray], float]:
    """Phase 5: encode the keys over the global key ranges, sample sort, shift to equal shares.

    Returns the decoded columns in global order and the largest rank's share over the mean
    after the exchange. Takes ``cols`` over: it is emptied once encoded, so the key columns
    are freed before the exchange (at 100 M rows they are gigabytes).
    """
    MPI, comm = job.MPI, job.comm
    stats = keymod.local_stats(cols, spec, float_keys)
    lo_all, hi_all = np.empty_like(stats[:, 0]), np.empty_like(stats[:, 1])
    comm.Allreduce(np.ascontiguousarray(stats[:, 0]), lo_all, op=MPI.MIN)
    comm.Allreduce(np.ascontiguousarray(stats[:, 1]), hi_all, op=MPI.MAX)
    layout = keymod.make_layout(spec, np.stack([lo_all, hi_all], axis=1), float_keys)
    key = keymod.encode(cols, layout)
    payload = {c: cols[c] for c in spec.payload}
    cols.clear()
    key, payload, after_exchange = sample_sort(job, key, payload, oversample, total)
    key, payload = shift(job, key, payload, total)
    columns = {**keymod.decode(key, layout), **payload}
    del key
    job.report(
        "sort",
        total,
        f"({layout.words * 8} B keys; largest rank {after_exchange:.3f} x mean before the shift)",
    )
    return columns, after_exchange


def exchange_sorted(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], oversample: int, seed: int = 0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Send the slices of a locally sorted array to their ranks by sampled splitters."""
    comm = job.comm
    sample, weight = draw_sample(key, oversample, seed=seed * job.size + job.rank)
    samples = exchange.allgatherv(comm, sample)
    weights = np.repeat(comm.allgather(weight), comm.allgather(len(sample)))
    counts = bucket.split_counts(key, choose_splitters(samples, weights, job.size))
    key = exchange.alltoallv(comm, key, counts)
    return key, {c: exchange.alltoallv(comm, v, counts) for c, v in payload.items()}


def sample_sort(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], oversample: int, total: int
) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """Sort locally, exchange by sampled splitters, merge; returns the pre-shift balance."""
    key, payload = local_sort(key, payload)
    if job.size > 1:
        job.report("partition", total, f"(local sort, {job.size} ranks)")
        key, payload = exchange_sorted(job, key, payload, oversample, seed=1)
        job.report("exchange", total, f"({key.dtype.itemsize + 8 * len(payload)} B/row)")
        key, payload = local_sort(key, payload, runs=True)
    sizes = job.comm.allgather(len(key))
    mean = sum(sizes) / job.size
    return key, payload, (max(sizes) / mean if mean else 1.0)


def local_sort(
    key: np.ndarray, payload: dict[str, np.ndarray], runs: bool = False
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sort keys (and their payload) in place of the old arrays.

    ``runs``: the input is a concatenation of P sorted runs (after the exchange), which timsort
    (``kind="stable"``) merges in O(n log P); a random input is faster with the default sort.
    """
    kind: Literal["stable"] | None = "stable" if runs else None
    if not payload:
        key.sort(kind=kind)
        return key, payload
    order = np.argsort(key, kind=kind)  # keys are unique, so stability does not matter
    return key[order], {c: v[order] for c, v in payload.items()}


def shift(
    job: Job, key: np.ndarray, payload: dict[str, np.ndarray], total: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Move boundary rows so rank ``r`` holds global rows ``[r*N//P, (r+1)*N//P)`` exactly."""
    if job.size == 1:
        return key, payload
    offset = job.comm.exscan(len(key)) or 0
    counts = bucket.shift_counts(len(key), offset, total, job.size)
    if not job.comm.allreduce(int(counts[job.rank] != len(key)), op=job.MPI.MAX):
        return key, payload
    key = exchange.alltoallv(job.comm, key, counts)
    return key, {c: exchange.alltoallv(job.comm, v, counts) for c, v in payload.items()}
