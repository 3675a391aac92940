"""Sequence-length metadata: locate, read and validate sharded Parquet.

Contract (DESIGN.md): ``sample_id`` integer, unique, >= 0; ``seq_len`` integer, > 0; optional
numeric key columns; any other column is ignored unless asked for. ``vision_patches``, a list of
integers (each image's patches; null or empty: no images), is a key by its per-sample total
(:mod:`varpack.metadata.vision`). The unit of reading is a :class:`Piece` (one row group of one
file) so that MPI ranks can split the input by rows rather than by files. Every check is vectorised and names the file, the row (within that file) and the
sample id of the first offence.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.types as pat

from varpack.errors import InputError
from varpack.metadata.footer import footer_rows
from varpack.metadata.vision import VISION, is_patch_list, patch_totals

ID = "sample_id"
LEN = "seq_len"
REQUIRED = (ID, LEN)
_FORMAT = ds.ParquetFileFormat()
_LOCAL = pafs.LocalFileSystem()

#: The schema varpack writes for metadata (``synth``, ``lengths``); readers accept any integer types.
WRITE_SCHEMA = pa.schema([(ID, pa.int64()), (LEN, pa.int32())])
#: Parquet writer options for metadata: zstd halves the size of sparse ids at little cost, and a
#: dictionary pays off for lengths (few distinct values) but not for random ids.
WRITE_OPTIONS: dict[str, object] = {"compression": "zstd", "use_dictionary": [LEN]}
#: Largest length varpack writes (int32 column).
MAX_LEN = int(np.iinfo(np.int32).max)


def shard_name(index: int) -> str:
    """File name of output shard ``index``; zero-padded so the path order is the shard order.

    >>> shard_name(7)
    'part-00007.parquet'
    """
    return f"part-{index:05d}.parquet"


@dataclass(frozen=True)
class Piece:
    """One row group of one Parquet file, with its row offset inside that file."""

    path: str
    row_group: int
    num_rows: int
    file_row_offset: int


@dataclass(frozen=True)
class Listing:
    """The files of an input spec, and the symbolic links followed to find them."""

    files: list[Path]
    links: list[Path]


def scan_input(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Listing:
    """Expand a file, a directory (recursively, ``*.parquet``) or a glob into a sorted file list.

    The order is by path, so it is stable across runs and machines. Hidden files and names
    starting with ``_`` (``_index.json``, ``_SUCCESS``) are skipped inside directories. Symbolic
    links to files and directories are followed (a directory reached twice is read once, so a
    link loop ends); a dangling link is an error naming it, never silently skipped.
    """
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[Path] = []
    links: list[Path] = []
    for item in specs:
        path = Path(item)
        if path.is_dir():
            found = _walk(path, links)
            if not found:
                raise InputError(
                    f"{path}: directory holds no *.parquet files; point at a Parquet file, directory or glob"
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
            if path.is_symlink():
                links.append(path)
        elif path.is_symlink():
            raise InputError(
                f"{path}: a symbolic link to nothing ({os.readlink(path)}); fix or remove it"
            )
        elif glob.has_magic(str(item)):
            matched = [Path(p) for p in glob.glob(str(item), recursive=True)]
            for m in matched:
                if m.is_symlink() and not m.exists():
                    raise InputError(
                        f"{m}: a symbolic link to nothing ({os.readlink(m)}); fix or remove it"
                    )
            found = [m for m in matched if m.is_file()]
            if not found:
                raise InputError(f"{item}: the pattern matches no file; check the path")
            files.extend(found)
            links.extend(m for m in found if m.is_symlink())
        else:
            raise InputError(f"{path}: no such file or directory")
    return Listing(sorted(set(files), key=lambda p: str(p)), sorted(set(links), key=str))


def resolve_files(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files of an input spec, sorted by path (see :func:`scan_input`)."""
    return scan_input(spec).files


