"""Single-process sort of an in-memory metadata table by the ``varpack sort`` ordering rule."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from varpack.sort.keys import KeySpec, encode, is_float_column, local_stats, make_layout


def column_arrays(table: pa.Table, names: Sequence[str]) -> dict[str, np.ndarray]:
    """NumPy views of the named columns (zero-copy where Arrow allows)."""
    return {name: table.column(name).to_numpy() for name in names}


def float_keys(columns: dict[str, np.ndarray], spec: KeySpec) -> tuple[str, ...]:
    return tuple(k for k in spec.keys if is_float_column(columns[k]))


def sort_order(columns: dict[str, np.ndarray], spec: KeySpec) -> np.ndarray:
    """Row order (int64 indices) that sorts the columns by ``spec`` with the id tie-break."""
    floats = float_keys(columns, spec)
    layout = make_layout(spec, local_stats(columns, spec, floats), floats)
    return np.argsort(encode(columns, layout), kind="stable")


def sort_table(
    table: pa.Table, keys: Sequence[str] = ("seq_len",), descending: Sequence[str] = ()
) -> pa.Table:
    """Sort validated metadata by ``keys`` (ties by ``sample_id`` ascending); all columns kept.

    The same rule as the distributed ``varpack sort`` (shared key encoding), in one process.

    >>> t = pa.table({"sample_id": [3, 1, 2], "seq_len": [5, 5, 1]})
    >>> sort_table(t).column("sample_id").to_pylist()
    [2, 1, 3]
    >>> sort_table(t, descending=["seq_len"]).column("sample_id").to_pylist()
    [1, 3, 2]
    """
    spec = KeySpec(tuple(keys), tuple(descending))
    if table.num_rows == 0:
        return table
    return table.take(sort_order(column_arrays(table, spec.fields), spec))
