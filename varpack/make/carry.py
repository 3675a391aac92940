"""Carried columns: metadata columns (a ``source``, a language, a score) taken into the manifests.

``varpack plan --carry COL`` adds one list column ``carry.COL`` per carried column to every rank
manifest, parallel to ``sample_ids``: the value of each planned sample, looked up by sample id in
the metadata. The planner never sees these values (it stays pure); they are joined here, at the
manifest edge, once per plan: the metadata's ids are sorted once, each planned id is found with
one ``searchsorted``, and every column is gathered with one ``take``. Only the id column and the
carried columns are read (pyarrow datasets, column projection).

Types come from the metadata: integers become ``int64``, floats ``float64``, booleans ``bool`` and
strings ``string`` (dictionary-encoded strings too); nested and other types are refused. Strings
are held as dictionary codes until a rank's table is built, so a plan of many samples gathers
integers, not strings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.types as pat

from varpack.errors import ConfigError, InputError
from varpack.metadata.contract import first_line
from varpack.metadata.footer import footer_rows
from varpack.planfile.format import CARRY_PREFIX, CARRY_TYPES
from varpack.planfile.tables import Carried

#: Id columns a carry source may key its rows by, in order of preference.
ID_COLUMNS = ("sample_id", "id")
#: Columns the manifest already holds (``sample_ids``, ``seq_lens``); carrying them is refused.
RESERVED = ("sample_id", "seq_len")


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """The carried names, refused when empty, repeated or a column the manifest already has."""
    seen: set[str] = set()
    for name in names:
        if not name:
            raise ConfigError("--carry needs a column name")
        if name in RESERVED:
            raise ConfigError(
                f"--carry {name}: the manifest already holds it (sample_ids, seq_lens); carry "
                "other metadata columns"
            )
        if name in seen:
            raise ConfigError(f"--carry {name} is given twice; name each column once")
        seen.add(name)
    return tuple(names)


def carry_type(name: str, typ: pa.DataType, where: str) -> str:
    """The manifest type of a carried metadata column (``int64``, ``float64``, ``bool``, ``string``)."""
    if pat.is_dictionary(typ):
        typ = typ.value_type
    if pat.is_integer(typ):
        return "int64"
    if pat.is_floating(typ):
        return "float64"
    if pat.is_boolean(typ):
        return "bool"
    if pat.is_string(typ) or pat.is_large_string(typ):
        return "string"
    kind = "a nested type" if pat.is_nested(typ) else "a type that cannot be carried"
    raise InputError(
        f"{where}: column '{name}' has type {typ}, {kind}; --carry takes integer, float, boolean "
        "or string columns"
    )


def source_dataset(path: str | os.PathLike[str]) -> tuple[ds.Dataset, list[Path]]:
    """The Parquet files of ``path`` as one dataset (footers only)."""
    from varpack.metadata.contract import first_line, resolve_files

    files = resolve_files(str(path))
    try:
        return ds.dataset([str(f) for f in files], format="parquet"), files
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot read as Parquet ({first_line(exc)})") from None


def source_id_column(
    dataset: ds.Dataset, files: list[Path], names: Sequence[str], where: str
) -> str:
    """Check every file holds an id column and the carried columns; the id column's name."""
    for frag, path in zip(dataset.get_fragments(), files, strict=True):
        schema = frag.physical_schema
        have = schema.names
        id_col = next((c for c in ID_COLUMNS if c in have), None)
        if id_col is None or not pat.is_integer(schema.field(id_col).type):
            raise InputError(
                f"{path}: no integer id column ({' or '.join(ID_COLUMNS)}) to join --carry on "
                f"(columns: {', '.join(have)}); give --carry-from the metadata"
            )
        for name in names:
            if name not in have:
                raise InputError(
                    f"{path}: --carry {name}: no such column (columns: {', '.join(have)}); "
                    f"--carry-from the tokenized data that holds it, or make the metadata with "
                    f"varpack lengths --keep {name}"
                )
            carry_type(name, schema.field(name).type, str(path))
        footer_rows(path, frag.metadata, [id_col, *names])  # the checks of every metadata reader
    return next(c for c in ID_COLUMNS if c in dataset.schema.names)


def read_carry_source(
    path: str | os.PathLike[str], names: Sequence[str]
) -> tuple[np.ndarray, pa.Table]:
    """The id column (int64) and the carried columns of the metadata at ``path``, nulls refused."""
    where = str(path)
    dataset, files = source_dataset(path)
    id_col = source_id_column(dataset, files, names, where)
    table = dataset.to_table(columns=[id_col, *names])
    ids = table.column(id_col).cast(pa.int64()).to_numpy()
    for name in names:
        col = table.column(name)
        if col.null_count:
            first = int(pc.index(pc.is_null(col), True).as_py())
            raise null_error(where, name, col.null_count, id_col, int(ids[first]))
    return ids, table.select(list(names))


