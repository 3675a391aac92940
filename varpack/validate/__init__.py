"""``varpack validate``: recompute everything a plan promises, independently, from its files.

Owns the checks of a written plan, one module per check family, run by :func:`validate_plan` in
this order: :mod:`.files` (plan.json's keys and types, rank files as plain declared files inside
the plan, config and layout, checksums and row counts, the plan fingerprint, manifest schema,
parallel list columns), :mod:`.numbering` (steps and micro-batches numbered alike on every rank),
:mod:`.rows` (each micro-batch's shape and budget, the shape rules: rows per shape, shape bound,
pipeline steps, blocks, warm-up prefix, ``shape_lengths``), :mod:`.pieces` (``--oversize
split``: pieces tile their documents, never two of one document in a micro-batch),
:mod:`.coverage` (every sample exactly once per epoch or dropped, against the fingerprint or
``--metadata``), :mod:`.carried`
(each carried ``carry.COL`` value is the metadata's, when the metadata is given), :mod:`.figures`
(step totals and LR factors on every row, per-rank shapes, plan.json's stats), :mod:`.cp`
(``--cp``: placement once per sample, in range, within each CP rank's capacity) and, when asked,
:mod:`.replay` (the input planned again with plan.json's config gives the same rows). A
replanned plan is checked with the plans it continues (:mod:`.lineage`), a blend by its rules
(:mod:`.mixture`: its sources used alike, their share of every step). Each violation is one line of the :class:`Report` naming the rank, step, row or sample id.
Under MPI, :mod:`.parallel` runs the same checks with each rank reading its share of the rank
files (:func:`read_one`), the combined checks through collectives, and the rest on rank 0
(:func:`check_whole`): the same report, line for line.

May import: the ground floor (errors, fingerprint), :mod:`varpack.planfile` to read the plan
(its rows as arrays and its figures recomputed from them: the readers ``replan`` shares),
:mod:`varpack.make`'s readers of an input (:mod:`.carried` reads carried columns as ``varpack
plan`` reads them), :mod:`varpack.sort.agree` and :mod:`varpack.sort.exchange` (under MPI,
:mod:`.parallel` only), and :mod:`varpack.plan`'s rule and figure functions, so that a plan is
checked with the planner's own rules (one source of truth for each rule); replay calls the
planner's entry point :func:`varpack.plan.make_plan`. It never imports the planner's builders'
internals, :mod:`varpack.inspect`, :mod:`varpack.cli` or torch; nothing below it imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.micro import Micro
from varpack.planfile.format import PLAN_VERSION, VERSION, Plan, carried_columns
from varpack.planfile.rankrows import RankRows
from varpack.planfile.recompute import AllRanks, combine, recompute_stats, recompute_tokens
from varpack.planfile.report import Report
from varpack.planfile.schema import absent, checksum_problem
from varpack.validate.carried import check_carried
from varpack.validate.coverage import (
    Found,
    Locator,
    check_coverage,
    check_epochs,
    render_coverage,
)
from varpack.validate.cp import check_cp
from varpack.validate.figures import check_rank_shapes, check_step_columns, compare_stats
from varpack.validate.files import (
    check_files,
    check_fingerprint,
    check_layout,
    open_plan,
    read_config,
    read_rank,
)
from varpack.validate.lineage import check_lineage
from varpack.validate.mixture import check_mix
from varpack.validate.numbering import check_numbering
from varpack.validate.pieces import documents
from varpack.validate.replay import check_replay
from varpack.validate.rows import check_micro_batches, recompute_lengths, shape_lengths

__all__ = ["Inputs", "Report", "validate_plan"]


@dataclass
class Inputs:
    """What a validation checks a plan against besides its own files: ``metadata`` = (ids,
    lens) of the input; ``carry_source``: metadata holding the carried columns, to check their
    values against (``carry_required``: a violation if it does not hold them, else a note in
    the facts); ``parent``: where a replanned plan's parent is, when not where plan.json
    records it."""

    metadata: tuple[np.ndarray, np.ndarray] | None = None
    carry_source: str | os.PathLike[str] | None = None
    carry_required: bool = True
    parent: str | os.PathLike[str] | None = None


def validate_plan(
    path: str | os.PathLike[str],
    metadata: tuple[np.ndarray, np.ndarray] | None = None,
    replay: bool = False,
    carry_source: str | os.PathLike[str] | None = None,
    carry_required: bool = True,
    parent: str | os.PathLike[str] | None = None,
) -> Report:
    """Every check of the module doc; ``metadata`` = (ids, lens) of the input when given;
    ``replay``: plan ``metadata`` again with plan.json's config and compare (needs it);
    ``carry_source``: metadata holding the carried columns, to check their values against
    (``carry_required``: a violation if it does not hold them, else a note in the facts);
    ``parent``: where a replanned plan's parent is, when not where plan.json records it."""
    if replay and metadata is None:
        raise ValueError("replay needs the input's metadata")
    report = Report()
    head = open_checked(path, replay, report)
    if head is None:
        return report
    plan, cfg, lengths = head
    bad_files = check_files(plan, cfg.dp, report)
    check_recorded(plan.meta, not bad_files, replay, report)
    # files, numbering, rows: rank by rank
    read = _read_ranks(plan, cfg, lengths, bad_files, report)
    if read is None:  # the later checks need every rank's rows, well numbered
        return report
    ranks, micros = read
    if replay:
        assert metadata is not None
        check_replay(plan.meta, [rk.table for rk in ranks], metadata, report)
    # figures: the step columns
    whole = combine(ranks, micros, plan.num_steps, cfg)
    check_step_columns(ranks, whole, report)
    inputs = Inputs(metadata, carry_source, carry_required, parent)
    check_whole(plan, cfg, lengths, ranks, whole, inputs, report)
    return report


