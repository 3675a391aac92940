"""Distributed sample sort of sequence-length metadata, and its on-disk output.

Owns ``varpack sort``: the global order of the metadata by the chosen keys (ties broken by
``sample_id``, the same whatever the number of ranks), computed by pure NumPy steps (:mod:`.keys`
encodes composite keys, :mod:`.splitters` chooses them, :mod:`.bucket` routes rows,
:mod:`.inputs` shares and reads the input) and driven under MPI by :mod:`.driver`, whose phases
live in :mod:`.load`, :mod:`.ids`, :mod:`.distribute` and :mod:`.write`; bulk data moves only
through :mod:`.exchange`. Also owns the output format (:mod:`.output`: Parquet parts with
``_index.json``, or one memory-mappable file) and the single-process sort (:mod:`.table`).

May import: the ground floor (errors, atomic publication, fingerprints) and
:mod:`varpack.metadata` (the input contract); mpi4py only in :mod:`.driver`, :mod:`.job`,
:mod:`.exchange` and :mod:`.agree` (the agreement of ranks, shared with ``validate`` and
``inspect`` under MPI), and only when a command runs on several ranks. Nothing of :mod:`varpack.plan`,
:mod:`varpack.planfile`, :mod:`varpack.make`, :mod:`varpack.validate`, :mod:`varpack.inspect`,
:mod:`varpack.cli` or torch.

Public API:

- :func:`sort_table` — single-process sort of a metadata table by the ``varpack sort`` rule.
- :func:`read_sorted` — read a ``varpack sort`` output (parts or single file) in global order.
- :func:`read_single_file` — memory-map a ``--single-file`` output as structured records.
- :func:`sort_metadata` — the MPI driver behind ``varpack sort`` (imports mpi4py when called).
"""

from __future__ import annotations

from typing import Any

from varpack.sort.keys import KeySpec
from varpack.sort.output import read_single_file, read_sorted
from varpack.sort.table import sort_table

__all__ = ["KeySpec", "read_single_file", "read_sorted", "sort_metadata", "sort_table"]


def sort_metadata(*args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """Run the distributed sort; see :func:`varpack.sort.driver.sort_metadata`.

    A thin wrapper so that ``import varpack.sort`` does not import mpi4py.
    """
    from varpack.sort.driver import sort_metadata as run

    return run(*args, **kwargs)
