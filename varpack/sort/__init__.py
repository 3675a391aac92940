"""Distributed sample sort of sequence-length metadata, and its on-disk output.

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