def null_error(where: str, name: str, count: int, id_col: str, first: int) -> InputError:
    return InputError(
        f"{where}: column '{name}' holds {count:,} null(s) (the first at {id_col} {first}); a "
        "carried column needs a value for every sample"
    )


def empty_error(where: str) -> InputError:
    return InputError(f"{where}: the metadata holds no rows; nothing to carry")


def repeated_error(where: str, sample_id: int) -> InputError:
    return InputError(
        f"{where}: sample id {sample_id} appears more than once; a carried value must belong to "
        "one sample"
    )


def missing_error(where: str, first: int, count: int) -> InputError:
    return InputError(
        f"{where}: planned sample id {first}"
        + (f" (and {count - 1:,} more)" if count > 1 else "")
        + " is not in the metadata; give --carry-from the metadata this plan's input came from"
    )


def join(ids: np.ndarray, meta_ids: np.ndarray, table: pa.Table, where: str) -> Carried:
    """The columns of ``table`` (rows keyed by ``meta_ids``) aligned with ``ids`` (which may
    repeat an id); an id of ``ids`` missing from ``meta_ids``, or a repeated metadata id, is an
    InputError."""
    if len(meta_ids) == 0 and len(ids):
        raise empty_error(where)
    order = np.argsort(meta_ids, kind="stable")
    sorted_ids = meta_ids[order]
    twice = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(twice):
        raise repeated_error(where, int(sorted_ids[twice[0]]))
    rows = rows_of(meta_ids, ids, order)
    missing = rows < 0
    if missing.any():
        lost = ids[missing]
        raise missing_error(where, int(lost[0]), len(lost))
    types, values, dictionaries = [], [], []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        kind = carry_type(name, col.type, where)
        types.append(kind)
        if kind == "string":
            encoded = pc.dictionary_encode(
                col.cast(pa.string()) if pat.is_dictionary(col.type) else col
            )
            codes = encoded.indices.to_numpy().astype(np.int32)
            values.append(codes[rows])
            dictionaries.append(encoded.dictionary.cast(pa.string()))
        else:
            try:
                cast = col.cast(CARRY_TYPES[kind])
            except pa.ArrowInvalid as exc:  # e.g. a uint64 value beyond int64
                raise InputError(
                    f"{where}: column '{name}' cannot be carried as {CARRY_TYPES[kind]} "
                    f"({first_line(exc)}); rescale or re-encode the column"
                ) from None
            values.append(cast.to_numpy(zero_copy_only=False)[rows])
            dictionaries.append(None)
    return Carried(tuple(table.column_names), tuple(types), tuple(values), tuple(dictionaries))


def sorted_lookup(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(keys, queries)`` by sorted queries: a binary search per query in random
    order misses the cache at every step; in sorted order it walks ``keys`` once.

    >>> sorted_lookup(np.array([2, 5, 9]), np.array([9, 2, 5])).tolist()
    [2, 0, 1]
    """
    order = np.argsort(queries, kind="stable")
    pos = np.empty(len(queries), dtype=np.int64)
    pos[order] = np.searchsorted(keys, queries[order])
    return pos


def rows_of(keys: np.ndarray, queries: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """The row of ``keys`` holding each query (-1: none). Ids dense enough (the largest under
    4 x the rows, as row numbers or ``3 * i + 1`` are) take a direct int32 table (at most 16
    bytes a row); others a sort (``order``: ``keys``' sorting order, where the caller has it).

    >>> rows_of(np.array([7, 1, 4]), np.array([4, 7, 5, 10**6])).tolist()
    [2, 0, -1, -1]
    >>> rows_of(np.array([10**12, 5]), np.array([5, 10**12, 3])).tolist()  # sparse: by sorting
    [1, 0, -1]
    """
    if len(queries) == 0:
        return np.zeros(0, dtype=np.int64)
    if 0 < len(keys) < 2**31 and keys.min() >= 0 and queries.min() >= 0:
        top = int(keys.max()) + 1
    else:
        top = 0
    if 0 < top <= 4 * len(keys) + 1024:
        table = np.full(top, -1, dtype=np.int32)
        table[keys] = np.arange(len(keys), dtype=np.int32)
        out = table[np.minimum(queries, top - 1)].astype(np.int64)
        out[queries >= top] = -1
        return out
    order = np.argsort(keys, kind="stable") if order is None else order
    pos = np.minimum(sorted_lookup(keys[order], queries), len(order) - 1)
    return np.where(keys[order][pos] == queries, order[pos], -1)


def carry_columns(path: str | os.PathLike[str], names: Sequence[str], ids: np.ndarray) -> Carried:
    """Read ``names`` from the metadata at ``path`` and align them with ``ids`` (see :func:`join`)."""
    meta_ids, table = read_carry_source(path, check_names(names))
    return join(ids, meta_ids, table, str(path))


def manifest_name(name: str) -> str:
    """The manifest column of a carried column.

    >>> manifest_name("source")
    'carry.source'
    """
    return CARRY_PREFIX + name
