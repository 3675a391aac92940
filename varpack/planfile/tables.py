"""The planner's arrays as per-rank manifest tables (Arrow), one rank at a time.

The planner returns arrays and never builds Arrow tables; turning them into the manifest's
columns (names and types from :mod:`varpack.planfile.format`) is the artifact's job, done here
with vectorised gathers. Carried metadata columns come in as :class:`Carried`, their values
aligned with the planned ids (joined by :mod:`varpack.make.carry`), strings as dictionary codes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.plan import PlanArrays
from varpack.plan.segments import gather_positions
from varpack.planfile.format import BASE_SCHEMA, CARRY_TYPES, manifest_schema


@dataclass(frozen=True)
class Carried:
    """Carried columns, each value aligned with a given array of sample ids.

    ``values[k]`` is a NumPy array for numbers and booleans, and int32 dictionary codes into
    ``dictionaries[k]`` (a pyarrow string array) for strings.
    """

    names: tuple[str, ...]
    types: tuple[str, ...]
    values: tuple[np.ndarray, ...]
    dictionaries: tuple[pa.Array | None, ...]

    def entry(self, source: str) -> dict[str, Any]:
        """plan.json's ``carry`` entry: where the values came from and each column's type."""
        return {
            "from": source,
            "columns": [
                {"name": n, "type": t} for n, t in zip(self.names, self.types, strict=True)
            ],
        }

    def column(self, k: int, rows: np.ndarray) -> pa.Array:
        """Column ``k``'s values at ``rows`` (positions in the aligned ids), as a flat Arrow array."""
        picked = self.values[k][rows]
        dictionary = self.dictionaries[k]
        if dictionary is None:
            return pa.array(picked, CARRY_TYPES[self.types[k]])
        return dictionary.take(pa.array(picked, pa.int32()))


def rank_tables(
    *,
    stream: np.ndarray | None,
    ids: np.ndarray,
    lens: np.ndarray,
    offsets: np.ndarray,
    step: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    pad_to: np.ndarray,
    lr: np.ndarray,
    step_tokens: np.ndarray,
    step_samples: np.ndarray,
    dp: int,
    warmup: np.ndarray | None = None,
    pad_rows: np.ndarray | None = None,
    block_index: np.ndarray | None = None,
    stream_lens: np.ndarray | None = None,
    cp_placement: np.ndarray | None = None,
    sample_offsets: np.ndarray | None = None,
    split: bool = False,
    carry: Carried | None = None,
) -> Iterator[pa.Table]:
    """Yield rank 0..dp-1's manifest: one row per micro-batch, in (step, micro) order.

    ``stream`` maps stream positions to rows of ``ids``/``lens`` (``None``: position ``q`` is
    row ``q`` modulo the rows, every epoch streaming them in order); micro-batch ``i`` is stream
    positions ``offsets[i]:offsets[i+1]``. Optional: ``warmup`` flags and ``pad_rows`` per
    micro-batch, ``block_index`` and ``cp_placement`` per stream position (the manifest's
    optional columns); ``stream_lens`` = ``lens[stream]`` if already at hand (saves a random
    gather); ``carry``: carried metadata columns aligned with ``ids`` (one ``carry.COL`` list
    column each); ``split``: the ``sample_offsets`` column, from ``sample_offsets`` per row of
    ``ids`` (None: all 0).
    """
    order = np.lexsort((micro, step, rank))  # every rank holds the same number of micro-batches
    per_rank = len(order) // dp
    for r in range(dp):
        mb = order[r * per_rank : (r + 1) * per_rank]
        counts = offsets[mb + 1] - offsets[mb]
        pos, list_off = gather_positions(offsets[mb], counts)
        rows = pos % len(ids) if stream is None else stream[pos]
        seq_lens = (lens[rows] if stream_lens is None else stream_lens[pos]).astype(np.int32)
        off32 = pa.array(list_off.astype(np.int32))
        s = step[mb]
        columns = [
            pa.array(s, pa.int64()),
            pa.array(micro[mb].astype(np.int32)),
            pa.ListArray.from_arrays(off32, pa.array(ids[rows], pa.int64())),
            pa.ListArray.from_arrays(off32, pa.array(seq_lens)),
            pa.array(pad_to[mb].astype(np.int32)),
            pa.array(lr[s], pa.float64()),
            pa.array(step_tokens[s], pa.int64()),
            pa.array(step_samples[s], pa.int64()),
            pa.array(np.zeros(len(mb), dtype=bool) if warmup is None else warmup[mb]),
        ]
        names = list(BASE_SCHEMA.names)
        if pad_rows is not None:
            columns.append(pa.array(pad_rows[mb].astype(np.int32)))
            names.append("pad_rows")
        if block_index is not None:
            columns.append(
                pa.ListArray.from_arrays(off32, pa.array(block_index[pos].astype(np.int32)))
            )
            names.append("block_index")
        if cp_placement is not None:
            columns.append(pa.ListArray.from_arrays(off32, pa.array(cp_placement[pos], pa.int32())))
            names.append("cp_placement")
        if split:
            offs = np.zeros(len(rows), np.int64) if sample_offsets is None else sample_offsets[rows]
            columns.append(pa.ListArray.from_arrays(off32, pa.array(offs, pa.int64())))
            names.append("sample_offsets")
        pairs: list[tuple[str, str]] = []
        if carry is not None:
            for k, (name, kind) in enumerate(zip(carry.names, carry.types, strict=True)):
                columns.append(pa.ListArray.from_arrays(off32, carry.column(k, rows)))
                pairs.append((name, kind))
        yield pa.Table.from_arrays(columns, schema=manifest_schema(names, pairs))


def plan_tables(
    p: PlanArrays, carry: Carried | None = None, in_order: bool = False
) -> Iterator[pa.Table]:
    """Yield each rank's manifest table of a plan (rank 0 first), with the ``carry`` columns;
    ``in_order``: every epoch streams the plan's rows in their order (``p.stream`` unused)."""
    return rank_tables(
        stream=None if in_order else p.stream,
        ids=p.ids,
        lens=p.lens,
        offsets=p.offsets,
        step=p.step,
        rank=p.rank,
        micro=p.micro_index,
        pad_to=p.micro.pad_to,
        lr=p.lr,
        step_tokens=p.step_tokens,
        step_samples=p.step_samples,
        dp=p.cfg.dp,
        warmup=p.warmup,
        pad_rows=p.pad_rows,
        block_index=p.block_index,
        stream_lens=None if in_order else p.stream_lens,
        cp_placement=p.cp_placement,
        sample_offsets=p.sample_offsets,
        split=p.cfg.oversize == "split",
        carry=carry,
    )
