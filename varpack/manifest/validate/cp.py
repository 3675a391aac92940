"""Context-parallel placement (``--cp``): every sample placed once, in range, within capacity.

Reads each rank's ``cp_placement`` column and checks, with the planner's own cost and memory
functions (:mod:`varpack.plan.cp.cost`): the lists are parallel to ``sample_ids`` (each sample
has exactly one placement), every value is -1 (distributed) or a CP rank ``0..cp-1``, no CP rank
of any micro-batch holds more than the bucket size (``local + distributed / cp`` tokens), and
plan.json's ``cp`` figures are the ones the manifests give.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.manifest.validate.figures import AllRanks, compare_stats
from varpack.manifest.validate.files import RankRows
from varpack.manifest.validate.report import Report
from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import CPLoad, CPModel, cp_load, cp_model, over_capacity
from varpack.plan.cp.stage import cp_figures


def read_placement(ranks: list[RankRows], report: Report) -> np.ndarray | None:
    """Every rank's ``cp_placement`` (concatenated, parallel to the samples), or None."""
    parts = []
    for r, rk in enumerate(ranks):
        col = rk.table.column("cp_placement").combine_chunks()
        off = col.offsets.to_numpy().astype(np.int64)
        ids_off = rk.table.column("sample_ids").combine_chunks().offsets.to_numpy()
        if not np.array_equal(off - off[0], ids_off - ids_off[0]) or col.null_count:
            report.add(f"rank {r}: cp_placement lists are not parallel to sample_ids")
            return None
        values = col.flatten()
        if values.null_count:
            report.add(f"rank {r}: cp_placement holds nulls")
            return None
        parts.append(values.to_numpy().astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def recompute_cp(
    ranks: list[RankRows], whole: AllRanks, cfg: PlanConfig, report: Report
) -> tuple[CPLoad, CPModel, dict[str, Any]] | None:
    """Each micro-batch's CP load, the CP model and plan.json's ``cp`` figures, from the
    manifests' placements; ``None`` (with the violation) where they cannot be read or are out
    of range. ``varpack replan`` writes a child's ``cp`` figures with it."""
    placement = read_placement(ranks, report)
    if placement is None:
        return None
    bad = np.flatnonzero((placement < -1) | (placement >= cfg.cp))
    if len(bad):
        report.examples(
            f"cp_placement out of range (-1 or 0..{cfg.cp - 1}) for sample ids",
            whole.ids[bad],
            len(bad),
        )
        return None
    model = cp_model(cfg)
    offsets = np.concatenate([[0], np.cumsum(whole.micro.samples)]).astype(np.int64)
    load = cp_load(offsets, whole.lens, placement, model)
    figures = cp_figures(whole.step, whole.rank_of, len(placement), load, model, cfg.dp)
    return load, model, figures


def check_cp(meta: dict[str, Any], ranks: list[RankRows], whole: AllRanks, cfg: PlanConfig,
             report: Report) -> None:  # fmt: skip
    """The promises of a ``--cp`` plan (module doc)."""
    if cfg.cp == 1:
        return
    got = recompute_cp(ranks, whole, cfg, report)
    if got is None:
        return
    load, model, figures = got
    over = over_capacity(load, model)
    if len(over):
        where = [f"rank {whole.rank_of[i]} step {whole.step[i]}" for i in over[:5]]
        report.examples(
            f"a CP rank holds more than the bucket size {model.bucket} tokens in micro-batches",
            where,
            len(over),
        )
    saved = meta.get("cp")
    if not isinstance(saved, dict):
        report.add("plan.json has no cp figures (an object) although the config has --cp")
        return
    before = len(report.problems)
    compare_stats(saved, figures, report)
    report.problems[before:] = [
        p.replace("plan.json stats", "plan.json cp") for p in report.problems[before:]
    ]
