"""Figures: each step's totals and LR factor, each rank's shapes, and plan.json's stats.

With every rank read, the micro-batches of all ranks are put together
(:class:`~varpack.planfile.recompute.AllRanks`) and each step's global samples and tokens
recomputed, with its LR factor and each rank's distinct shapes (:mod:`varpack.planfile.recompute`,
which ``replan`` writes a child's figures with). Checks that every
row carries its step's ``step_tokens``, ``step_samples`` and ``lr_factor``; that plan.json's
per-rank shapes are the manifests'; and that plan.json's stats are the ones the planner's own
assembler (:func:`varpack.plan.figures.plan_json.plan_figures`) gives on the manifests (floats
within 1e-6).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from varpack.planfile.rankrows import RankRows
from varpack.planfile.recompute import AllRanks, Steps
from varpack.planfile.report import SHOW, Report


def check_step_columns(
    ranks: list[RankRows], steps: Steps | AllRanks, report: Report, first: int = 0
) -> None:
    """Every row carries its step's global tokens, samples and LR factor (``ranks``: the plan's
    ranks from ``first`` on)."""
    if isinstance(steps, AllRanks):
        steps = Steps(steps.step_samples, steps.step_tokens, steps.lr)
    for r, rk in enumerate(ranks, start=first):
        for col, want in (
            ("step_tokens", steps.tokens),
            ("step_samples", steps.samples),
            ("lr_factor", steps.lr),
        ):
            have = rk.table.column(col).to_numpy()
            bad = np.flatnonzero(have != want[rk.step])
            if len(bad):
                report.examples(
                    f"rank {r}: {col} differs from the recomputed value at rows",
                    [
                        f"{i} (step {rk.step[i]}: {have[i]} vs {want[rk.step[i]]})"
                        for i in bad[:SHOW]
                    ],
                    len(bad),
                )


def check_rank_shapes(meta: dict[str, Any], whole: AllRanks, report: Report) -> None:
    """plan.json's per-rank shapes are the manifests' distinct shapes."""
    for r, want in enumerate(whole.shapes):
        if meta["ranks"][r].get("shapes") != want:
            report.add(
                f"rank {r}: plan.json shapes are not the manifest's {len(want)} distinct "
                "shapes [rows, pad_to], largest first"
            )


def compare_stats(saved: dict[str, Any], stats: dict[str, Any], report: Report) -> None:
    """One violation per recomputed stat that plan.json does not hold (floats within 1e-6)."""
    for key, value in stats.items():
        have = saved.get(key)
        same = (
            have == value
            if not isinstance(value, float)
            else isinstance(have, int | float) and _close(have, value)
        )
        if isinstance(value, dict) and isinstance(have, dict):
            same = _same_tree(have, value)
        if not same:
            report.add(f"plan.json stats {key} = {have!r}, recomputed {value!r}")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _same_tree(a: Any, b: Any) -> bool:
    """Equal JSON values, floats compared with :func:`_close`."""
    if isinstance(b, float):
        return isinstance(a, int | float) and _close(a, b)
    if isinstance(b, dict):
        return (
            isinstance(a, dict) and a.keys() == b.keys() and all(_same_tree(a[x], b[x]) for x in b)
        )
    return bool(a == b)