def _walk(root: Path, links: list[Path]) -> list[Path]:
    """``*.parquet`` files under ``root``, following links; each real directory read once."""
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        st = here.stat()
        if (st.st_dev, st.st_ino) in seen:  # a link back to a directory already read
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for d in dirnames:
            if (here / d).is_symlink():
                links.append(here / d)
        for name in sorted(filenames):
            path = here / name
            if name.startswith((".", "_")):
                continue
            if path.is_symlink() and not path.exists():
                raise InputError(
                    f"{path}: a symbolic link to nothing ({os.readlink(path)}); fix or remove it"
                )
            if not name.endswith(".parquet") or not path.is_file():
                continue
            if path.is_symlink():
                links.append(path)
            found.append(path)
    return found


def _fragment(path: Path | str, row_groups: list[int] | None = None) -> ds.ParquetFileFragment:
    return _FORMAT.make_fragment(str(path), filesystem=_LOCAL, row_groups=row_groups)


def list_pieces(files: Sequence[Path | str], keys: Sequence[str] = ()) -> list[Piece]:
    """Read every footer, check each file's schema, and list its row groups in file order."""
    pieces: list[Piece] = []
    for path in files:
        try:
            frag = _fragment(path)
            check_schema(frag.physical_schema, str(path), keys)
            meta = frag.metadata
        except InputError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                f"{path}: cannot read as Parquet ({first_line(exc)}); replace or remove the file"
            ) from None
        counts = footer_rows(path, meta, [*REQUIRED, *keys])
        offset = 0
        for i, n in enumerate(counts):
            pieces.append(Piece(str(path), i, n, offset))
            offset += n
    return pieces


def check_schema(schema: pa.Schema, where: str, keys: Sequence[str] = ()) -> None:
    """Required columns present with integer types; key columns present and numeric."""
    for name in REQUIRED:
        if schema.get_field_index(name) < 0:
            have = ", ".join(schema.names) or "none"
            raise InputError(
                f"{where}: missing column '{name}' (columns: {have}); metadata needs {ID} and {LEN}"
            )
        typ = schema.field(name).type
        if not pat.is_integer(typ):
            raise InputError(
                f"{where}: column '{name}' has type {typ}, expected an integer type (int64 or int32)"
            )
    for key in keys:
        if key in REQUIRED:
            continue
        if schema.get_field_index(key) < 0:
            raise InputError(
                f"{where}: missing key column '{key}' (columns: {', '.join(schema.names)})"
            )
        typ = schema.field(key).type
        if key == VISION:  # a sample's images (or their total): the key is the total
            if not (is_patch_list(typ) or pat.is_integer(typ)):
                raise InputError(f"{where}: key column '{key}' has type {typ}, expected a list "
                                 "of integers (each image's patches) or an integer (their total)")  # fmt: skip
            continue
        if not (pat.is_integer(typ) or pat.is_floating(typ)):
            raise InputError(f"{where}: key column '{key}' has type {typ}, expected a numeric type")