def open_checked(
    path: str | os.PathLike[str], replay: bool, report: Report
) -> tuple[Plan, PlanConfig, np.ndarray | None] | None:
    """The plan, its config and shape lengths, with plan.json's keys, the rank file names, the
    config and the layout checked; ``None`` when nothing further can be read."""
    # files: plan.json's keys and types, where the rank files are (not a plan: an InputError)
    plan = open_plan(path, report)
    if plan is None:  # nothing may be read: keys missing or rank files outside the plan
        return None
    meta = plan.meta
    if replay and "parent" in meta:
        raise InputError(
            f"{path}: a replanned plan (varpack replan) is not made from its input alone: "
            "validate it without --replay (its parent is checked with it)"
        )
    if replay and "mix" in meta:  # the blend is drawn from a source column --replay lacks
        raise InputError(
            f"{path}: a --mix plan is not re-planned by --replay (the blend is drawn from each "
            "sample's source, which the metadata alone does not give): validate it without "
            "--replay, which checks each source's use of its samples and every step's shares"
        )
    if replay and meta["version"] < PLAN_VERSION:  # its planner is gone: no rows to compare
        raise InputError(
            f"{path}: plan.json is version {meta['version']}, made by an earlier varpack; "
            f"--replay re-plans with this one (version {VERSION}), whose planner may place "
            "samples differently: validate without --replay, or re-run varpack plan"
        )
    cfg = read_config(meta, report)
    if cfg is None:
        return None
    check_layout(meta, cfg, report)
    return plan, cfg, shape_lengths(meta, cfg, report)


def check_recorded(meta: dict[str, Any], files_ok: bool, replay: bool, report: Report) -> None:
    """plan.json's recorded fingerprint and checksum (after the rank files' checksums)."""
    check_fingerprint(meta, files_ok, replay, report)
    if (problem := checksum_problem(meta)) is not None:
        report.add(problem)


def check_whole(
    plan: Plan,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    ranks: list[RankRows],
    whole: AllRanks,
    inputs: Inputs,
    report: Report,
    found: Found | None = None,
) -> None:
    """The checks over the whole plan, after the step columns: coverage, carried values, shape
    lengths, shapes, stats, context parallelism; then the facts of the OK line. ``found``: the
    coverage findings, scanned already (under MPI, by the ranks owning the ids)."""
    meta = plan.meta
    _check_coverage(plan, cfg, ranks, whole, inputs, report, found)
    unchecked: str | None = "give --metadata or --carry-from META"
    if inputs.carry_source is not None:
        unchecked = check_carried(
            meta, ranks, str(inputs.carry_source), report, inputs.carry_required
        )
    # rows: the chosen shape lengths, recomputed
    if cfg.max_shapes is not None and lengths is not None and "parent" not in meta:
        recompute_lengths(cfg, lengths, ranks, whole.sample_step, meta, report)
    # figures: shapes and stats
    check_rank_shapes(meta, whole, report)
    # a replanned plan's figures are its own rows' (no permutation to measure moves against)
    epochs = None if "parent" in meta else meta.get("epochs")
    # a blend (--mix) orders its samples itself: no drawn permutation to measure moves against
    stats = recompute_stats(ranks, whole, lengths, cfg, epochs, moved="mix" not in meta)
    split = cfg.oversize == "split"
    stats["tokens"] = recompute_tokens(meta, ranks, len(meta.get("epochs") or [0]), split)
    later = absent(meta, "stats")  # figures a plan of an earlier version does not hold
    compare_stats(meta.get("stats", {}), {k: v for k, v in stats.items() if k not in later}, report)
    check_cp(meta, ranks, whole, cfg, report)
    report.facts = _facts(meta, cfg, whole, stats, unchecked)


