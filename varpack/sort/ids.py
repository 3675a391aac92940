"""Phase 4 of the sort: sample ids are unique across all ranks.

A sorted copy of each rank's ids is range-partitioned by sampled splitters (one ``Alltoallv``,
:func:`varpack.sort.distribute.exchange_sorted`), so equal ids meet on one rank, where an
adjacent comparison finds them (:func:`varpack.metadata.contract.first_duplicate`). The smallest
duplicate over all ranks fails every rank; rank 0 reports all its places (files and rows).

Collective: the functions take the :class:`~varpack.sort.job.Job` and call collectives on its
communicator (the exchange, an ``allgather`` and a ``gather``); the error is raised inside
:meth:`~varpack.sort.job.Job.phase` so that all ranks agree on it.
"""

from __future__ import annotations

import numpy as np

from varpack.metadata.contract import duplicate_error, first_duplicate
from varpack.sort.distribute import exchange_sorted
from varpack.sort.inputs import Segment, locate
from varpack.sort.job import Job


def check_ids(job: Job, ids: np.ndarray, segments: list[Segment]) -> None:
    """Phase 4: a duplicated id anywhere fails every rank; rank 0 reports all its places."""
    dup = first_duplicate_id(job, ids)
    if dup is None:  # the same on every rank (an allgather)
        return
    places = job.comm.gather(locate(dup, ids, segments), root=0)

    def report_dup() -> None:
        if job.rank == 0:
            raise duplicate_error(dup, [p for ps in places for p in ps])

    job.phase(report_dup)


def first_duplicate_id(job: Job, ids: np.ndarray) -> int | None:
    """The smallest duplicated id over all ranks, or ``None`` (every id is a valid value: no
    in-band "none" sentinel).

    A sorted copy of the ids is range-partitioned by sampled splitters (one ``Alltoallv``), so
    equal ids meet on one rank, where a sorted adjacent check finds them.
    """
    mine = np.sort(ids)
    if job.size > 1:
        mine = exchange_sorted(job, mine, {}, 1024)[0]
        mine.sort(kind="stable")  # P sorted runs: timsort merges them in O(n log P)
    found = [d for d in job.comm.allgather(first_duplicate(mine)) if d is not None]
    return min(found) if found else None
