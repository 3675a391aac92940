"""A plan opened for reading on several MPI ranks: every rank verifies its share of the files.

:func:`load_plan_ranks` is :func:`varpack.planfile.format.load_plan` with ``verify``, its work
shared out: rank 0 reads plan.json and checks its keys and rank file names
(:func:`~varpack.planfile.format.open_meta`), every rank checks the checksums and row counts of
its contiguous share of the rank files (:func:`~varpack.planfile.format.verify_rank_file`), and
rank 0 finishes (undeclared files, plan.json's fingerprint and checksum). Each step is agreed
(:func:`varpack.sort.agree.agree`): the first failing rank's error, which with contiguous shares
is the first bad rank file's, stops every rank, as it stops one process. ``varpack inspect``
under ``mpiexec`` opens its plan this way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from varpack.planfile.format import Plan, finish_plan, open_meta, verify_rank_file
from varpack.sort.agree import agree, unlink_shared_memory


def share(dp: int, size: int, rank: int) -> range:
    """The plan ranks MPI rank ``rank`` of ``size`` reads: a contiguous slice."""
    return range(dp * rank // size, dp * (rank + 1) // size)


def load_plan_ranks(
    comm: Any,
    path: str | os.PathLike[str],
    full: bool = False,
    first: Callable[[], None] | None = None,
) -> Plan | None:
    """The verified plan on rank 0 (``None`` elsewhere); ``first`` runs on rank 0 before
    anything is read (the checks a command makes before it opens the plan)."""
    root = comm.Get_rank() == 0
    comm.Barrier()  # every local rank has attached MPI's shared memory by now
    unlink_shared_memory()

    def head() -> Plan | None:
        if not root:
            return None
        if first is not None:
            first()
        return open_meta(path, full)

    opened = agree(comm, head)
    plan = Plan(Path(path), comm.bcast(None if opened is None else opened.meta, root=0))
    mine = share(plan.dp, comm.Get_size(), comm.Get_rank())

    def verify() -> None:
        for rank in mine:
            verify_rank_file(plan, rank)

    agree(comm, verify)
    return agree(comm, lambda: finish_plan(plan, True) if root else None)
