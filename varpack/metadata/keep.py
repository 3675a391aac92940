"""Columns kept in the metadata: ``varpack lengths --keep source --keep score``.

A tokenized dataset often carries per-sample columns a plan needs later: a ``source`` to log the
loss by, a ``lang`` or quality ``score`` to select by (``plan --where``), a column to carry into
the manifests (``plan --carry``). ``--keep COL`` copies such a column, row for row, into the
metadata ``lengths`` writes, so the metadata is the one place they are read from.

A kept column has one type in the metadata whatever each file stores: integers as int64, floats
as float64, booleans as bool, strings (plain, large or dictionary-encoded) as string. Refused in
one line, before anything is written: a column that a file lacks (naming the columns it has),
another type (nested, binary, a timestamp), the token or id column, ``sample_id`` and
``seq_len`` (the metadata's own), and a column named twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.types as pat

from varpack.errors import ConfigError, InputError

#: The metadata's own columns, which a kept column may not shadow.
OWN = ("sample_id", "seq_len")


def kept_type(typ: pa.DataType) -> pa.DataType | None:
    """The metadata type of a kept column stored as ``typ`` (``None``: not keepable).

    >>> kept_type(pa.int32()), kept_type(pa.dictionary(pa.int8(), pa.string())), kept_type(pa.list_(pa.int8()))
    (DataType(int64), DataType(string), None)
    """
    if pat.is_dictionary(typ):
        typ = typ.value_type
    if pat.is_integer(typ):
        return pa.int64()
    if pat.is_floating(typ):
        return pa.float64()
    if pat.is_boolean(typ):
        return pa.bool_()
    if pat.is_string(typ) or pat.is_large_string(typ):
        return pa.string()
    return None


def check_names(names: Sequence[str], column: str, id_column: str | None) -> tuple[str, ...]:
    """The names to keep, refused where they would clash."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"--keep {name}: named twice")
        if name in OWN or name in (column, id_column):
            what = "the metadata's own column" if name in OWN else "the token or id column"
            raise ConfigError(f"--keep {name}: {what}; keep other columns (source, lang, score)")
        seen.add(name)
    return tuple(names)


def check_schema(schema: pa.Schema, names: Sequence[str], where: str) -> None:
    """Every kept column is in ``schema`` with a keepable type."""
    for name in names:
        if schema.get_field_index(name) < 0:
            raise InputError(
                f"{where}: --keep {name}: no such column (columns: {', '.join(schema.names)})"
            )
        typ = schema.field(name).type
        if kept_type(typ) is None:
            raise InputError(
                f"{where}: --keep {name}: type {typ}; keep integer, float, boolean or string "
                "columns"
            )


def schema_with(base: pa.Schema, names: Sequence[str], first: pa.Schema) -> pa.Schema:
    """The metadata's schema: ``base`` then each kept column in its metadata type."""
    fields = [pa.field(n, kept_type(first.field(n).type)) for n in names]
    return pa.schema([*base, *fields])


def kept_columns(table: pa.Table, names: Sequence[str]) -> dict[str, pa.ChunkedArray]:
    """The kept columns of one row group, each cast to its metadata type."""
    out = {}
    for name in names:
        col = table.column(name)
        if pat.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        target = kept_type(col.type)
        assert target is not None  # check_schema refused the rest
        out[name] = col.cast(target)
    return out
