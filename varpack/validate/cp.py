"""Context-parallel placement (``--cp``): every sample placed once, in range, within capacity.

Reads each rank's ``cp_placement`` column and checks, with the planner's own cost and memory
functions (:mod:`varpack.plan.cp.cost`): the lists are parallel to ``sample_ids`` (each sample
has exactly one placement), every value is -1 (distributed) or a CP rank ``0..cp-1``, no CP rank
of any micro-batch holds more than the bucket size (``local + distributed / cp`` tokens), and
plan.json's ``cp`` figures are the ones the manifests give.
"""

from __future__ import annotations

from typing import Any

from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import over_capacity
from varpack.planfile.rankrows import RankRows
from varpack.planfile.recompute import AllRanks, recompute_cp
from varpack.planfile.report import Report
from varpack.validate.figures import compare_stats


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
