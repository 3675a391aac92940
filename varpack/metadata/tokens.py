"""The memory-mappable token copy: one uncompressed Arrow IPC file keyed like the metadata.

Random access into Parquet decompresses a whole row group per sample it touches, which is far too
slow for a training reader whose micro-batches take samples from all over the dataset. The copy
that ``varpack lengths --arrow-copy PATH`` (or :func:`varpack.lengths.write_arrow_tokens`) writes
is an Arrow IPC *file* (random-access format, footer at the end, no compression) with:

=============  ===========================  ==================================================
column         type                         content
=============  ===========================  ==================================================
``sample_id``  ``int64``                    the metadata's ids: from ``--id-column``, or the
                                            global row position in the sorted file order
``input_ids``  ``large_list<T>``            the sample's tokens; ``T`` = the source's token
                                            type (int64 list offsets: no 2 GiB limit)
=============  ===========================  ==================================================

whatever the source's column names were, so the reader's defaults always fit. Rows keep the
source order; there is one record batch per source row group (the writer never holds more), and
the schema metadata carries ``varpack.format = tokens``, ``varpack.version = 1``.

:class:`varpack.torch.ParquetTokenDataset` opens a path ending in ``.arrow`` (or a directory of
them) as such a copy: it memory-maps the file and the location index written beside it
(:mod:`varpack.metadata.token_index`, ``PATH.idx``; several copies through theirs, as one, where
their id ranges do not overlap), and fetches a micro-batch with one vectorised gather from the
page cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa

from varpack.metadata import token_check

ID = "sample_id"
TOKENS = "input_ids"
FORMAT = {b"varpack.format": b"tokens", b"varpack.version": b"1"}
#: File name endings the reader takes for an Arrow IPC copy.
SUFFIXES = (".arrow", ".feather", ".ipc")


def copy_schema(value_type: pa.DataType) -> pa.Schema:
    """The copy's schema for tokens of ``value_type``.

    >>> copy_schema(pa.int32()).names
    ['sample_id', 'input_ids']
    """
    return pa.schema(
        [pa.field(ID, pa.int64(), nullable=False), (TOKENS, pa.large_list(value_type))],
        metadata=FORMAT,
    )


def token_batch(
    ids: pa.Array | pa.ChunkedArray, tokens: pa.Array | pa.ChunkedArray, schema: pa.Schema
) -> pa.RecordBatch:
    """One record batch of the copy: ids as int64, token lists cast to ``large_list<T>``.

    >>> b = token_batch(pa.array([7, 3]), pa.array([[1, 2], [5]]), copy_schema(pa.int32()))
    >>> b.column(1).type, b.column(0).to_pylist()
    (LargeListType(large_list<item: int32>), [7, 3])
    """
    ids = _contiguous(ids).cast(pa.int64())
    tokens = _contiguous(tokens).cast(schema.field(TOKENS).type)
    return pa.RecordBatch.from_arrays([ids, tokens], schema=schema)


def _contiguous(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def is_token_copy(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a token copy varpack wrote (its schema says so); never raises."""
    try:
        with pa.memory_map(str(path)) as source:
            schema = pa.ipc.open_file(source).schema
    except (OSError, pa.ArrowException, ValueError):
        return False
    meta = schema.metadata or {}
    return meta.get(b"varpack.format") == FORMAT[b"varpack.format"]


class TokenCopyWriter:
    """Append record batches to ``path`` (a temporary name: publishing is the caller's job).

    A context manager: the file is complete (footer written) when the ``with`` block ends.
    """

    def __init__(self, path: str | os.PathLike[str], value_type: pa.DataType) -> None:
        self.path = Path(path)
        self.schema = copy_schema(value_type)
        self.rows = 0
        # No compression: the reader relies on the buffers lying in the mapped file as they are.
        self._writer = pa.ipc.new_file(str(self.path), self.schema)
        self._checks: list[np.ndarray] = []  # each batch's check values (token_check)
        self._chunks: list[np.ndarray] = []
        self._chunk_count = 0

    def write(self, ids: pa.Array | pa.ChunkedArray, tokens: pa.Array | pa.ChunkedArray) -> None:
        """Write one batch (one source row group); memory is that batch. Its check values
        are computed here, from the tokens in memory, so the index needs no second pass over
        the copy."""
        batch = token_batch(ids, tokens, self.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        column = batch.column(1)
        offsets = column.offsets.to_numpy().astype(np.int64)
        values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
        length = np.diff(offsets)
        check, chunks = token_check.sample_values(
            values, offsets[:-1] - offsets[0], length, batch.column(0).to_numpy()
        )
        check[length > token_check.CHUNK] += np.uint64(self._chunk_count)  # into the whole table
        self._checks.append(check)
        self._chunks.append(chunks)
        self._chunk_count += len(chunks)

    def check_values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(check, chunks)`` of every row written, in the copy's row order
        (:func:`~varpack.metadata.token_check.sample_values` over the whole copy)."""
        empty = np.zeros(0, dtype=np.uint64)
        return np.concatenate([empty, *self._checks]), np.concatenate([empty, *self._chunks])

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TokenCopyWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
