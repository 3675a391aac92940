"""What a Parquet footer declares, believed only once checked: every reader of metadata and
token data (``sort``, ``check``, ``plan``, ``validate --metadata``, ``plan --carry-from``,
``lengths``, the torch reader) asks :func:`footer_rows` before it allocates or reads a row.

A footer's row counts decide what a reader allocates and how many rows Arrow decodes: a row group
declaring fewer rows than its pages hold is read short without a word, one declaring more makes
a reader allocate for rows that are not there. So the counts must be consistent (none negative,
the file's total the sum of its row groups'), loadable (:func:`check_loadable`), and what the
pages hold: :func:`check_pages` walks the page headers of the column chunks a reader is about to
read (a few bytes per page, no data decoded) and counts their values; a flat column must hold
exactly its row group's rows, every column exactly the values its column chunk declares. After
reading, :func:`check_read` compares what Arrow returned with that count. Page headers are
Thrift compact structs (parquet-format's ``PageHeader``); :class:`_Thrift` reads the few fields
needed and skips the rest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyarrow.types as pat

from varpack.errors import InputError

_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
#: bytes read for one page header at first (statistics of integer columns fit easily)
_HEADER_READ = 256
_HEADER_MAX = 1 << 20


class _Short(Exception):
    """The buffer ended inside a header: read more."""


class _Thrift:
    """A Thrift compact-protocol reader over one buffer (just enough for ``PageHeader``)."""

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _Short
        self.pos += 1
        return self.buf[self.pos - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self) -> dict[int, Any]:
        """A struct's integer and struct fields by id (others are skipped)."""
        out: dict[int, Any] = {}
        fid = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == 0:
                return out
            delta = head >> 4
            fid = fid + delta if delta else self.zigzag()
            value = self.value(kind)
            if value is not None:
                out[fid] = value

    def value(self, kind: int) -> Any:
        if kind in (1, 2):  # bool true / false, held in the field header
            return None
        if kind == 3:
            self.byte()
            return None
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.take(8)
            return None
        if kind == 8:
            self.take(self.varint())
            return None
        if kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.element(head & 0x0F)
            return None
        if kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.element(types >> 4)
                    self.element(types & 0x0F)
            return None
        if kind == 12:
            return self.struct()
        raise ValueError(f"unknown Thrift type {kind}")

    def element(self, kind: int) -> None:
        if kind in (1, 2):  # a bool inside a list is a byte
            self.byte()
        else:
            self.value(kind)

    def take(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Short if n >= 0 else ValueError("negative length")
        self.pos += n


def _page_header(f: IO[bytes], pos: int) -> tuple[dict[int, Any], int]:
    """The page header at ``pos`` and its size in bytes."""
    size = _HEADER_READ
    while True:
        f.seek(pos)
        buf = f.read(size)
        reader = _Thrift(buf)
        try:
            return reader.struct(), reader.pos
        except _Short:
            if len(buf) < size or size >= _HEADER_MAX:
                raise ValueError("a page header runs past the end of the file") from None
            size *= 4


def chunk_values(f: IO[bytes], chunk: Any, file_size: int) -> int:
    """Values in the data pages of one column chunk, counted from their headers."""
    # The chunk starts at its first page; pyarrow writes data_page_offset 0 for a chunk of no
    # rows that holds only a dictionary page.
    offsets = [chunk.data_page_offset]
    if chunk.has_dictionary_page:
        offsets.append(chunk.dictionary_page_offset)
    start = min((o for o in offsets if o > 0), default=0)
    if chunk.total_compressed_size == 0:  # a chunk of no rows may hold no page at all
        return 0
    end = start + chunk.total_compressed_size
    if start < 4 or end > file_size or chunk.total_compressed_size < 0:
        raise ValueError(f"the column chunk lies outside the file (bytes {start:,} to {end:,})")
    pos, values = start, 0
    while pos < end:
        header, size = _page_header(f, pos)
        kind, length = header.get(1), header.get(3)
        if not isinstance(length, int) or length < 0 or kind is None:
            raise ValueError(f"a page header at byte {pos:,} is damaged")
        if kind in (_DATA_PAGE, _DATA_PAGE_V2):
            body = header.get(5 if kind == _DATA_PAGE else 8)
            count = body.get(1) if isinstance(body, dict) else None
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"the data page at byte {pos:,} declares no value count")
            values += count
        pos += size + length
    if pos != end:
        raise ValueError(f"the last page runs {pos - end:,} bytes past the column chunk")
    return values


