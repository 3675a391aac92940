"""``--max-shapes`` and ``--pack-to`` under MPI: the shape lengths every rank plans with.

One process chooses the lengths from all samples (padded layout, before batching) or from all
micro-batch totals (packed layout, after batching), by an exact DP over their histogram
(:func:`varpack.plan.kernels.shapes.choose_lengths`). Here every rank adds its histogram to the
others' and runs the same DP on the merged one, so every rank holds the one process's lengths.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.manifest.mpi.figures import Ranks
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
    comm: Any, off: np.ndarray, lens: np.ndarray, cfg: PlanConfig, known: np.ndarray | None
) -> np.ndarray | None:
    """The lengths of the shape stage: ``known``, or ``--max-shapes`` in the packed layout over
    every rank's micro-batch totals (each epoch's, as one process counts them)."""
    if known is not None or cfg.max_shapes is None or cfg.layout != "packed":
        return known
    values, counts = _merged(comm, segment_sums(off, lens))
    return shapes.choose_lengths(
        values, cfg.max_shapes, cfg.pad_multiple, counts=counts * cfg.epochs
    )
