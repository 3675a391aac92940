"""Random access to tokenized samples by sample id.

:class:`ParquetTokenDataset` reads a tokenized Parquet dataset (the one ``varpack lengths`` read:
a list column of token ids, default ``input_ids``, and an id column, default ``sample_id``)
without loading it. Opening reads only the id column and builds a sorted index
``sample_id -> (row group, row)`` with NumPy; row groups are then read on demand, one column, and
kept in a small LRU cache. :meth:`~ParquetTokenDataset.get_flat` fetches a whole micro-batch with
one read per row group it touches, never one per sample.

Column names default to ``"auto"``: the token column is the first of :data:`TOKEN_COLUMNS`
(``input_ids``, ``tokens``) and the id column the first of :data:`ID_COLUMNS` (``sample_id``,
``id``) that the first file holds; when none is there, the error names the columns found and the
option to pass (``column=`` / ``id_column=``, ``--column`` / ``--id-column`` in ``jobs/train.py``).
The ids must be the ones ``varpack lengths`` gave the samples: ``lengths --id-column id`` for an
``id`` column; without ``--id-column`` it numbered the rows, so pass ``id_column=None`` here.
With ``id_column=None`` the ids are the global row positions in the stable file order of
:func:`varpack.metadata.resolve_files`, the same rule ``varpack lengths`` uses without ``--id-column``.

An uncompressed Arrow IPC copy (``*.arrow``, or a directory of them, written by ``varpack lengths
--arrow-copy``) is read at the byte offsets of its location index (:mod:`~varpack.metadata.
token_index`), nothing built at open: ``read="pread"`` (default) copies each micro-batch's bytes,
so the process grows by the batch, not by the pages of the copy it touched; ``read="mmap"`` maps
the copy and gathers (:mod:`~varpack.torch.copy_read`). :func:`write_arrow_tokens` is re-exported.

Any map-style dataset keyed by sample id (a dict, or anything with ``__getitem__``) works too:
:func:`fetch_flat` falls back to one lookup per sample there.

Objects are pickle-safe for DataLoader workers: open files and the cache are dropped when pickled
and reopened lazily in each worker.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from varpack.errors import InputError
from varpack.metadata import token_copies, token_index, tokens
from varpack.metadata.contract import first_duplicate, resolve_files
from varpack.metadata.footer import check_pages, check_read, footer_rows
from varpack.metadata.lengths import ID_COLUMNS, write_arrow_tokens
from varpack.metadata.tokens import SUFFIXES as IPC_SUFFIXES
from varpack.torch.copy_read import CopyFiles
from varpack.torch.gather import fetch_flat, segment_gather_index, slice_pieces

__all__ = [
    "ID_COLUMNS",
    "TOKEN_COLUMNS",
    "ParquetTokenDataset",
    "fetch_flat",
    "pick_columns",
    "segment_gather_index",
    "write_arrow_tokens",
]

#: what ``column="auto"`` / ``id_column="auto"`` look for, in this order
TOKEN_COLUMNS = ("input_ids", "tokens")
AUTO = "auto"


def pick_columns(
    where: str, names: Sequence[str], column: str, id_column: str | None
) -> tuple[str, str | None]:
    """The token and id columns: as given, or for ``"auto"`` the first known name present.

    >>> pick_columns("f", ["id", "input_ids", "source"], "auto", "auto")
    ('input_ids', 'id')
    >>> pick_columns("f", ["uid", "input_ids"], "auto", "auto")
    Traceback (most recent call last):
    ...
    varpack.errors.InputError: f: no id column (looked for sample_id, id; columns: uid, input_ids); pass id_column= (--id-column in jobs/train.py) naming the column varpack lengths --id-column read, or id_column=None if varpack lengths numbered the rows
    """
    found = ", ".join(names)
    if column == AUTO:
        column = next((c for c in TOKEN_COLUMNS if c in names), "")
        if not column:
            raise InputError(
                f"{where}: no token column (looked for {', '.join(TOKEN_COLUMNS)}; columns: "
                f"{found}); pass column= (--column in jobs/train.py) naming the list of token ids"
            )
    if id_column == AUTO:
        id_column = next((c for c in ID_COLUMNS if c in names), "")
        if not id_column:
            raise InputError(
                f"{where}: no id column (looked for {', '.join(ID_COLUMNS)}; columns: {found}); "
                "pass id_column= (--id-column in jobs/train.py) naming the column varpack lengths "
                "--id-column read, or id_column=None if varpack lengths numbered the rows"
            )
    return column, id_column


def _resolve(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Parquet files as :func:`resolve_files` finds them, or Arrow IPC files (``*.arrow``)."""
    specs = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    ipc = [Path(p) for p in specs if str(p).endswith(IPC_SUFFIXES) and Path(p).is_file()]
    dirs = [Path(p) for p in specs if Path(p).is_dir()]
    found = sorted(
        {q for d in dirs for q in d.rglob("*") if q.suffix in IPC_SUFFIXES and q.is_file()}
    )
    if ipc and len(ipc) == len(specs):
        return sorted(ipc)
    if (
        dirs
        and len(dirs) == len(specs)
        and found
        and not any(next(d.rglob("*.parquet"), None) for d in dirs)
    ):
        return found
    return resolve_files(path)


