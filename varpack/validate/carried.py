"""Carried columns: every ``carry.COL`` value is the metadata's value of its sample id.

``varpack validate --metadata META`` (or ``--carry-from META`` when the plan's input is a sort
output) reads the carried columns from the metadata with the same reader ``varpack plan`` uses
(:func:`varpack.make.carry.read_carry_source`), looks every planned sample id up, and
compares value by value, naming the rank, step and sample id of the first few that differ. The
schema check (:mod:`.files`) has already tied each column's name and type to plan.json.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.errors import VarpackError
from varpack.make import path_sources
from varpack.make.carry import join, read_carry_source
from varpack.planfile.format import CARRY_PREFIX, carried_columns
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import SHOW, Report
from varpack.validate.coverage import Locator


def check_carried(
    meta: dict[str, Any],
    ranks: list[RankRows],
    source: str,
    report: Report,
    required: bool = True,
) -> str | None:
    """The carried values of every rank equal the metadata's at ``source``, per sample id.

    Returns why they were not checked (``None``: checked, or nothing carried). ``required``:
    metadata that cannot be read or lacks a carried column is a violation; otherwise (the
    plan's input given as ``--metadata``, which need not hold them) only the reason."""
    names = [name for name, _ in carried_columns(meta)]
    if not names:
        return None
    ids = np.concatenate([rk.ids for rk in ranks]).astype(np.int64)
    paths = (meta.get("mix") or {}).get("paths")  # sources by path: rebuilt from the paths
    try:
        if paths:
            read = [n for n in names if n != path_sources.COLUMN]
            meta_ids, table = path_sources.with_path_sources(
                paths, read_carry_source(source, read) if read else None
            )
            table = table.select(names)
        else:
            meta_ids, table = read_carry_source(source, names)
        want = join(ids, meta_ids, table, source)
    except VarpackError as exc:
        if not required:
            return f"{source} does not hold them; give --carry-from META"
        report.add(f"carried columns cannot be checked against {source}: {exc}")
        return None
    locate = Locator(ranks)
    for k, name in enumerate(names):
        have = pa.concat_arrays([rk.carry[name] for rk in ranks])
        expected = want.column(k, np.arange(len(ids)))
        if have.type != expected.type:  # the schema check reported the manifest's type
            continue
        same = pc.equal(have, expected).to_numpy(zero_copy_only=False)
        if want.types[k] == "float64":  # NaN is a value like any other here
            a = have.to_numpy(zero_copy_only=False)
            b = expected.to_numpy(zero_copy_only=False)
            same |= np.isnan(a) & np.isnan(b)
        bad = np.flatnonzero(~same)
        for pos in bad[:SHOW]:
            report.add(
                f"{locate(np.array([pos]))}: sample {ids[pos]} carries {CARRY_PREFIX}{name} "
                f"{have[pos].as_py()!r}, the metadata {source} says {expected[pos].as_py()!r}"
            )
        if len(bad) > SHOW:
            report.add(f"({len(bad) - SHOW:,} more carried {name} values differ)")
    return None
