"""The token copy's location index: sample id -> where its tokens lie, built offline, mapped.

A trainer process that opens the token copy needs, for every sample it will read, where its
tokens start in the mapped file and how many there are. Built at open time that is a pass over
the whole copy and about 30 bytes per sample *in every process* (8 per node, each holding the
whole dataset's index). ``varpack lengths --arrow-copy PATH`` therefore writes it once, beside the
copy, as ``PATH.idx``, memory-mapped by the reader, so opening reads a 4 KiB header and the small
tables below, nothing per sample; a lookup touches only the pages of its search, and the
processes of a node share the page cache.

Layout (version 3, all little-endian): a 4 KiB header (:data:`MAGIC`, then JSON: ``version``,
``rows``, ``token_type``, ``chunk``, ``chunks``, ``batches``, ``max_length``, the copy's ``size``
and ``tail_sha256`` (the digest of its last 64 KiB, which hold the IPC footer), and
``checksum``, a sha256 over the rest of the header, the fence, the block values and the batch
table); then ``ids`` (int64, ascending); one 24-byte record per sample (``start``: the first
token's position in the mapping, counted in tokens; ``length``; ``check``: its check value,
:mod:`varpack.metadata.token_check`), so a lookup reads one page of records; the *fence*: every
:data:`BLOCK`-th id; one check value per :data:`BLOCK` ids (read when a lookup fails, to tell
damage from an unknown id); the chunk values of samples longer than ``chunk`` tokens; and one
entry per record batch of the copy (:data:`BATCH`: where its tokens start, and a digest of its
sample ids and token offsets, :func:`batch_digest`).

Nothing in the index is trusted on its word: the header and the tables read at open are checked
against ``checksum`` and the copy's size and tail, a sample's position and length must lie within
the copy and the longest sample, and every sample read is checked against its check value, which
ties the tokens to the id asked for. The copy's own sample ids and token offsets, which the
reader does not otherwise read, are checked too: the first read of a sample in a record batch
(once per process) hashes that batch's ids and offsets against its digest, so a copy whose ids
or sample bounds were rewritten in place (its tokens where they were) is refused rather than
read by the index's stale word. A flipped bit anywhere in the index or the copy, a truncated
file, a copy rewritten since (even of the same size, its modification time kept) or an index
beside another copy is refused in one line, never read as another sample's tokens. An index of
version 1 (no check values) or 2 (no batch digests) is refused with the command that writes it
again.

Several copies (one per input shard) open as one where their id ranges do not overlap
(:mod:`varpack.metadata.token_copies`).

A lookup (:meth:`TokenIndex.find`) searches the fence, which the reader holds (8 bytes per 512
samples), then the one page of ``ids`` it points to: one page per sample, where a binary search
over the mapped ids would touch twenty (and the kernel's read-ahead many more, which the reader
turns off: ``MADV_RANDOM``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.errors import InputError
from varpack.metadata import token_check
from varpack.metadata.token_check import CHUNK

MAGIC = b"VARPACK-TOKEN-INDEX\n"
HEADER = 4096
VERSION = 3
TAIL = 64 * 1024
SUFFIX = ".idx"
#: ids per fence post: one 4 KiB page of int64 ids (the ids start on a page boundary)
BLOCK = 512
#: one sample's record: where its tokens start (in tokens), how many, its check value
RECORD = np.dtype([("start", "<i8"), ("length", "<i8"), ("check", "<u8")])
#: one record batch of the copy: its first token's position (in tokens), the digest of its ids
#: and token offsets (:func:`batch_digest`)
BATCH = np.dtype([("first", "<i8"), ("digest", "<u8")])
REWRITE = "write the copy and its index again: varpack lengths ... --arrow-copy {} --overwrite"


def index_path(copy: str | os.PathLike[str]) -> Path:
    """Where the index of the copy at ``copy`` lies.

    >>> index_path("data/tokens.arrow").name
    'tokens.arrow.idx'
    """
    return Path(f"{os.fspath(copy)}{SUFFIX}")


def is_index(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a token index varpack wrote (``--overwrite`` may replace it)."""
    try:
        with Path(path).open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _tail_digest(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - TAIL, 0))
        return hashlib.sha256(f.read()).hexdigest()


def _checksum(head: dict[str, Any], *tables: np.ndarray) -> str:
    """sha256 over the header's other keys and the tables the reader holds (fence, blocks)."""
    h = hashlib.sha256(json.dumps({k: v for k, v in head.items() if k != "checksum"},
                                  sort_keys=True).encode())  # fmt: skip
    for table in tables:
        h.update(np.ascontiguousarray(table).tobytes())
    return h.hexdigest()


