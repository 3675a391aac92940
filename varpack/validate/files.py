"""Files and schema: plan.json's keys, config and layout, the rank files, and their columns.

Checks that plan.json has every key with its JSON type (:func:`varpack.planfile.schema.meta_problems`,
one line naming the key and what was expected); that each rank file is a plain file inside the
plan directory and no undeclared ``*.parquet`` file lies beside them (nothing outside the plan is
ever opened); that plan.json's config is valid and its layout matches it; that every rank file is
readable with the checksum and row count plan.json records; that the recorded plan fingerprint
fits the config, input and checksums (a config edited after planning); that each manifest has
exactly the schema its config calls for (the base columns, plus ``pad_rows``, ``block_index``
and ``sample_offsets`` where used, and the ``carry.COL`` columns plan.json's ``carry`` names,
with their types); and that the list columns are parallel (``seq_lens``, ``block_index``,
``sample_offsets`` and the carried columns hold one entry per ``sample_ids`` entry). A rank that
passes is read into :class:`~varpack.planfile.rankrows.RankRows`, the arrays every later check
works on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from varpack.errors import VarpackError
from varpack.plan.config import PlanConfig
from varpack.planfile.format import (
    BASE_SCHEMA,
    Plan,
    carried_columns,
    manifest_schema,
    read_meta,
)
from varpack.planfile.rankfiles import duplicate_names, file_problem
from varpack.planfile.rankrows import RankRows, rank_rows
from varpack.planfile.report import Report
from varpack.planfile.schema import (
    FINGERPRINT_KEY,
    config_of,
    fingerprint_problem,
    meta_problems,
)


def open_plan(path: str | os.PathLike[str], report: Report) -> Plan | None:
    """The plan, if plan.json's keys and types are right and every rank file may be read (a
    plain file inside the plan directory, declared once); else ``None`` with the violations.
    A directory that is not a plan at all (no plan.json, another format or version) is an
    :class:`~varpack.errors.InputError`."""
    meta = read_meta(path)
    problems = meta_problems(meta, full=True)
    if problems:
        report.problems.extend(problems)
        return None
    plan = Plan(Path(path), meta)
    names = [r["file"] for r in meta["ranks"]]
    unsafe = [p for r, n in enumerate(names) if (p := file_problem(plan.path, r, n)) is not None]
    twice = duplicate_names(names)
    report.problems.extend(unsafe)
    for name in twice:
        report.add(f"plan.json declares {name} for more than one rank")
    report.problems.extend(plan.undeclared_files())
    return None if unsafe or twice else plan


def check_fingerprint(meta: dict[str, Any], files_ok: bool, replay: bool, report: Report) -> None:
    """plan.json's recorded fingerprint fits its config, input and checksums; a plan without one
    passes only when ``--replay`` re-plans it (nothing else ties its config to its rows)."""
    if FINGERPRINT_KEY not in meta:
        if not replay:
            report.add(
                f"plan.json has no {FINGERPRINT_KEY} (made by an older varpack, or removed), so "
                "its config cannot be checked against the manifests; re-run varpack plan, or "
                "validate with --metadata INPUT --replay"
            )
        return
    problem = fingerprint_problem(meta, manifests_ok=files_ok)
    if problem is not None and not replay:
        problem += "; --metadata INPUT --replay tells whether this config reproduces the rows"
    if problem is not None:
        report.add(problem)


def read_config(meta: dict[str, Any], report: Report) -> PlanConfig | None:
    """plan.json's config, resolved; ``None`` (one violation) if it is invalid."""
    try:
        return config_of(meta)
    except VarpackError as exc:
        report.add(f"plan.json config is invalid: {exc}")
        return None


def check_layout(meta: dict[str, Any], cfg: PlanConfig, report: Report) -> None:
    """plan.json's layout is the config's (dp, pp, cp, grad_accum)."""
    layout = meta.get("layout", {})
    if layout != {"dp": cfg.dp, "pp": cfg.pp, "cp": cfg.cp, "grad_accum": cfg.grad_accum}:
        report.add(
            f"plan.json layout {layout} does not match the config (dp {cfg.dp}, pp {cfg.pp}, "
            f"cp {cfg.cp}, "
            f"grad_accum {cfg.grad_accum})"
        )


def check_files(plan: Plan, dp: int, report: Report) -> set[int]:
    """Checksums and row counts of every rank file against plan.json; the ranks whose file has
    a problem (empty if all match)."""
    bad = set()
    for rank in range(dp):
        problems = plan.verify_rank(rank)
        report.problems.extend(problems)
        if problems:
            bad.add(rank)
    return bad


def expected_columns(cfg: PlanConfig) -> list[str]:
    """The manifest columns the config calls for, in schema order."""
    names = list(BASE_SCHEMA.names)
    if cfg.uses_pad_rows:
        names.append("pad_rows")
    if cfg.batching == "blocks":
        names.append("block_index")
    if cfg.cp > 1:
        names.append("cp_placement")
    if cfg.oversize == "split":
        names.append("sample_offsets")
    return names


def read_rank(
    plan: Plan, rank: int, cfg: PlanConfig, report: Report, reported: bool = False
) -> RankRows | None:
    """One rank's manifest, its schema and parallel lists checked; ``None`` if it cannot be used.

    ``reported``: the file already has a violation (:func:`check_files`); an unreadable one is
    then not reported twice."""
    try:
        table = plan.rank_table(rank, verify=False)
    except (OSError, pa.ArrowException, VarpackError) as exc:
        if not reported:
            report.add(f"rank {rank}: cannot read its manifest ({exc})")
        return None
    expected = manifest_schema(expected_columns(cfg), carried_columns(plan.meta))
    if table.schema != expected:
        report.add(
            f"rank {rank}: manifest schema {table.schema.to_string()!r} is not {expected.to_string()!r}"
        )
        return None
    return rank_rows(table, rank, plan.meta, report)
