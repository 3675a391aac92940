"""Step and micro numbering: every rank runs the same steps with the same micro-batch counts.

Checks that a rank has exactly ``num_steps x grad_accum`` rows (naming the steps whose count is
off), and that its rows are numbered contiguously in execution order: ``step`` 0, 0, .., 1, ..
and ``micro`` 0..K-1 within each step. Equal counts on every rank and step are what keep the
trainer's collectives from hanging; nothing later can be recomputed from a misnumbered rank.
"""

from __future__ import annotations

import numpy as np

from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import SHOW, Report


def check_numbering(r: int, rk: RankRows, num_steps: int, k: int, report: Report) -> bool:
    """``True`` if rank ``r`` has ``num_steps`` steps of ``k`` micro-batches, numbered in order."""
    rows = len(rk.step)
    if rows != num_steps * k:
        per = np.bincount(np.clip(rk.step, 0, None), minlength=num_steps)[:num_steps]
        uneven = np.flatnonzero(per != k)
        report.examples(
            f"rank {r}: {rows} micro-batches, expected {num_steps} steps x {k}; unequal counts",
            [f"step {s} has {per[s]}" for s in uneven[:SHOW]],
            len(uneven),
        )
        return False
    want_step = np.arange(rows) // k
    want_micro = np.arange(rows) % k
    bad = np.flatnonzero((rk.step != want_step) | (rk.micro != want_micro))
    if len(bad):
        report.examples(
            f"rank {r}: step/micro numbering is not contiguous (steps 0..{num_steps - 1}, micro 0..{k - 1}); rows",
            [f"{i} (step {rk.step[i]}, micro {rk.micro[i]})" for i in bad[:SHOW]],
            len(bad),
        )
        return False
    return True
