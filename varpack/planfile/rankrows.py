"""A rank file's rows as arrays: what every reader of a plan's manifests works on.

:func:`rank_rows` turns one rank's manifest table into :class:`RankRows` (per micro-batch: step,
micro, offsets into the samples; per planned sample: id, length, offset, carried values), its list
columns checked to be parallel, steps counted from the plan's first. ``validate`` checks these
arrays; ``replan`` recomputes a child's figures from them (:mod:`varpack.planfile.recompute`), so
both read a manifest alike. :func:`name_codes` reads a carried string column as positions in a list
of names (a blend's sources).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.planfile.format import CARRY_PREFIX, carried_columns
from varpack.planfile.report import Report


@dataclass
class RankRows:
    """One rank's manifest as arrays: per micro-batch, and per planned sample (``offsets``)."""

    step: np.ndarray
    micro: np.ndarray
    offsets: np.ndarray
    ids: np.ndarray
    lens: np.ndarray
    table: pa.Table
    pad_rows: np.ndarray
    block_index: np.ndarray | None
    warmup: np.ndarray
    sample_offsets: np.ndarray | None = None  # per planned sample (--oversize split)
    carry: dict[str, pa.Array] = field(default_factory=dict)  # name -> flat values, like ids


def rank_rows(table: pa.Table, rank: int, meta: dict[str, Any], report: Report) -> RankRows | None:
    """A manifest table as :class:`RankRows`, its list columns checked to be parallel; steps
    counted from the plan's first (a replanned plan's manifests number the run's steps)."""
    ids_col = table.column("sample_ids").combine_chunks()
    lens_col = table.column("seq_lens").combine_chunks()
    off_ids = ids_col.offsets.to_numpy().astype(np.int64)
    off_lens = lens_col.offsets.to_numpy().astype(np.int64)
    if not np.array_equal(off_ids, off_lens):
        bad = np.flatnonzero(np.diff(off_ids) != np.diff(off_lens))
        report.examples(f"rank {rank}: sample_ids and seq_lens differ in length at rows", bad)
        return None
    block_index = None
    if "block_index" in table.column_names:
        bcol = table.column("block_index").combine_chunks()
        off_b = bcol.offsets.to_numpy().astype(np.int64)
        if not np.array_equal(off_b, off_ids):
            report.add(f"rank {rank}: block_index lists are not parallel to sample_ids")
            return None
        block_index = bcol.flatten().to_numpy().astype(np.int64)
    sample_offsets = None
    if "sample_offsets" in table.column_names:
        ocol = table.column("sample_offsets").combine_chunks()
        if not np.array_equal(ocol.offsets.to_numpy().astype(np.int64), off_ids):
            report.add(f"rank {rank}: sample_offsets lists are not parallel to sample_ids")
            return None
        sample_offsets = ocol.flatten().to_numpy().astype(np.int64)
    carry = {}
    for name, _ in carried_columns(meta):
        ccol = table.column(CARRY_PREFIX + name).combine_chunks()
        if not np.array_equal(ccol.offsets.to_numpy().astype(np.int64), off_ids):
            report.add(f"rank {rank}: {CARRY_PREFIX}{name} lists are not parallel to sample_ids")
            return None
        carry[name] = ccol.flatten()
    pad_rows = (
        table.column("pad_rows").to_numpy().astype(np.int64)
        if "pad_rows" in table.column_names
        else np.zeros(table.num_rows, np.int64)
    )
    parent = meta.get("parent")
    first = int(parent["from_step"]) if isinstance(parent, dict) else 0
    return RankRows(
        step=table.column("step").to_numpy() - first,
        micro=table.column("micro").to_numpy().astype(np.int64),
        offsets=off_ids - off_ids[0],
        ids=ids_col.flatten().to_numpy(),
        lens=lens_col.flatten().to_numpy().astype(np.int64),
        table=table,
        pad_rows=pad_rows,
        block_index=block_index,
        warmup=table.column("warmup").to_numpy(zero_copy_only=False).astype(bool),
        sample_offsets=sample_offsets,
        carry=carry,
    )


def name_codes(values: pa.Array | pa.ChunkedArray, names: Sequence[str]) -> np.ndarray:
    """Each value's position in ``names`` (-1: another name), for a string, dictionary or
    integer column: one dictionary encoding, no Python object per row.

    >>> name_codes(pa.array(["b", "a", "c", "b"]), ["a", "b"]).tolist()
    [1, 0, -1, 1]
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(pc.cast(values, pa.string()))
    index = {n: k for k, n in enumerate(names)}
    lut = np.array([index.get(n, -1) for n in encoded.dictionary.to_pylist()] + [-1], np.int64)
    return lut[encoded.indices.to_numpy(zero_copy_only=False)]
