"""Derive length metadata from a tokenized Parquet dataset (``varpack lengths``).

The dataset is read one row group at a time (memory bounded by a row group, never the dataset):
the length of each sample is the length of its token list (``pc.list_value_length``). Sample ids
come from an id column, or else from the global row position in the sorted file order; the
per-file row offsets come from the footers before any data is read, so the ids do not depend on
how the work is chunked. The output is metadata shards as :mod:`varpack.metadata.contract` reads them.

The same pass can also write the memory-mappable token copy of :mod:`varpack.metadata.tokens`
(``--arrow-copy``), keyed by exactly these ids; :func:`write_arrow_tokens` writes the copy alone.
Outputs are atomic: on any error neither the metadata nor the copy exists.
"""

from __future__ import annotations

import contextlib
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

from varpack.atomic import atomic_dir, atomic_file, check_output, remove
from varpack.console import progress
from varpack.errors import ConfigError, InputError
from varpack.metadata import keep as kept
from varpack.metadata import token_index, vision
from varpack.metadata.contract import (
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
from varpack.metadata.footer import check_read, footer_rows
from varpack.metadata.shards import ShardedWriter, even_sizes
from varpack.metadata.tokens import TokenCopyWriter, is_token_copy

TASK = TaskID(0)  # the one task of varpack.console.progress
DEFAULT_COLUMN = "input_ids"
#: The id columns ``--id-column auto`` takes, in this order (the torch reader looks for the same).
ID_COLUMNS = ("sample_id", "id")
AUTO = "auto"
#: Rows per output shard.
ROWS_PER_SHARD = 10_000_000


@dataclass(frozen=True)
class Source:
    """One input file: its row count, row groups, the global position of its first row and the
    type of one token (the value type of the token lists)."""

    path: str
    num_rows: int
    num_row_groups: int
    row_offset: int
    token_type: pa.DataType


@dataclass(frozen=True)
class LengthsResult:
    """What :func:`derive_lengths` wrote."""

    files: list[Path]
    num_samples: int
    tokens: int
    id_column: str | None = None  # the column the ids came from (None: row positions)


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
    if not pat.is_integer(typ.value_type):  # floats would be truncated, strings never read
        raise InputError(
            f"{where}: column '{column}' holds {typ.value_type} values, expected integer token "
            "ids (a list of int32 or int64); tokenize the text first, or choose --column"
        )
    if id_column is None:
        return
    if schema.get_field_index(id_column) < 0:
        raise InputError(
            f"{where}: no id column '{id_column}' (columns: {', '.join(schema.names)}); "
            "fix --id-column, or pass --number-rows to number the rows"
        )
    typ = schema.field(id_column).type
    if not pat.is_integer(typ):
        raise InputError(
            f"{where}: id column '{id_column}' has type {typ}, expected an integer type"
        )


def pick_id_column(schema: pa.Schema, id_column: str | None) -> str | None:
    """``id_column`` as given, or for ``"auto"`` the first of :data:`ID_COLUMNS` that holds
    integers; None (number the rows) when there is none.

    >>> pick_id_column(pa.schema([("id", pa.int64()), ("input_ids", pa.list_(pa.int32()))]), AUTO)
    'id'
    >>> pick_id_column(pa.schema([("id", pa.string())]), AUTO) is None  # not an integer id
    True
    """
    if id_column != AUTO:
        return id_column
    names = schema.names
    return next(
        (c for c in ID_COLUMNS if c in names and pat.is_integer(schema.field(c).type)), None
    )


def list_sources(
    files: Sequence[Path | str],
    column: str,
    id_column: str | None,
    keep: Sequence[str] = (),
    grids: Sequence[str] = (),
) -> list[Source]:
    """Read every footer (schema, rows, row groups) and give each file its global row offset;
    the ``keep`` columns (:mod:`.keep`) and the ``grids`` columns are checked to be there."""
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
        kept.check_schema(schema, keep, str(path))
        vision.check_grid_schema(schema, grids, str(path))
        footer_rows(path, meta, [c for c in (column, id_column, *keep, *grids) if c], loaded=1)
        token_type = schema.field(column).type.value_type
        sources.append(Source(str(path), meta.num_rows, meta.num_row_groups, offset, token_type))
        offset += meta.num_rows
    return sources


def check_token_values(tokens: pa.ChunkedArray | pa.Array, where: str, first_row: int) -> None:
    """No null, no negative token id inside the lists (an embedding has no row for them), and
    none beyond int64 (the reader's and torch's index type).

    >>> check_token_values(pa.chunked_array([[[1, None]]]), "x", 5)
    Traceback (most recent call last):
    varpack.errors.InputError: x: row 5: a null token id in the token list; fill or drop the sample
    """
    values = pc.list_flatten(tokens)
    bad = pc.is_null(values) if values.null_count else None
    what = "a null token id in the token list; fill or drop the sample"
    if bad is None and len(values) and pc.min(values).as_py() < 0:
        bad = pc.less(values, 0)
        what = "a negative token id; token ids are >= 0 (check the tokenizer's output)"
    limit = np.iinfo(np.int64).max
    if (
        bad is None
        and len(values)
        and pat.is_uint64(values.type)
        and pc.max(values).as_py() > limit
    ):
        bad = pc.greater(values, pa.scalar(limit, values.type))
        what = f"a token id over {limit:,} (int64); token ids index an embedding: re-tokenize"
    if bad is None:
        return
    at = int(pc.index(bad, True).as_py())  # the value's position, then the row holding it
    rows = np.cumsum(pc.list_value_length(tokens).fill_null(0).to_numpy())
    row = first_row + int(np.searchsorted(rows, at, side="right"))
    raise InputError(f"{where}: row {row}: {what}")


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


def iter_row_groups(
    sources: Sequence[Source],
    column: str,
    id_column: str | None,
    keep: Sequence[str] = (),
    grids: Sequence[str] = (),
) -> Iterator[tuple[Source, pa.Table, pa.ChunkedArray]]:
    """Yield, per row group, its validated metadata table (``sample_id``, ``seq_len``, then the
    ``keep`` columns, then ``vision_patches`` from the ``grids`` columns) and its token column.
    The one place that reads the tokens and numbers the samples."""
    columns = [column] if id_column is None or id_column == column else [column, id_column]
    columns += [c for c in (*keep, *grids) if c not in columns]
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
            tokens = table.column(column)
            check_read(src.path, reader.metadata, group, column, tokens)  # all its pages hold
            lens = row_lengths(tokens, src.path, row)
            check_token_values(tokens, src.path, row)
            if id_column is None:
                start = src.row_offset + row
                ids = pa.array(np.arange(start, start + len(lens), dtype=np.int64))
            else:
                ids = table.column(id_column)
                if ids.null_count:
                    bad = row + int(pc.index(pc.is_null(ids), True).as_py())
                    raise InputError(f"{src.path}: row {bad}: null in id column '{id_column}'")
            meta = validate_table(pa.table({ID: ids, LEN: lens}), src.path, row)
            for name, col in kept.kept_columns(table, keep).items():
                meta = meta.append_column(name, col)
            if grids:
                meta = meta.append_column(
                    vision.VISION, vision.grid_patch_lists(table, grids, src.path, row)
                )
            yield src, meta, tokens
            row += len(lens)


def iter_lengths(
    sources: Sequence[Source], column: str, id_column: str | None
) -> Iterator[tuple[Source, pa.Table]]:
    """Yield, per row group, a validated metadata table (``sample_id``, ``seq_len``)."""
    for src, meta, _ in iter_row_groups(sources, column, id_column):
        yield src, meta


def derive_lengths(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    column: str = DEFAULT_COLUMN,
    id_column: str | None = None,
    rows_per_shard: int = ROWS_PER_SHARD,
    overwrite: bool = False,
    quiet: bool = True,
    arrow_copy: str | os.PathLike[str] | None = None,
    keep: Sequence[str] = (),
    grids: Sequence[str] = (),
) -> LengthsResult:
    """Write metadata shards for the tokenized dataset ``input`` into ``output`` (atomically).

    ``keep`` names columns of the dataset to copy into the metadata, row for row
    (:mod:`varpack.metadata.keep`). ``grids``: columns of each sample's ``[t, h, w]`` image
    grids (``image_grid_thw``), written as ``vision_patches`` (:mod:`varpack.metadata.vision`).
    With ``arrow_copy``, the same pass also writes the memory-mappable token copy there
    (:mod:`varpack.metadata.tokens`); either both outputs are published or neither is.
    With ``id_column`` the ids are checked for uniqueness at the end, which keeps all ids in
    memory (8 bytes per sample, the size of the metadata, not of the dataset); ``"auto"`` takes
    the first integer column of :data:`ID_COLUMNS`, else numbers the rows.
    """
    if rows_per_shard < 1:
        raise ConfigError(f"--rows-per-shard {rows_per_shard}: need at least one row per shard")
    files = resolve_files(input)
    inputs = [*files, *_given_dirs(input)]
    check_output(output, overwrite, inputs)
    if arrow_copy is not None:
        _check_apart(output, arrow_copy)
        check_output(arrow_copy, overwrite, inputs, is_token_copy)
        check_output(token_index.index_path(arrow_copy), overwrite, inputs, token_index.is_index)
    kept.check_names(keep, column, None if id_column == AUTO else id_column)
    vision.check_grid_names(grids, (column, None if id_column == AUTO else id_column, *keep))
    sources, id_column = _sources(input, column, id_column, files, keep, grids)
    keep = kept.check_names(keep, column, id_column)  # the id column "auto" chose
    vision.check_grid_names(grids, (column, id_column, *keep))
    schema = kept.schema_with(WRITE_SCHEMA, keep, pq.read_schema(sources[0].path))
    if grids:
        schema = schema.append(pa.field(vision.VISION, vision.PATCH_LIST))
    total = sum(s.num_rows for s in sources)
    published = False
    try:
        with _maybe_copy(arrow_copy, overwrite, sources, inputs) as copy:
            with (
                atomic_dir(output, overwrite, inputs, marker="metadata") as tmp,
                ShardedWriter(tmp, even_sizes(total, rows_per_shard), schema) as writer,
            ):
                tokens = _stream(sources, column, id_column, writer, copy, quiet, keep, grids)
            published = True  # the copy is published last, when this block ends
    except BaseException:
        if published:  # publishing the copy failed: take the metadata back too
            remove(Path(output))
        raise
    return LengthsResult([Path(output) / f.name for f in writer.files], total, tokens, id_column)


def write_arrow_tokens(
    src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    column: str = DEFAULT_COLUMN,
    id_column: str | None = "sample_id",
    overwrite: bool = False,
    quiet: bool = True,
) -> Path:
    """Write only the memory-mappable token copy (:mod:`varpack.metadata.tokens`) of ``src`` to ``dst``.

    The same streaming pass and checks as ``varpack lengths --arrow-copy`` (ids from
    ``id_column``, or the global row position when it is ``None``), without the metadata.
    """
    files = resolve_files(src)
    inputs = [*files, *_given_dirs(src)]
    check_output(dst, overwrite, inputs, is_token_copy)
    sources, id_column = _sources(src, column, id_column, files)
    with _maybe_copy(dst, overwrite, sources, inputs) as copy:
        _stream(sources, column, id_column, None, copy, quiet)
    return Path(dst)


def _sources(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str,
    id_column: str | None,
    files: Sequence[Path] | None = None,
    keep: Sequence[str] = (),
    grids: Sequence[str] = (),
) -> tuple[list[Source], str | None]:
    """The input files and the id column (``"auto"`` resolved on the first file's schema)."""
    files = resolve_files(input) if files is None else files
    if id_column == AUTO:
        list_sources(files[:1], column, None)  # readable, with a token column
        id_column = pick_id_column(pq.read_schema(files[0]), AUTO)
    sources = list_sources(files, column, id_column, keep, grids)
    if sum(s.num_rows for s in sources) == 0:
        raise InputError(f"{input}: the dataset holds no rows; nothing to do")
    return sources, id_column


def _check_apart(output: str | os.PathLike[str], arrow_copy: str | os.PathLike[str]) -> None:
    out, copy = Path(output).absolute(), Path(arrow_copy).absolute()
    if copy == out or out in copy.parents:
        raise ConfigError(
            f"--arrow-copy {arrow_copy}: must not be OUTPUT or lie inside it; "
            "choose a path next to it, e.g. tokens.arrow"
        )


@contextlib.contextmanager
def _maybe_copy(
    path: str | os.PathLike[str] | None,
    overwrite: bool,
    sources: Sequence[Source],
    inputs: Sequence[str | os.PathLike[str]],
) -> Iterator[TokenCopyWriter | None]:
    """A token copy writer on a temporary name, published as ``path`` on success (or None),
    with its location index (:mod:`varpack.metadata.token_index`) published just before it."""
    if path is None:
        yield None
        return
    idx = token_index.index_path(path)
    indexed = False
    try:
        with atomic_file(path, overwrite, inputs, is_token_copy) as tmp:
            with atomic_file(idx, overwrite, inputs, token_index.is_index) as tmp_idx:
                with TokenCopyWriter(tmp, sources[0].token_type) as copy:
                    yield copy
                token_index.write_index(tmp, tmp_idx, copy.check_values())
            indexed = True
    except BaseException:
        if indexed:  # publishing the copy failed: an index without its copy goes too
            remove(idx)
        raise


def _given_dirs(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The directories named in an input spec (an output must not be written inside them)."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    return [Path(i) for i in items if Path(i).is_dir()]


def _stream(
    sources: Sequence[Source],
    column: str,
    id_column: str | None,
    writer: ShardedWriter | None,
    copy: TokenCopyWriter | None,
    quiet: bool,
    keep: Sequence[str] = (),
    grids: Sequence[str] = (),
) -> int:
    """One pass over the row groups into the metadata and/or copy writers; returns the tokens."""
    tokens = 0
    seen: list[np.ndarray] = []
    with progress("lengths", sum(s.num_rows for s in sources), quiet) as bar:
        for src, table, token_lists in iter_row_groups(sources, column, id_column, keep, grids):
            if writer is not None:
                writer.write(table)
            if copy is not None:
                try:
                    copy.write(table.column(ID), token_lists)
                except pa.ArrowInvalid as exc:  # e.g. int64 tokens after int32 ones that overflow
                    raise InputError(
                        f"{src.path}: cannot store its tokens as {copy.schema.field(1).type} "
                        f"like the first file ({first_line(exc)})"
                    ) from None
            tokens += int(pc.sum(table.column(LEN)).as_py() or 0)
            if id_column is not None:
                seen.append(table.column(ID).to_numpy())
            bar.advance(TASK, table.num_rows)
    if id_column is not None:
        _check_unique(np.concatenate(seen), sources)
    return tokens


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
