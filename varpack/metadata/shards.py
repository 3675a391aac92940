"""Write a stream of Arrow tables into Parquet shards of planned sizes.

``synth`` and ``lengths`` both know their total row count before writing (``synth`` by
construction, ``lengths`` from the input footers), so the shard sizes are fixed up front and the
output does not depend on how the input happened to be chunked: the same rows give the same
files. Memory is bounded by one row group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

from varpack.metadata.contract import WRITE_OPTIONS, shard_name

#: Rows per row group of metadata: large enough for fast scans, small enough to split across ranks.
ROW_GROUP_ROWS = 1 << 20


def even_sizes(total: int, rows_per_shard: int) -> list[int]:
    """Split ``total`` rows into full shards of ``rows_per_shard`` and one remainder.

    >>> even_sizes(10, 4)
    [4, 4, 2]
    >>> even_sizes(0, 4)
    []
    """
    full, rest = divmod(total, rows_per_shard)
    return [rows_per_shard] * full + ([rest] if rest else [])


class ShardedWriter:
    """Append tables; they land in ``part-NNNNN.parquet`` files of exactly ``sizes`` rows.

    Empty sizes are skipped (no file). Each row group holds at most ``row_group_rows`` rows and
    never spans two shards. ``close`` checks that exactly ``sum(sizes)`` rows arrived.
    """

    def __init__(
        self,
        directory: Path,
        sizes: Sequence[int],
        schema: pa.Schema,
        row_group_rows: int = ROW_GROUP_ROWS,
        options: Mapping[str, object] = WRITE_OPTIONS,
    ) -> None:
        self._dir = Path(directory)
        self._sizes = [int(s) for s in sizes if s > 0]
        self._schema = schema
        self._group = max(1, int(row_group_rows))
        self._options = dict(options)
        self._shard = 0
        self._left = self._sizes[0] if self._sizes else 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self.files: list[Path] = []

    def write(self, table: pa.Table) -> None:
        """Buffer ``table`` (cast to the schema) and flush every completed row group."""
        table = table.select(self._schema.names).cast(self._schema)
        start = 0
        while start < table.num_rows:
            if self._shard >= len(self._sizes):
                raise RuntimeError("more rows than the planned shard sizes hold")
            cap = min(self._group, self._left)
            take = min(cap - self._pending_rows, table.num_rows - start)
            self._pending.append(table.slice(start, take))
            self._pending_rows += take
            start += take
            if self._pending_rows == cap:
                self._flush()

    def _flush(self) -> None:
        if self._writer is None:
            path = self._dir / shard_name(self._shard)
            self._writer = pq.ParquetWriter(path, self._schema, **self._options)  # type: ignore[arg-type]
            self.files.append(path)
        group = pa.concat_tables(self._pending)
        self._writer.write_table(group, row_group_size=max(1, group.num_rows))
        self._left -= group.num_rows
        self._pending, self._pending_rows = [], 0
        if self._left == 0:
            self._writer.close()
            self._writer = None
            self._shard += 1
            self._left = self._sizes[self._shard] if self._shard < len(self._sizes) else 0

    def close(self) -> None:
        """Finish the last file; fail if fewer rows arrived than planned."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._pending_rows or self._shard < len(self._sizes):
            raise RuntimeError("fewer rows than the planned shard sizes hold")

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.close()
            self._writer = None