def read_piece(piece: Piece, keys: Sequence[str] = ()) -> pa.Table:
    """Read and validate one row group; returns ``sample_id`` int64, ``seq_len`` int64, keys."""
    columns = list(dict.fromkeys([*REQUIRED, *keys]))
    try:
        table = _fragment(piece.path, [piece.row_group]).to_table(columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(
            f"{piece.path}: cannot read row group {piece.row_group} ({first_line(exc)}); replace or remove the file"
        ) from None
    if table.num_rows != piece.num_rows:  # what was read, not what the footer says, counts
        raise InputError(
            f"{piece.path}: row group {piece.row_group} holds {table.num_rows:,} rows but its "
            f"footer declares {piece.num_rows:,}; the file is corrupt: rewrite or remove it"
        )
    return validate_table(table, piece.path, piece.file_row_offset, keys)


def validate_table(
    table: pa.Table, where: str, first_row: int = 0, keys: Sequence[str] = ()
) -> pa.Table:
    """Check nulls, ranges and types of one chunk; return it normalised to int64 id and length."""
    check_schema(table.schema, where, keys)
    for name in dict.fromkeys([*REQUIRED, *keys]):
        col = table.column(name)
        if col.null_count and name != VISION:  # a null vision_patches: no images
            row = int(pc.index(pc.is_null(col), True).as_py())
            raise InputError(
                f"{where}: row {first_row + row}: null in column '{name}'; every row needs a value"
            )
    ids = _to_int64(table.column(ID), ID, where, first_row)
    lens = _to_int64(table.column(LEN), LEN, where, first_row)
    _first_violation(pc.less(ids, 0), ids, where, first_row, "negative sample_id; ids must be >= 0")
    _first_violation(
        pc.less_equal(lens, 0), ids, where, first_row, "non-positive seq_len; lengths must be > 0"
    )
    _first_violation(
        pc.greater(lens, MAX_LEN),
        ids,
        where,
        first_row,
        f"seq_len over {MAX_LEN:,}, the largest length a plan holds (int32); split the sample "
        "or drop it from the metadata",
    )
    out = {ID: ids, LEN: lens}
    for key in keys:
        if key not in out:
            col = table.column(key)
            if key == VISION:
                out[key] = patch_totals(col, where, first_row, ids.to_numpy())
                continue
            if pat.is_floating(col.type):
                # NaN has no place in a total order: the sort would depend on the NaN convention.
                what = f"NaN in key column '{key}'; give every row a number"
                _first_violation(pc.is_nan(col), ids, where, first_row, what)
                col = col.cast(pa.float64())
            else:  # keys are int64 or float64 from here on, whatever each shard stored
                col = _to_int64(col, key, where, first_row)
            out[key] = col
    return pa.table(out)


#: integers a float64 holds exactly: |v| <= 2**53
FLOAT_EXACT = 2**53


def check_exact_float(values: np.ndarray, name: str, place: Callable[[int], str]) -> None:
    """Refuse integer values of key ``name`` that a float64 cannot hold: a key column stored as
    floats in one shard is float64 everywhere, and a rounded key would sort (and be written)
    as another number. ``place(k)`` names row ``k`` ("FILE: row N (sample_id I)").

    >>> check_exact_float(np.array([2**53, -(2**53)]), "k", str)
    >>> check_exact_float(np.array([0, 2**53 + 1]), "k", lambda k: f"f.parquet: row {k}")
    Traceback (most recent call last):
    varpack.errors.InputError: f.parquet: row 1: k value 9,007,199,254,740,993 is an integer that a float cannot hold exactly, and column 'k' holds floats in other shards; store the key as one type in every shard
    """
    if values.dtype.kind not in "iu" or not len(values):
        return
    bad = (values > FLOAT_EXACT) | (values < -FLOAT_EXACT)
    if bad.any():
        k = int(np.argmax(bad))
        raise InputError(
            f"{place(k)}: {name} value {int(values[k]):,} is an integer that a float cannot hold "
            f"exactly, and column '{name}' holds floats in other shards; store the key as one "
            "type in every shard"
        )


def unify_keys(tables: list[pa.Table], pieces: Sequence[Piece], keys: Sequence[str]) -> None:
    """Make each key one type across the pieces' tables (in place): float64 where any piece
    holds floats, after :func:`check_exact_float` on the integer pieces."""
    for key in dict.fromkeys(keys):
        if key in REQUIRED or not any(pat.is_floating(t.schema.field(key).type) for t in tables):
            continue
        for i, (table, piece) in enumerate(zip(tables, pieces, strict=True)):
            col = table.column(key)
            if pat.is_integer(col.type):
                check_exact_float(col.to_numpy(), key, _place(piece, table.column(ID).to_numpy()))
                at = table.schema.get_field_index(key)
                tables[i] = table.set_column(at, key, col.cast(pa.float64()))


def _to_int64(col: pa.ChunkedArray, name: str, where: str, first_row: int) -> pa.ChunkedArray:
    """Cast an integer column to int64, naming the first value that does not fit (uint64)."""
    limit = np.iinfo(np.int64).max
    if pat.is_unsigned_integer(col.type) and len(col) and pc.max(col).as_py() > limit:
        row = int(pc.index(pc.greater(col, pa.scalar(limit, col.type)), True).as_py())
        raise InputError(
            f"{where}: row {first_row + row}: {name} value {col[row].as_py():,} "
            f"does not fit int64, which varpack keeps it as; rescale or re-encode the column"
        )
    return col.cast(pa.int64())


def _first_violation(
    mask: pa.ChunkedArray, ids: pa.ChunkedArray, where: str, first_row: int, what: str
) -> None:
    if pc.any(mask).as_py():
        row = int(pc.index(mask, True).as_py())
        raise InputError(f"{where}: row {first_row + row} (sample_id {ids[row].as_py()}): {what}")


def first_duplicate(sorted_ids: np.ndarray) -> int | None:
    """The smallest id that occurs twice in an ascending array, or None.

    >>> first_duplicate(np.array([1, 3, 3, 7]))
    3
    >>> first_duplicate(np.array([1, 2])) is None
    True
    """
    if len(sorted_ids) < 2:
        return None
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    return int(sorted_ids[dup[0]]) if len(dup) else None


def duplicate_error(sample_id: int, places: Sequence[str]) -> InputError:
    """The one message for a duplicate id; ``places`` name where it occurs ("file row N")."""
    where = " and ".join(places[:2]) if places else "the input"
    return InputError(
        f"duplicate sample_id {sample_id} in {where}; sample ids must be unique across all shards"
    )


def _place(piece: Piece, ids: np.ndarray) -> Callable[[int], str]:
    """Names row ``k`` of a piece's table: file, row in the file, sample id."""
    return lambda k: f"{piece.path}: row {piece.file_row_offset + k} (sample_id {ids[k]})"


def read_metadata(
    spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], keys: Sequence[str] = ()
) -> pa.Table:
    """Read, validate and concatenate all metadata in ``spec`` (single process).

    Returns a table with ``sample_id`` int64, ``seq_len`` int64 and the key columns, in file and
    row order. Raises :class:`InputError` for any contract violation, including duplicate ids
    across shards and an input with no rows.
    """
    files = resolve_files(spec)
    pieces = list_pieces(files, keys)
    pieces = [p for p in pieces if p.num_rows]
    tables = [read_piece(p, keys) for p in pieces]
    if not tables or sum(t.num_rows for t in tables) == 0:
        raise InputError(f"{_describe(spec)}: the metadata holds no rows; nothing to do")
    unify_keys(tables, pieces, keys)
    table = pa.concat_tables(tables).combine_chunks()
    del tables  # free the per-piece copies before the sort below doubles the ids
    ids = table.column(ID).to_numpy()
    dup = first_duplicate(np.sort(ids))
    if dup is not None:
        raise duplicate_error(dup, _locate(dup, ids, pieces))
    return table


def _locate(sample_id: int, ids: np.ndarray, pieces: Sequence[Piece]) -> list[str]:
    """Name the file and row of each occurrence of ``sample_id`` (error path only)."""
    starts = np.cumsum([0] + [p.num_rows for p in pieces])
    places = []
    for row in np.flatnonzero(ids == sample_id):
        k = int(np.searchsorted(starts, row, side="right") - 1)
        piece = pieces[k]
        places.append(f"{piece.path} row {piece.file_row_offset + int(row - starts[k])}")
    return places


def _describe(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    if isinstance(spec, (str, os.PathLike)):
        return str(spec)
    names = [str(s) for s in spec]
    return names[0] if len(names) == 1 else f"{len(names)} inputs ({names[0]}, ...)"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Arrow errors can run to many lines)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
