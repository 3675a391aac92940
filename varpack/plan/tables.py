"""Per-rank manifest tables (Arrow), built with vectorised gathers, one rank at a time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from varpack.manifest import BASE_SCHEMA, manifest_schema


def gather_positions(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges ``starts[i] .. starts[i]+counts[i]-1`` and the list offsets.

    >>> pos, off = gather_positions(np.array([5, 0]), np.array([2, 3]))
    >>> pos.tolist(), off.tolist()
    ([5, 6, 0, 1, 2], [0, 2, 5])
    """
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    shift = np.repeat(starts - offsets[:-1], counts)
    return shift + np.arange(offsets[-1], dtype=np.int64), offsets


def rank_tables(
    *,
    stream: np.ndarray,
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
) -> Iterator[pa.Table]:
    """Yield rank 0..dp-1's manifest: one row per micro-batch, in (step, micro) order.

    ``stream`` maps stream positions to rows of ``ids``/``lens``; micro-batch ``i`` is stream
    positions ``offsets[i]:offsets[i+1]``. Optional: ``warmup`` flags and ``pad_rows`` per
    micro-batch, ``block_index`` per stream position (the manifest's optional columns);
    ``stream_lens`` = ``lens[stream]`` if already at hand (saves a random gather).
    """
    order = np.lexsort((micro, step, rank))  # every rank holds the same number of micro-batches
    per_rank = len(order) // dp
    for r in range(dp):
        mb = order[r * per_rank : (r + 1) * per_rank]
        counts = offsets[mb + 1] - offsets[mb]
        pos, list_off = gather_positions(offsets[mb], counts)
        rows = stream[pos]
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
        yield pa.Table.from_arrays(columns, schema=manifest_schema(names))
