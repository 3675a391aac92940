"""Lineage: a replanned plan checked against the plans it continues.

A plan made by ``varpack replan`` holds the run's steps from its ``parent.from_step`` on; the
steps before are its parent's (which may itself continue another plan). Its coverage is a
property of the whole run, so :func:`check_lineage` walks up the chain (each parent found at the
path plan.json records, or the one given), checks each parent is the plan recorded (its plan
fingerprint), gathers every plan's rows of the steps it owns, and checks the union: every sample
exactly once per epoch (or dropped), against the input's fingerprint or ``--metadata``; with
``--oversize split``, the pieces over the run tile their documents (a document's pieces may
straddle the step a plan was replanned from). A run whose first plan is a blend (``--mix``) is
checked by the blend's rules instead (:func:`varpack.validate.mixture.check_mix` over
the run's samples and steps, against the first plan's ``mix``: sources used alike, their
samples and tokens, their share of every step).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from varpack.errors import VarpackError
from varpack.plan.config import PlanConfig
from varpack.planfile.format import MAX_DEPTH, Plan, load_plan
from varpack.planfile.rankrows import RankRows, rank_rows
from varpack.planfile.report import Report
from varpack.planfile.schema import FINGERPRINT_KEY, plan_fingerprint
from varpack.validate.coverage import check_coverage
from varpack.validate.mixture import check_mix
from varpack.validate.pieces import documents


@dataclass
class Run:
    """The run's planned samples over its plans: ids, lengths, and each one's step."""

    ids: np.ndarray
    lens: np.ndarray
    sample_step: np.ndarray
    offsets: np.ndarray | None = None  # per planned sample, where documents are split


def _owned(plan: Plan, stop: int) -> tuple[list[RankRows], np.ndarray]:
    """Each rank's rows of ``plan``'s steps before ``stop``, and every planned sample's step
    (the run's)."""
    ranks, steps = [], []
    for r in range(plan.dp):
        table = plan.rank_table(r, verify=False)
        table = table.filter(pc.less(table.column("step"), stop))
        rows = rank_rows(table, r, plan.meta, Report())
        if rows is None:
            raise VarpackError(f"{plan.path}: rank {r}'s manifest cannot be read as rows")
        ranks.append(rows)
        steps.append(np.repeat(rows.step + plan.first_step, np.diff(rows.offsets)))
    return ranks, np.concatenate(steps)


def _merged_epochs(chain: list[tuple[Plan, int]]) -> list[dict[str, int]]:
    """The run's epochs: each plan's epoch entries clipped to the steps it owns, joined."""
    joined: dict[int, list[int]] = {}
    for plan, stop in chain:
        for e in plan.meta.get("epochs") or []:
            lo = max(int(e["first_step"]), plan.first_step)
            hi = min(int(e["first_step"]) + int(e["num_steps"]), stop)
            if hi > lo:
                got = joined.setdefault(int(e["epoch"]), [lo, 0])
                got[0] = min(got[0], lo)
                got[1] += hi - lo
    return [{"epoch": k, "first_step": v[0], "num_steps": v[1]} for k, v in sorted(joined.items())]


def _parent(
    meta: dict[str, Any], given: str | os.PathLike[str] | None, report: Report
) -> Plan | None:
    """The parent plan, checked to be the one recorded; ``None`` with a violation if not."""
    entry = meta["parent"]
    path = Path(given) if given is not None else Path(entry["plan"])
    try:
        plan = load_plan(path, verify=True)
    except (OSError, VarpackError) as exc:
        report.add(
            f"parent plan {path}: cannot be read ({' '.join(str(exc).split())}); the union of "
            "its steps and this plan's is not checked: pass --parent PATH"
        )
        return None
    have = plan.meta.get(FINGERPRINT_KEY) or plan_fingerprint(plan.meta)
    if have != entry["plan_fingerprint"]:
        report.add(
            f"parent plan {path}: its plan fingerprint {have} is not the recorded "
            f"{entry['plan_fingerprint']}: not the plan this one continues"
        )
        return None
    return plan


def check_lineage(
    plan: Plan,
    cfg: PlanConfig,
    own: tuple[list[RankRows], np.ndarray],
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
    parent: str | os.PathLike[str] | None = None,
) -> None:
    """Every sample once per epoch over the run: ``plan``'s own rows (each rank's, and each
    planned sample's step in the plan) and the steps each ancestor owns; split documents: their
    pieces over the run tile them. ``parent``: where the direct parent is, if moved."""
    ranks, steps = list(own[0]), [own[1] + plan.first_step]
    chain: list[tuple[Plan, int]] = [(plan, plan.first_step + plan.num_steps)]
    child, given = plan, parent
    while "parent" in child.meta:
        if len(chain) > MAX_DEPTH:
            report.add(f"{plan.path}: more than {MAX_DEPTH} parents; is the lineage a loop?")
            return
        up = _parent(child.meta, given, report)
        if up is None:
            return
        stop = child.first_step
        got = _owned(up, stop)
        ranks.extend(got[0])
        steps.append(got[1])
        chain.append((up, stop))
        child, given = up, None
    root = chain[-1][0]
    epochs = _merged_epochs(chain[::-1])
    meta = {
        "epochs": epochs,
        "num_steps": chain[0][1],
        "dropped": root.meta.get("dropped") or [],
        "input": root.meta.get("input", {}),
    }
    reordered = (root.meta.get("config") or {}).get("warmup") == "reorder"
    ids, lens, step = (
        np.concatenate([rk.ids for rk in ranks]),
        np.concatenate([rk.lens for rk in ranks]),
        np.concatenate(steps),
    )
    if "mix" in root.meta:  # a blend repeats samples: its rules, over the whole run
        if plan.meta.get("mix") != root.meta["mix"]:
            report.add(f"mix: plan.json's blend is not the one of {root.path}, which it continues")
        pieces = [rk.sample_offsets for rk in ranks if rk.sample_offsets is not None]
        offsets = np.concatenate(pieces) if len(pieces) == len(ranks) else None
        check_mix(root.meta, ranks, Run(ids, lens, step, offsets), metadata, report)
        return
    if cfg.oversize == "split":  # the pieces over the run tile their documents
        ids, lens, step = documents(meta, cfg, ranks, step, reordered, report)
    check_coverage(meta, ids, lens, step, metadata, report, whole=reordered)
