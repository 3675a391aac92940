"""``--max-shapes`` and ``--pack-to`` under MPI: the shape lengths every rank plans with.

One process chooses the lengths from all samples (padded layout, before batching) or from all
micro-batch totals (packed layout, after batching), by an exact DP over their histogram
(:func:`varpack.plan.kernels.shapes.choose_lengths`). Here every rank adds its histogram to the
others' and runs the same DP on the merged one, so every rank holds the one process's lengths.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.figures import Ranks
from varpack.make.mpi.moves import Rows
from varpack.plan import PlanConfig
from varpack.plan.kernels import shapes
from varpack.plan.segments import segment_sums
from varpack.plan.stages.shaping import input_lengths


def _merged(comm: Any, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and counts of every rank's ``values``."""
    return Ranks(comm).histogram(*np.unique(values, return_counts=True))


def lengths_before(comm: Any, lens: np.ndarray, cfg: PlanConfig) -> np.ndarray | None:
    """The lengths known before batching (``--pack-to``; ``--max-shapes`` in the padded layout,
    over every rank's samples)."""
    if cfg.pack_to is not None or cfg.max_shapes is None or cfg.layout != "padded":
        return input_lengths(lens, cfg)
    values, counts = _merged(comm, lens)
    return shapes.choose_lengths(values, cfg.max_shapes, cfg.pad_multiple, counts=counts)


def lengths_after(
    comm: Any, parts: list[tuple[Rows, np.ndarray, int, int]], cfg: PlanConfig,
    known: np.ndarray | None,
) -> np.ndarray | None:  # fmt: skip
    """The lengths of the shape stage: ``known``, or ``--max-shapes`` in the packed layout over
    every rank's micro-batch totals (each epoch's, as one process counts them; one part is
    repeated by every epoch)."""
    if known is not None or cfg.max_shapes is None or cfg.layout != "packed":
        return known
    totals = np.concatenate([segment_sums(off, rows["lens"]) for rows, off, _, _ in parts])
    values, counts = _merged(comm, totals)
    times = cfg.epochs if len(parts) == 1 else 1
    return shapes.choose_lengths(values, cfg.max_shapes, cfg.pad_multiple, counts=counts * times)
