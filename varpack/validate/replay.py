"""Replay: plan the input again with plan.json's config and compare with the plan on disk.

The plan contract says plan.json's config reproduces the plan: the same input planned with it
gives the same manifests. ``varpack validate --metadata INPUT --replay`` checks exactly that, by
running the planner (:func:`varpack.plan.make_plan`, the same call ``varpack plan`` makes) and
comparing each rank's manifest row by row (by content, so a pyarrow release that encodes the same
rows in other bytes still passes), and plan.json's step count, epochs, shape lengths and dropped
samples. It takes about as long, and as much memory, as ``varpack plan`` on that input.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.plan import make_plan
from varpack.planfile.format import CARRY_PREFIX, manifest_schema
from varpack.planfile.report import SHOW, Report
from varpack.planfile.schema import config_of
from varpack.planfile.tables import plan_tables

#: plan.json keys the planner decides from config + input (stats are recomputed elsewhere)
_DECIDED = ("layout", "num_steps", "epochs", "shape_lengths", "dropped")
_ADVICE = "plan.json's config did not make this plan; re-run varpack plan with the options you want"


def check_replay(
    meta: dict[str, Any],
    tables: list[pa.Table],
    metadata: tuple[np.ndarray, np.ndarray],
    report: Report,
) -> None:
    """Re-plan ``metadata`` (ids, lens in sort order) with plan.json's config; one violation per
    differing plan.json key and per rank (the first few) whose rows differ."""
    ids, lens = metadata
    cfg = config_of(meta)
    arrays, again, _ = make_plan(ids, lens, cfg)
    for key in _DECIDED:
        if json.loads(json.dumps(again.get(key))) != meta.get(key):  # as plan.json holds it
            report.add(f"replay: plan.json {key} differs from the re-planned one; {_ADVICE}")
    differ = 0
    for rank, (have, want) in enumerate(zip(tables, plan_tables(arrays), strict=False)):
        # carried columns come from the metadata, not the config: --metadata checks them
        have = have.drop_columns([n for n in have.column_names if n.startswith(CARRY_PREFIX)])
        schema = manifest_schema(want.column_names)
        found = first_difference(have, want.select(schema.names).cast(schema))
        if found is None:
            continue
        differ += 1
        if differ <= SHOW:
            report.add(f"replay: rank {rank} {found}; {_ADVICE}")
    if differ > SHOW:
        report.add(f"replay: (and {differ - SHOW} more ranks differ)")
    if len(tables) != cfg.dp:
        report.add(f"replay: the config plans {cfg.dp} ranks, the plan has {len(tables)}")


def first_difference(have: pa.Table, want: pa.Table) -> str | None:
    """Where a manifest first differs from the re-planned one (``None``: the same rows)."""
    if have.column_names != want.column_names:
        return f"has columns {have.column_names}, the re-planned manifest {want.column_names}"
    if have.num_rows != want.num_rows:
        return f"has {have.num_rows} micro-batches, the re-planned manifest {want.num_rows}"
    first, column = have.num_rows, ""
    for name in have.column_names:
        a, b = have.column(name).combine_chunks(), want.column(name).combine_chunks()
        if a.equals(b):
            continue
        row = _first_row(a, b)
        if row < first:
            first, column = row, name
    if not column:
        return None
    step = have.column("step")[first].as_py()
    return f"row {first} (step {step}) differs from the re-planned manifest in {column}"


def _first_row(a: pa.Array, b: pa.Array) -> int:
    """The first row at which two equally long columns differ (flat or list columns)."""
    if not pa.types.is_list(a.type):
        va, vb = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(va != vb)
        return int(bad[0]) if len(bad) else len(va)
    oa, ob = a.offsets.to_numpy(), b.offsets.to_numpy()
    oa, ob = oa - oa[0], ob - ob[0]
    counts = np.flatnonzero(np.diff(oa) != np.diff(ob))
    row = int(counts[0]) if len(counts) else len(a)
    end = int(oa[row])  # items before ``row`` sit at the same places in both
    va = a.flatten().to_numpy(zero_copy_only=False)[:end]
    vb = b.flatten().to_numpy(zero_copy_only=False)[:end]
    bad = np.flatnonzero(va != vb)
    if len(bad):
        row = min(row, int(np.searchsorted(oa, bad[0], side="right") - 1))
    return row