def token_positions(
    path: str | os.PathLike[str], column: str
) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    """``(start, length, dtype)`` of every row's tokens in the uncompressed IPC file at
    ``path``: ``start`` in tokens from the start of the mapping (a sample's tokens lie at a
    fixed place in the file, so a micro-batch is one gather, whatever batches it spans)."""
    name = os.fspath(path)
    starts, lens, dtype = [], [], None
    for batch, first in _token_batches(name, column):
        arr = batch.column(column)
        got = np.dtype(arr.values.type.to_pandas_dtype())
        if dtype not in (None, got):
            raise InputError(
                f"{name}: column {column!r} holds null samples or tokens, or its token type "
                "differs between batches or files; rewrite it with "
                "`varpack lengths ... --arrow-copy PATH`"
            )
        dtype = got
        offsets = arr.offsets.to_numpy()
        starts.append(offsets[:-1].astype(np.int64) + first)
        lens.append(np.diff(offsets).astype(np.int64))
    if dtype is None:
        schema = pa.ipc.open_file(pa.memory_map(name)).schema
        dtype = np.dtype(schema.field(column).type.value_type.to_pandas_dtype())
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *starts]), np.concatenate([empty, *lens]), dtype


def _token_batches(name: str, column: str) -> Iterator[tuple[pa.RecordBatch, int]]:
    """``(batch, first)`` for each record batch of the IPC file ``name`` (mapped): ``first``,
    where the batch's tokens (its ``column``) start in the mapping, in tokens."""
    mapped = pa.memory_map(name)
    mapped.seek(0)
    base = mapped.read_buffer(mapped.size()).address
    mapped.seek(0)
    reader = pa.ipc.open_file(mapped)
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        arr = batch.column(column)
        if not isinstance(arr, pa.LargeListArray | pa.ListArray):
            raise InputError(f"{name}: column {column!r} is {arr.type}, not a list of tokens")
        values = arr.values
        got = np.dtype(values.type.to_pandas_dtype())
        if arr.null_count or values.null_count:
            raise InputError(
                f"{name}: column {column!r} holds null samples or tokens, or its token type "
                "differs between batches or files; rewrite it with "
                "`varpack lengths ... --arrow-copy PATH`"
            )
        buf = values.buffers()[1]
        first = 0
        if buf is not None and buf.size:
            at = buf.address - base
            if not 0 <= at <= mapped.size() - buf.size or at % got.itemsize:
                raise InputError(
                    f"{name}: the tokens are not stored uncompressed in the file; write the "
                    "copy with `varpack lengths ... --arrow-copy PATH`"
                )
            first = at // got.itemsize + values.offset
        yield batch, first


def batch_digest(ids: Any, tokens: Any) -> int:
    """A 64-bit digest of one record batch's sample ids and token offsets (its samples'
    bounds, from its first token): what ties the copy's rows to the index's positions.

    >>> tok = pa.array([[1, 2], [3]], pa.large_list(pa.int32()))
    >>> batch_digest(pa.array([5, 7]), tok) == batch_digest(pa.array([7, 5]), tok)
    False
    """
    offsets = np.ascontiguousarray(tokens.offsets.to_numpy(), dtype="<i8")  # zero-copy here
    if len(offsets) and offsets[0]:
        offsets = offsets - offsets[0]
    h = hashlib.sha256(np.ascontiguousarray(ids.to_numpy(), dtype="<i8").data)
    h.update(offsets.data)  # sha256: the fastest here (SHA-NI); no copy
    return int.from_bytes(h.digest()[:8], "little")


def batch_table(path: str | os.PathLike[str]) -> np.ndarray:
    """The :data:`BATCH` entry of every record batch of the copy at ``path``."""
    from varpack.metadata.tokens import ID, TOKENS

    got = [(first, batch_digest(batch.column(ID), batch.column(TOKENS)))
           for batch, first in _token_batches(os.fspath(path), TOKENS)]  # fmt: skip
    return np.array(got, dtype=BATCH)


