"""Derive length metadata from a tokenized Parquet dataset (``varpack lengths``).

The dataset is read one row group at a time (memory bounded by a row group, never the dataset):
the length of each sample is the length of its token list (``pc.list_value_length``). Sample ids
come from an id column, or else from the global row position in the sorted file order; the
per-file row offsets come from the footers before any data is read, so the ids do not depend on
how the work is chunked. The output is metadata shards as :mod:`varpack.metadata` reads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyarrow.types as pat
from rich.progress import TaskID

from varpack.atomic import atomic_dir
from varpack.console import progress
from varpack.errors import ConfigError, InputError
from varpack.metadata import (
    ID,
    LEN,
    MAX_LEN,
    WRITE_SCHEMA,
    duplicate_error,
    first_duplicate,
    first_line,
    resolve_files,
    validate_table,
)
from varpack.shards import ShardedWriter, even_sizes

TASK = TaskID(0)  # the one task of varpack.console.progress
DEFAULT_COLUMN = "input_ids"
#: Rows per output shard.
ROWS_PER_SHARD = 10_000_000


@dataclass(frozen=True)
class Source:
    """One input file: its row count, row groups and the global position of its first row."""

    path: str
    num_rows: int
    num_row_groups: int
    row_offset: int


@dataclass(frozen=True)
class LengthsResult:
    """What :func:`derive_lengths` wrote."""

    files: list[Path]
    num_samples: int
    tokens: int


def check_token_schema(schema: pa.Schema, where: str, column: str, id_column: str | None) -> None:
    """The token column is a list; the id column (if any) is an integer column."""
    if schema.get_field_index(column) < 0:
        raise InputError(
            f"{where}: no column '{column}' (columns: {', '.join(schema.names)}); "
            "choose the token column with --column"
        )
    typ = schema.field(column).type
    if not (pat.is_list(typ) or pat.is_large_list(typ) or pat.is_fixed_size_list(typ)):
        raise InputError(
            f"{where}: column '{column}' has type {typ}, expected a list of token ids; "
            "choose the token column with --column"
        )
    if id_column is None:
        return
    if schema.get_field_index(id_column) < 0:
        raise InputError(
            f"{where}: no id column '{id_column}' (columns: {', '.join(schema.names)}); "
            "fix --id-column or leave it out to number rows"
        )
    typ = schema.field(id_column).type
    if not pat.is_integer(typ):
        raise InputError(
            f"{where}: id column '{id_column}' has type {typ}, expected an integer type"
        )


def list_sources(files: Sequence[Path | str], column: str, id_column: str | None) -> list[Source]:
    """Read every footer (schema, rows, row groups) and give each file its global row offset."""
    sources, offset = [], 0
    for path in files:
        try:
            meta = pq.read_metadata(path)
            schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                f"{path}: cannot read as Parquet ({first_line(exc)}); replace or remove the file"
            ) from None
        check_token_schema(schema, str(path), column, id_column)
        sources.append(Source(str(path), meta.num_rows, meta.num_row_groups, offset))
        offset += meta.num_rows
    return sources


def row_lengths(tokens: pa.ChunkedArray | pa.Array, where: str, first_row: int) -> np.ndarray:
    """Lengths (int64) of a list column; a null or empty list is an error naming its row.

    >>> row_lengths(pa.array([[1, 2], [3]]), "x", 0).tolist()
    [2, 1]
    """
    lens = pc.list_value_length(tokens)
    if lens.null_count:
        row = first_row + int(pc.index(pc.is_null(lens), True).as_py())
        raise InputError(f"{where}: row {row}: null token list; drop or fill the sample")
    out = lens.to_numpy().astype(np.int64, copy=False)
    if len(out) and out.min() == 0:
        row = first_row + int(np.argmin(out))
        raise InputError(
            f"{where}: row {row}: empty token list (length 0); drop empty samples first"
        )
    if len(out) and out.max() > MAX_LEN:
        row = first_row + int(np.argmax(out))
        raise InputError(f"{where}: row {row}: {out.max()} tokens exceed {MAX_LEN} (int32)")
    return out


def iter_lengths(
    sources: Sequence[Source], column: str, id_column: str | None
) -> Iterator[tuple[Source, pa.Table]]:
    """Yield, per row group, a validated metadata table (``sample_id``, ``seq_len``)."""
    columns = [column] if id_column is None or id_column == column else [column, id_column]
    for src in sources:
        try:
            reader = pq.ParquetFile(src.path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{src.path}: cannot read as Parquet ({first_line(exc)})") from None
        row = 0
        for group in range(src.num_row_groups):
            try:
                table = reader.read_row_group(group, columns=columns)
            except (OSError, pa.ArrowException) as exc:
                raise InputError(
                    f"{src.path}: cannot read row group {group} ({first_line(exc)}); "
                    "replace or remove the file"
                ) from None
            lens = row_lengths(table.column(column), src.path, row)
            if id_column is None:
                start = src.row_offset + row
                ids = pa.array(np.arange(start, start + len(lens), dtype=np.int64))
            else:
                ids = table.column(id_column)
                if ids.null_count:
                    bad = row + int(pc.index(pc.is_null(ids), True).as_py())
                    raise InputError(f"{src.path}: row {bad}: null in id column '{id_column}'")
            yield src, validate_table(pa.table({ID: ids, LEN: lens}), src.path, row)
            row += len(lens)


def derive_lengths(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    column: str = DEFAULT_COLUMN,
    id_column: str | None = None,
    rows_per_shard: int = ROWS_PER_SHARD,
    overwrite: bool = False,
    quiet: bool = True,
) -> LengthsResult:
    """Write metadata shards for the tokenized dataset ``input`` into ``output`` (atomically).

    With ``id_column`` the ids are checked for uniqueness at the end, which keeps all ids in
    memory (8 bytes per sample, the size of the metadata, not of the dataset).
    """
    if rows_per_shard < 1:
        raise ConfigError(f"--rows-per-shard {rows_per_shard}: need at least one row per shard")
    files = resolve_files(input)
    sources = list_sources(files, column, id_column)
    total = sum(s.num_rows for s in sources)
    if total == 0:
        raise InputError(f"{input}: the dataset holds no rows; nothing to do")
    tokens = 0
    seen: list[np.ndarray] = []
    with (
        atomic_dir(output, overwrite) as tmp,
        progress("lengths", total, quiet) as bar,
        ShardedWriter(tmp, even_sizes(total, rows_per_shard), WRITE_SCHEMA) as writer,
    ):
        for _, table in iter_lengths(sources, column, id_column):
            writer.write(table)
            tokens += int(pc.sum(table.column(LEN)).as_py() or 0)
            if id_column is not None:
                seen.append(table.column(ID).to_numpy())
            bar.advance(TASK, table.num_rows)
        if id_column is not None:
            _check_unique(np.concatenate(seen), sources)
    return LengthsResult([Path(output) / f.name for f in writer.files], total, tokens)


def _check_unique(ids: np.ndarray, sources: Sequence[Source]) -> None:
    dup = first_duplicate(np.sort(ids))
    if dup is None:
        return
    starts = np.array([s.row_offset for s in sources])
    places = []
    for pos in np.flatnonzero(ids == dup)[:2]:
        k = int(np.searchsorted(starts, pos, side="right") - 1)
        places.append(f"{sources[k].path} row {int(pos - starts[k])}")
    raise duplicate_error(dup, places)