def _check_coverage(
    plan: Plan,
    cfg: PlanConfig,
    ranks: list[RankRows],
    whole: AllRanks,
    inputs: Inputs,
    report: Report,
    found: Found | None,
) -> None:
    """Coverage (split: the pieces tile their documents, which are then covered)."""
    meta, metadata = plan.meta, inputs.metadata
    reordered = cfg.warmup == "reorder"
    split = cfg.oversize == "split"
    if "parent" in meta:  # the run's coverage: this plan's steps and its parents' before
        check_lineage(plan, cfg, (ranks, whole.sample_step), metadata, report, inputs.parent)
    elif "mix" in meta:  # a blend: each source's use of its samples, not once per epoch
        check_mix(meta, ranks, whole, metadata, report)
    elif found is not None:
        check_epochs(meta, report)
        render_coverage(meta, found, Locator(ranks), report)
    else:
        ids, lens, steps = (
            documents(meta, cfg, ranks, whole.sample_step, reordered, report)
            if split
            else (whole.ids, whole.lens, whole.sample_step)
        )
        check_coverage(
            meta,
            ids,
            lens,
            steps,
            metadata,
            report,
            whole=reordered,
            locate=None if split else Locator(ranks),
        )


def _facts(
    meta: dict[str, Any],
    cfg: PlanConfig,
    whole: AllRanks,
    stats: dict[str, Any],
    unchecked: str | None,
) -> dict[str, Any]:
    """The figures of the OK line."""
    return {
        "samples": int(len(whole.lens)),  # rows: pieces of split documents count one each
        # documents: the rows that start one (a --mix blend's drawn samples)
        "documents": int(len(whole.lens) if whole.offsets is None else (whole.offsets == 0).sum()),
        "input_samples": int(meta["input"]["num_samples"]),
        "epochs": len(meta.get("epochs") or [0]),
        "real_tokens": stats["real_tokens"],
        "mix": "mix" in meta,
        "replanned": "parent" in meta,
        "steps": whole.num_steps,
        "dp": cfg.dp,
        "grad_accum": cfg.grad_accum,
        "dropped": len(meta.get("dropped") or []),
        "padding_ratio": stats["padding_ratio"],
        "time_vs_ideal": stats["time_vs_ideal"],
        "time_vs_ideal_by_sync": stats.get("time_vs_ideal_by_sync"),
        "sync": cfg.sync,
        "time_vs_ideal_bound": stats.get("time_vs_ideal_bound"),
        "fill_given_up": stats.get("fill_given_up"),
        "budget_fill": stats["budget_fill"],
        "tokens": stats["tokens"],
        "carried": [name for name, _ in carried_columns(meta)],
        "carry_unchecked": unchecked,
    }


def alone_ids(meta: dict[str, Any]) -> set[int]:
    """The samples plan.json lets exceed the budget alone (``--oversize alone``)."""
    return set(int(i) for i in meta.get("stats", {}).get("oversize_alone", []))


def read_one(
    plan: Plan,
    rank: int,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    alone_ok: set[int],
    reported: bool,
    report: Report,
) -> tuple[RankRows, Micro] | None:
    """One rank's manifest, its numbering and its micro-batches checked; ``None`` if it cannot
    be read or is misnumbered (nothing later could be recomputed from it). ``reported``: its
    file has a violation already."""
    rk = read_rank(plan, rank, cfg, report, reported=reported)
    if rk is None or not check_numbering(rank, rk, plan.num_steps, cfg.grad_accum, report):
        return None
    micro = check_micro_batches(rank, rk, cfg, lengths, alone_ok, report)
    if micro is None:
        return None
    return rk, micro


def _read_ranks(
    plan: Plan, cfg: PlanConfig, lengths: np.ndarray | None, bad_files: set[int], report: Report
) -> tuple[list[RankRows], list[Micro]] | None:
    """Every rank read by :func:`read_one`; ``None`` at the first that cannot be used."""
    alone_ok = alone_ids(plan.meta)
    ranks: list[RankRows] = []
    micros: list[Micro] = []
    for rank in range(cfg.dp):
        got = read_one(plan, rank, cfg, lengths, alone_ok, rank in bad_files, report)
        if got is None:
            return None
        ranks.append(got[0])
        micros.append(got[1])
    return ranks, micros