class ParquetTokenDataset:
    """Tokenized Parquet, indexed by sample id; ``ds[sample_id]`` is a 1-D int NumPy array."""

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        column: str = AUTO,
        id_column: str | None = AUTO,
        cache_row_groups: int = 16,
        read: str = "pread",
    ) -> None:
        self.files = [str(p) for p in _resolve(path)]
        self.ipc = all(f.endswith(IPC_SUFFIXES) for f in self.files)
        self.column, self.id_column = pick_columns(
            self.files[0], self._schema_names(self.files[0]), column, id_column
        )
        id_column = self.id_column
        self.cache_row_groups = max(1, cache_row_groups)
        self._files: dict[int, Any] = {}  # open handles, per process (dropped when pickled)
        self._copies = CopyFiles(self.files, read)  # IPC: read by pread or mapped (ditto)
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._row_of: np.ndarray | None = None  # sorted position -> global row (None: the same)
        self._index: token_index.TokenIndex | token_copies.Shards | None = None
        self._opened: token_copies.Opened | None = None  # the indexes that verify each read
        if self._open_index():
            return
        # Row-group table: file index and first global row of every row group (plus the end).
        rg_file, rg_local, rg_start = [], [], [0]
        id_parts, file_start = [], []
        # Arrow IPC: where each row's tokens start in its file's mapping (in tokens), and how many.
        starts: list[np.ndarray] = []
        lens: list[np.ndarray] = []
        self._dtype: np.dtype | None = None
        for f, name in enumerate(self.files):
            file_start.append(rg_start[-1])
            for g, rows in enumerate(self._group_rows(name)):
                rg_file.append(f)
                rg_local.append(g)
                rg_start.append(rg_start[-1] + rows)
            if id_column is not None:
                id_parts.append(self._read_ids(name))
            if self.ipc:
                self._token_positions(name, starts, lens)
        if self.ipc and starts:
            self._tok_start = np.concatenate(starts)
            self._tok_len = np.concatenate(lens)
        self._file_start = np.asarray([*file_start, rg_start[-1]], dtype=np.int64)
        self._rg_file = np.asarray(rg_file, dtype=np.int32)
        self._rg_local = np.asarray(rg_local, dtype=np.int32)
        self._rg_start = np.asarray(rg_start, dtype=np.int64)
        total = int(self._rg_start[-1])
        if total == 0:
            raise InputError(f"{path}: the tokenized dataset holds no rows")
        if id_column is None:
            self._sorted_ids = np.arange(total, dtype=np.int64)
            self._row_of = self._sorted_ids
        else:
            ids = np.concatenate(id_parts)
            self._row_of = np.argsort(ids, kind="stable")
            self._sorted_ids = ids[self._row_of]
            dup = first_duplicate(self._sorted_ids)
            if dup is not None:
                raise InputError(
                    f"{path}: sample id {dup} appears more than once in column {id_column!r}; "
                    "ids must be unique"
                )

    # -- opening ---------------------------------------------------------------------------
    def _open_index(self) -> bool:
        """Open the copies through their offline indexes (:func:`~varpack.metadata.token_index.
        open_copies`): nothing read or built per sample. False: no index to use."""
        if not self.ipc or self.id_column != tokens.ID:
            return False
        got = token_copies.open_copies(self.files)
        if got is None:
            return False
        for name in self.files:
            self._check_columns(name, pa.ipc.open_file(pa.memory_map(name)).schema)
        self._index, self._opened = got.index, got
        self._sorted_ids, self._row_of = got.ids, None
        self._tok_start, self._tok_len, self._dtype = got.start, got.length, got.dtype
        if got.base is not None:
            self._file_start = got.base
        return True

    def _schema_names(self, name: str) -> list[str]:
        """Column names of one file (Parquet footer or IPC schema; no data read)."""
        try:
            if self.ipc:
                return list(pa.ipc.open_file(pa.memory_map(name)).schema.names)
            return list(pq.read_schema(name).names)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                f"{name}: not a readable {'Arrow IPC' if self.ipc else 'Parquet'} file ({exc})"
            ) from None

    def _check_columns(self, name: str, schema: pa.Schema) -> None:
        names = schema.names
        for col, option in ((self.column, "column"), (self.id_column, "id_column")):
            if col is not None and col not in names:
                raise InputError(
                    f"{name}: no column {col!r} (columns: {', '.join(names)}); pass {option}= "
                    f"(--{option.replace('_', '-')} in jobs/train.py) naming one of them"
                )
        typ = schema.field(self.column).type
        if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)) or not pa.types.is_integer(
            typ.value_type
        ):  # the check varpack lengths makes: floats would be truncated, strings never read
            raise InputError(
                f"{name}: column {self.column!r} has type {typ}, expected a list of integer "
                "token ids; pass column= naming the tokenized column"
            )

    def _group_rows(self, name: str) -> list[int]:
        """Rows of every row group (Parquet) or record batch (Arrow IPC) of one file."""
        try:
            if self.ipc:
                reader = pa.ipc.open_file(pa.memory_map(name))
                self._check_columns(name, reader.schema)
                return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            meta = pq.ParquetFile(name).metadata
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                f"{name}: not a readable {'Arrow IPC' if self.ipc else 'Parquet'} file ({exc})"
            ) from None
        self._check_columns(name, meta.schema.to_arrow_schema())
        # What the ids are built from (numbered rows: the row counts) must be what pages hold.
        return footer_rows(name, meta, [self.id_column or self.column], loaded=1)

    def _token_positions(self, name: str, starts: list[np.ndarray], lens: list[np.ndarray]) -> None:
        """Append where every row's tokens lie in one IPC file's mapping (in tokens), and how
        many (:func:`varpack.metadata.token_index.token_positions`)."""
        start, length, dtype = token_index.token_positions(name, self.column)
        if self._dtype not in (None, dtype):
            raise InputError(
                f"{name}: column {self.column!r} holds another token type than the first file's; "
                "rewrite it with `varpack lengths ... --arrow-copy PATH`"
            )
        self._dtype = dtype
        starts.append(start)
        lens.append(length)

    def _read_ids(self, name: str) -> np.ndarray:
        assert self.id_column is not None
        if self.ipc:
            col = pa.ipc.open_file(pa.memory_map(name)).read_all().column(self.id_column)
        else:
            col = pq.read_table(name, columns=[self.id_column]).column(0)
        if col.null_count or not pa.types.is_integer(col.type):
            raise InputError(f"{name}: column {self.id_column!r} must be integer ids without nulls")
        return col.to_numpy().astype(np.int64, copy=False)

    def _read_group(self, f: int, g: int) -> pa.Array:
        """One row group's token column: decoded from Parquet, or a zero-copy view of the IPC map."""
        handle = self._files.get(f)
        if handle is None:
            name = self.files[f]
            handle = self._files[f] = (
                pa.ipc.open_file(pa.memory_map(name))
                if self.ipc
                else pq.ParquetFile(name, memory_map=True)
            )
        if self.ipc:
            return handle.get_batch(g).column(self.column)
        col = handle.read_row_group(g, columns=[self.column]).column(0)
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_files"], state["_cache"] = {}, OrderedDict()
        if self._index is not None:  # mapped again, not copied, in a worker
            state["_sorted_ids"] = state["_tok_start"] = state["_tok_len"] = None
            state["_index"] = state["_opened"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._sorted_ids is None:
            self._open_index()

    # -- lookup ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sorted_ids)

    def __contains__(self, sample_id: object) -> bool:
        if not isinstance(sample_id, (int, np.integer)):
            return False
        if self._index is not None:
            return bool(self._index.find(np.array([sample_id], dtype=np.int64))[1][0])
        pos = min(int(np.searchsorted(self._sorted_ids, sample_id)), len(self) - 1)
        return bool(self._sorted_ids[pos] == sample_id)

    def rows(self, sample_ids: np.ndarray) -> np.ndarray:
        """Global row of each id (vectorised); :class:`InputError` names the first unknown id."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        if self._index is not None:  # the offline index: one page of ids per sample
            pos_c, found = self._index.find(ids)
            bad = ~found
        else:
            pos = np.searchsorted(self._sorted_ids, ids)
            pos_c = np.minimum(pos, len(self._sorted_ids) - 1)
            bad = self._sorted_ids[pos_c] != ids
        if bad.any():
            missing = int(ids[np.argmax(bad)])
            if self._opened is not None:  # a damaged index, rather than an unknown id?
                self._opened.check_ids(ids[bad])
            raise InputError(
                f"sample id {missing} is not in the tokenized dataset {self.files[0]}"
                f"{' (and others)' if len(self.files) > 1 else ''} (ids from "
                f"{'column ' + repr(self.id_column) if self.id_column else 'row numbers'}); was the "
                "plan made from this data, with the same ids (varpack lengths --id-column)?"
            )
        return pos_c if self._row_of is None else self._row_of[pos_c]

    def _row_group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, values) of one row group's token column, through the LRU cache."""
        hit = self._cache.get(g)
        if hit is not None:
            self._cache.move_to_end(g)
            return hit
        f, local = int(self._rg_file[g]), int(self._rg_local[g])
        arr = self._read_group(f, local)
        if not self.ipc:  # the pages hold what the footer declares, and all of it was read
            meta = self._files[f].metadata
            check_pages(self.files[f], meta, [self.column], [local])
            check_read(self.files[f], meta, local, self.column, arr)
        if len(arr) != self._rg_start[g + 1] - self._rg_start[g]:
            raise InputError(
                f"{self.files[f]}: row group {int(self._rg_local[g])} holds {len(arr):,} rows, "
                f"its footer declared {int(self._rg_start[g + 1] - self._rg_start[g]):,}; the "
                "file changed or is corrupt: rewrite it"
            )
        if isinstance(arr, pa.LargeListArray | pa.ListArray):
            if arr.null_count:
                raise InputError(f"{self.files[f]}: column {self.column!r} has null samples")
            if arr.values.null_count:
                raise InputError(f"{self.files[f]}: column {self.column!r} has null token ids")
            offsets = arr.offsets.to_numpy().astype(np.int64) - arr.offsets[0].as_py()
            values = arr.flatten().to_numpy(zero_copy_only=False)
        else:
            raise InputError(
                f"{self.files[f]}: column {self.column!r} is {arr.type}, not a list of tokens"
            )
        entry = (offsets, values)
        self._cache[g] = entry
        if len(self._cache) > self.cache_row_groups:
            self._cache.popitem(last=False)
        return entry

    def get_flat(
        self,
        sample_ids: np.ndarray,
        offsets: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        split_len: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of ``sample_ids`` concatenated in the given order, and each sample's length.

        With ``offsets`` and ``lengths`` (the pieces of split documents, ``--oversize split``),
        the tokens ``[offset, offset + length)`` of each sample instead of all of them, each
        checked against its document (with the plan's ``split_len``: see
        :func:`~varpack.torch.gather.slice_pieces`). One read per distinct row group; the copy
        is a vectorised segment gather.
        """
        ids = np.asarray(sample_ids, dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        rows = self.rows(ids)
        piece = None if offsets is None else (ids, offsets, lengths, split_len)
        if self.ipc:
            return self._gather_ipc(rows, ids, piece)
        groups = np.searchsorted(self._rg_start, rows, side="right") - 1
        order = np.argsort(groups, kind="stable")
        uniq, first = np.unique(groups[order], return_index=True)
        bounds = np.append(first, len(order))
        # Lengths first (needed for output offsets), then one gather per row group.
        src_start = np.empty(len(ids), dtype=np.int64)
        lens = np.empty(len(ids), dtype=np.int64)
        tables = []
        for k, g in enumerate(uniq):
            sel = order[bounds[k] : bounds[k + 1]]
            offsets, values = self._row_group(int(g))
            local = rows[sel] - self._rg_start[g]
            src_start[sel] = offsets[local]
            lens[sel] = offsets[local + 1] - offsets[local]
            tables.append((sel, values))
        if piece is not None:
            src_start, lens = slice_pieces(src_start, lens, piece[:3], piece[3])
        if len(tables) == 1:  # one row group (the usual case with Arrow IPC): one gather
            return tables[0][1][segment_gather_index(src_start, lens)], lens
        dst = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lens, out=dst[1:])
        out = np.empty(int(dst[-1]), dtype=tables[0][1].dtype)
        for sel, values in tables:
            idx = segment_gather_index(src_start[sel], lens[sel])
            out[segment_gather_index(dst[sel], lens[sel])] = values[idx]
        return out, lens

    def _gather_ipc(
        self, rows: np.ndarray, ids: np.ndarray, piece: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Straight from the copies: one gather per file (usually one file). Through an index,
        every sample read is verified against its check value first (the chunks a piece
        overlaps, for a piece), then cut to the piece (:mod:`~varpack.metadata.token_copies`)."""
        assert self._dtype is not None
        opened = self._opened
        if opened is None:  # positions built from the copies themselves: nothing to check with
            starts, lens = self._tok_start[rows], self._tok_len[rows].astype(np.int64)
            if piece is not None:
                starts, lens = slice_pieces(starts, lens, piece[:3], piece[3])
            files = np.searchsorted(self._file_start, rows, side="right") - 1
            return self._copies.gather_files(files, self._dtype, starts, lens), lens
        reads = opened.reads(rows, ids, *(() if piece is None else piece[1:3]))
        flat = self._copies.gather_verified(self._dtype, reads, ids)
        if piece is None:
            return flat, reads.length
        at = np.cumsum(reads.count) - reads.count - reads.offset  # each sample's token 0 in flat
        starts, lens = slice_pieces(at, reads.length, piece[:3], piece[3])
        return flat[segment_gather_index(starts, lens)], lens

    def get_many(self, sample_ids: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """One array per id, in order (views into one fetched buffer)."""
        flat, lens = self.get_flat(np.asarray(sample_ids, dtype=np.int64))
        return np.split(flat, np.cumsum(lens)[:-1])

    def __getitem__(self, sample_id: int) -> np.ndarray:
        return self.get_flat(np.asarray([sample_id]))[0]