def footer_rows(
    path: str | os.PathLike[str],
    meta: pq.FileMetaData,
    columns: Sequence[str],
    loaded: int | None = None,
) -> list[int]:
    """The rows of every row group of a Parquet file, as its footer declares them once they are
    believed: consistent, loadable as ``loaded`` int64 columns (default: ``columns``; see
    :func:`check_footer_rows`), and what the pages of ``columns`` hold (:func:`check_pages`, page
    headers only). Every reader of metadata and token data asks this before it allocates or
    reads a row."""
    counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    check_footer_rows(counts, meta.num_rows, str(path), loaded or max(1, len(columns)))
    check_pages(path, meta, columns)
    return counts


def check_footer_rows(counts: Sequence[int], total: int, where: str, columns: int) -> None:
    """A footer's row counts are believed only when consistent and loadable: none negative,
    the file's total equal to its row groups', and no more than this machine's memory could
    hold (a corrupt footer must not make a reader allocate terabytes before reading a byte)."""
    bad = [i for i, n in enumerate(counts) if n < 0]
    if bad or total != sum(counts):
        what = (
            f"row group {bad[0]} declares {counts[bad[0]]:,} rows"
            if bad
            else (f"the footer declares {total:,} rows but its row groups {sum(counts):,}")
        )
        raise InputError(f"{where}: {what}; the file is corrupt: rewrite or remove it")
    check_loadable(total, columns, where)


def check_loadable(rows: int, columns: int, where: str) -> None:
    """Refuse to load ``rows`` int64 rows of ``columns`` columns that cannot fit in memory."""
    need = rows * 8 * columns
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have:
        raise InputError(
            f"{where}: {rows:,} rows declared ({need / 2**30:,.1f} GiB to load), more than this "
            f"machine's memory ({have / 2**30:,.1f} GiB); a corrupt footer? rewrite the file; "
            "else sort on more ranks"
        )


def _leaves(meta: pq.FileMetaData, columns: Sequence[str]) -> list[tuple[int, Any]]:
    """``(index, ColumnSchema)`` of the leaf columns under the top-level ``columns``."""
    return [
        (j, meta.schema.column(j))
        for j in range(meta.num_columns)
        if meta.schema.column(j).path.split(".")[0] in columns
    ]


def check_pages(
    path: str | os.PathLike[str],
    meta: pq.FileMetaData,
    columns: Sequence[str],
    groups: Sequence[int] | None = None,
) -> None:
    """Refuse a file whose pages of ``columns`` (top-level names; absent ones are skipped) hold
    other counts than its footer declares: every column its column chunk's value count, a flat
    column its row group's rows, a list column at least one value per row (and none without
    rows). Reads page headers only (of ``groups``: all if None).
    """
    leaves = _leaves(meta, columns)
    if not leaves or meta.num_row_groups == 0:
        return
    try:
        file_size = os.path.getsize(path)
        with open(path, "rb") as f:
            for g in range(meta.num_row_groups) if groups is None else groups:
                group = meta.row_group(g)
                for j, leaf in leaves:
                    chunk = group.column(j)
                    got = chunk_values(f, chunk, file_size)
                    declared = [("values", chunk.num_values)]
                    rows = group.num_rows
                    if leaf.max_repetition_level == 0:
                        declared.append(("rows", rows))
                    elif rows > got or (got and not rows):  # a row takes at least one value
                        declared.append(("rows", rows))
                    for what, n in declared:
                        if got != n:
                            raise InputError(
                                f"{path}: row group {g}: the pages of column '{leaf.path}' hold "
                                f"{got:,} values but the footer declares {n:,} {what}; the file "
                                "is corrupt: rewrite or remove it"
                            )
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(
            f"{path}: cannot read its page headers ({exc}); the file is corrupt: rewrite or "
            "remove it"
        ) from None


def check_read(
    where: str, meta: pq.FileMetaData, group: int, name: str, column: pa.Array | pa.ChunkedArray
) -> None:
    """What was read of column ``name`` of row group ``group`` is all its pages hold: its rows,
    and for a list column every value (Arrow stops at the rows the footer declares, so a footer
    declaring fewer rows than the pages hold would otherwise drop the rest without a word)."""
    rows = meta.row_group(group).num_rows
    if len(column) != rows:
        raise InputError(
            f"{where}: row group {group} holds {len(column):,} rows but its footer declares "
            f"{rows:,}; the file is corrupt: rewrite or remove it"
        )
    if not (pat.is_list(column.type) or pat.is_large_list(column.type)):
        return
    lens = pc.list_value_length(column)
    empty = pc.sum(pc.fill_null(pc.equal(lens, 0), True).cast(pa.int64())).as_py() or 0
    got = (pc.sum(lens).as_py() or 0) + empty  # an empty or null list takes one slot
    want = sum(meta.row_group(group).column(j).num_values for j, _ in _leaves(meta, [name]))
    if got != want:
        raise InputError(
            f"{where}: row group {group}: {got:,} values of column '{name}' were read but its "
            f"pages hold {want:,}; the file is corrupt: rewrite or remove it"
        )