def write_index(
    copy: str | os.PathLike[str],
    out: str | os.PathLike[str],
    values: tuple[np.ndarray, np.ndarray] | None = None,
) -> int:
    """Build the index of the copy at ``copy`` (ids from its ``sample_id`` column) and write
    it to ``out``; returns its rows. The check values are ``values`` (``(check, chunks)`` in
    the copy's row order, as its writer computed them) or computed from the copy's tokens. A
    repeated id is refused (one line)."""
    from varpack.metadata.tokens import ID, TOKENS

    path = Path(copy)
    ids = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column(ID).to_numpy()
    ids = ids.astype(np.int64, copy=False)
    start, length, dtype = token_positions(path, TOKENS)
    check, chunks = values if values is not None else _values(path, dtype, start, length, ids)
    if len(check) != len(ids):
        raise InputError(f"{path}: {len(ids):,} rows, {len(check):,} check values; write it again")
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    twice = np.flatnonzero(ids[1:] == ids[:-1])
    if len(twice):
        raise InputError(
            f"{path}: sample id {int(ids[twice[0]])} appears twice; ids must be unique"
        )
    records = np.empty(len(ids), dtype=RECORD)
    for name, column in (("start", start), ("length", length), ("check", check)):
        records[name] = column[order]
    fence, blocks = ids[::BLOCK], token_check.block_values(ids, BLOCK)
    batches = batch_table(path)
    head: dict[str, Any] = {
        "version": VERSION, "rows": len(ids), "token_type": dtype.str, "chunk": CHUNK,
        "chunks": len(chunks), "batches": len(batches), "max_length": int(length.max(initial=0)),
        "size": path.stat().st_size, "tail_sha256": _tail_digest(path),
    }  # fmt: skip
    head["checksum"] = _checksum(head, fence, blocks, batches)
    with Path(out).open("wb") as f:
        f.write((MAGIC + json.dumps(head).encode()).ljust(HEADER, b" "))
        for part in (ids, records, fence, blocks, chunks, batches):
            f.write(np.ascontiguousarray(part).tobytes())
    return len(ids)


def _values(
    path: Path, dtype: np.dtype, start: np.ndarray, length: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The check values of the copy's rows, computed from its tokens in its row order (one
    sequential pass over them; in id order it would be random)."""
    with path.open("rb") as f:
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else b""
    tokens = np.frombuffer(raw, dtype=dtype, count=len(raw) // dtype.itemsize)
    return token_check.sample_values(tokens, start, length, ids)


@dataclass(frozen=True)
class TokenIndex:
    """The index of one copy, mapped: ``ids`` ascending, the ``records`` alike (``start`` and
    ``length`` are views of them) and the ``chunks`` values; the ``fence`` (every
    :data:`BLOCK`-th id) and ``blocks`` (a check value per :data:`BLOCK` ids) in memory; the
    copy's length in ``tokens`` and its longest sample; ``batches``, the copy's record batches
    (:data:`BATCH`, in memory)."""

    ids: np.ndarray
    start: np.ndarray
    length: np.ndarray
    fence: np.ndarray
    dtype: np.dtype
    records: Any = None
    chunks: Any = None
    blocks: Any = None
    tokens: int = 0
    max_length: int = 0
    path: str = ""
    batches: Any = None

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position, found)`` of each id in ``self.ids``: the fence, then one block each.

        >>> idx = TokenIndex(np.arange(0, 3000, 3), None, None, np.arange(0, 3000, 3)[::BLOCK], None)
        >>> [v.tolist() for v in idx.find(np.array([3, 4, 2997, 1536]))]
        [[1, 2, 999, 512], [True, False, True, True]]
        """
        q = np.asarray(ids, dtype=np.int64)
        n = len(self.ids)
        if n == 0 or len(q) == 0:
            return np.zeros(len(q), dtype=np.int64), np.zeros(len(q), dtype=bool)
        # A binary search of each query within its block, all queries at once: log2(BLOCK)
        # rounds of one gather each, O(queries) memory, every read on the block's one page.
        lo = np.maximum(np.searchsorted(self.fence, q, side="right") - 1, 0) * BLOCK
        hi = np.minimum(lo + BLOCK, n)
        for _ in range(BLOCK.bit_length()):
            mid = (lo + hi) // 2
            less = (mid < hi) & (self.ids[np.minimum(mid, n - 1)] < q)
            lo = np.where(less, mid + 1, lo)
            hi = np.where(less, hi, mid)
        pos = lo
        found = self.ids[np.minimum(pos, n - 1)] == q
        return np.minimum(pos, n - 1), found

    def intact(self, ids: np.ndarray) -> bool:
        """Whether the blocks where :meth:`find` looked for ``ids`` still hold the ids the
        index was written with (asked when a lookup fails: damage, or unknown ids?)."""
        if self.blocks is None or len(self.ids) == 0:
            return True
        q = np.asarray(ids, dtype=np.int64)
        where = np.maximum(np.searchsorted(self.fence, q, side="right") - 1, 0)
        for b in np.unique(where).tolist():
            part = self.ids[b * BLOCK : (b + 1) * BLOCK]
            if token_check.block_values(part, BLOCK, b, len(self.ids))[0] != self.blocks[b]:
                return False
        return True


def _damaged(idx: Path, what: str) -> InputError:
    copy = str(idx)[: -len(SUFFIX)]
    return InputError(f"{idx}: the token index is damaged ({what}); {REWRITE.format(copy)}")


def _header(idx: Path) -> dict[str, Any]:
    """The index's header, parsed and of this version (its checksum is checked later)."""
    with idx.open("rb") as f:
        raw = f.read(HEADER)
    if not raw.startswith(MAGIC):
        raise InputError(f"{idx}: not a varpack token index; remove it")
    try:
        head = json.loads(raw[len(MAGIC) :].decode().strip())
        version = head["version"] if isinstance(head, dict) else None
    except (ValueError, KeyError, UnicodeDecodeError):
        raise _damaged(idx, "its header is not readable") from None
    copy = str(idx)[: -len(SUFFIX)]
    if version == 1 and "checksum" not in head:
        raise InputError(
            f"{idx}: a token index of version 1, without check values of the tokens; "
            f"{REWRITE.format(copy)}"
        )
    if version == 2:
        raise InputError(
            f"{idx}: a token index of version 2, which cannot tell whether the copy's sample ids "
            f"were rewritten since; {REWRITE.format(copy)}"
        )
    keys = ("rows", "chunk", "chunks", "batches", "max_length", "size")
    if version != VERSION or not all(type(head.get(k)) is int and head[k] >= 0 for k in keys):
        newer = type(version) is int and version > VERSION
        raise _damaged(idx, "header" + (f", or of version {version}: upgrade varpack" * newer))
    if head["chunk"] != CHUNK or not isinstance(head.get("token_type"), str):
        raise _damaged(idx, "header")
    try:
        dtype = np.dtype(head["token_type"])
    except TypeError:
        raise _damaged(idx, "token type") from None
    if dtype.kind not in "iu":
        raise _damaged(idx, "token type")
    return head


def open_index(copy: str | os.PathLike[str]) -> TokenIndex | None:
    """The mapped index beside the copy at ``copy``; ``None`` when there is none. An index that
    is not one, is damaged, or belongs to another copy, is refused in one line."""
    path, idx = Path(copy), index_path(copy)
    if not idx.is_file():
        return None
    head = _header(idx)
    rows, chunks = head["rows"], head["chunks"]
    posts = -(-rows // BLOCK)
    want = HEADER + (8 + RECORD.itemsize) * rows + 16 * posts + 8 * chunks
    want += BATCH.itemsize * head["batches"]
    if idx.stat().st_size != want:
        raise _damaged(idx, f"{idx.stat().st_size:,} bytes, its header says {want:,}")
    at = HEADER + (8 + RECORD.itemsize) * rows
    fence = np.fromfile(idx, dtype="<i8", count=posts, offset=at)
    blocks = np.fromfile(idx, dtype="<u8", count=posts, offset=at + 8 * posts)
    batches = np.fromfile(idx, dtype=BATCH, count=head["batches"],
                          offset=at + 16 * posts + 8 * chunks)  # fmt: skip
    if head.get("checksum") != _checksum(head, fence, blocks, batches):
        raise _damaged(idx, "checksum")
    if head["size"] != path.stat().st_size or head.get("tail_sha256") != _tail_digest(path):
        raise InputError(
            f"{idx} does not belong to {path} (the copy was rewritten since); "
            f"{REWRITE.format(path)}, or remove the index to read the copy unchecked"
        )
    raw = _mapped(idx)
    ids = _view(raw, "<i8", rows, HEADER)
    records = _view(raw, RECORD, rows, HEADER + 8 * rows)
    dtype = np.dtype(head["token_type"])
    return TokenIndex(
        ids, records["start"], records["length"], fence, dtype, records,
        _view(raw, "<u8", chunks, at + 16 * posts), blocks, head["size"] // dtype.itemsize,
        head["max_length"], str(idx), batches,
    )  # fmt: skip


def _mapped(path: Path) -> mmap.mmap | None:
    """The file at ``path`` mapped without read-ahead (lookups are random: read-ahead would
    bring whole neighbourhoods of the index into every process)."""
    with path.open("rb") as f:
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    return raw


def _view(raw: mmap.mmap | None, dtype: Any, count: int, offset: int) -> np.ndarray:
    """``count`` items at ``offset`` of the map: a plain array over it (not ``np.memmap``,
    whose indexing costs more than the lookup)."""
    if count == 0 or raw is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
