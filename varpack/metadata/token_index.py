"""The token copy's location index: sample id -> where its tokens lie, built offline, mapped.

A trainer process that opens the token copy needs, for every sample it will read, where its
tokens start in the mapped file and how many there are. Built at open time that is a pass over
the whole copy and about 30 bytes per sample *in every process* (8 per node, each holding the
whole dataset's index). ``varpack lengths --arrow-copy PATH`` therefore writes it once, beside the
copy, as ``PATH.idx``: three arrays sorted by sample id, memory-mapped by the reader, so opening
reads a 4 KiB header and nothing proportional to the dataset, a lookup touches only the pages
of its binary search, and the processes of a node share the page cache.

Layout: a 4 KiB header (:data:`MAGIC`, then JSON: ``version``, ``rows``, ``token_type``, and the
copy's ``size`` and ``tail_sha256``, the digest of its last 64 KiB, which hold the IPC footer),
then ``ids`` (int64, ascending), ``start`` (int64: the first token's position in the mapping,
counted in tokens) and ``length`` (int64), each ``rows`` long, and the *fence*: every
:data:`BLOCK`-th id. The header ties the index to its copy: a copy rewritten since is refused in
one line instead of read at wrong offsets.

Several copies (one per input shard) open as one (:class:`Shards`) where their id ranges do not
overlap: a lookup goes to the copy whose range holds the id.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.errors import InputError

MAGIC = b"VARPACK-TOKEN-INDEX\n"
HEADER = 4096
VERSION = 1
TAIL = 64 * 1024
SUFFIX = ".idx"
#: ids per fence post: one 4 KiB page of int64 ids (the ids start on a page boundary)
BLOCK = 512


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


def token_positions(
    path: str | os.PathLike[str], column: str
) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    """``(start, length, dtype)`` of every row's tokens in the uncompressed IPC file at
    ``path``: ``start`` in tokens from the start of the mapping (a sample's tokens lie at a
    fixed place in the file, so a micro-batch is one gather, whatever batches it spans)."""
    name = os.fspath(path)
    mapped = pa.memory_map(name)
    mapped.seek(0)
    base = mapped.read_buffer(mapped.size()).address
    mapped.seek(0)
    reader = pa.ipc.open_file(mapped)
    starts, lens, dtype = [], [], None
    for i in range(reader.num_record_batches):
        arr = reader.get_batch(i).column(column)
        if not isinstance(arr, pa.LargeListArray | pa.ListArray):
            raise InputError(f"{name}: column {column!r} is {arr.type}, not a list of tokens")
        values = arr.values
        got = np.dtype(values.type.to_pandas_dtype())
        if arr.null_count or values.null_count or dtype not in (None, got):
            raise InputError(
                f"{name}: column {column!r} holds null samples or tokens, or its token type "
                "differs between batches or files; rewrite it with "
                "`varpack lengths ... --arrow-copy PATH`"
            )
        dtype = got
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
        offsets = arr.offsets.to_numpy()
        starts.append(offsets[:-1].astype(np.int64) + first)
        lens.append(np.diff(offsets).astype(np.int64))
    if dtype is None:
        dtype = np.dtype(reader.schema.field(column).type.value_type.to_pandas_dtype())
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *starts]), np.concatenate([empty, *lens]), dtype


def write_index(copy: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """Build the index of the copy at ``copy`` (ids from its ``sample_id`` column) and write it
    to ``out``; returns its rows. A repeated id is refused (one line)."""
    from varpack.metadata.tokens import ID, TOKENS

    path = Path(copy)
    ids = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column(ID).to_numpy()
    start, length, dtype = token_positions(path, TOKENS)
    order = np.argsort(ids, kind="stable")
    ids = ids[order].astype(np.int64)
    twice = np.flatnonzero(ids[1:] == ids[:-1])
    if len(twice):
        raise InputError(
            f"{path}: sample id {int(ids[twice[0]])} appears twice; ids must be unique"
        )
    head = {"version": VERSION, "rows": len(ids), "token_type": dtype.str,
            "size": path.stat().st_size, "tail_sha256": _tail_digest(path)}  # fmt: skip
    text = MAGIC + json.dumps(head).encode()
    with Path(out).open("wb") as f:
        f.write(text.ljust(HEADER, b" "))
        for part in (ids, start[order], length[order], ids[::BLOCK]):
            f.write(np.ascontiguousarray(part, dtype="<i8").tobytes())
    return len(ids)


@dataclass(frozen=True)
class TokenIndex:
    """The index of one copy, mapped: ``ids`` ascending, ``start`` and ``length`` alike; the
    ``fence`` (every :data:`BLOCK`-th id) in memory."""

    ids: np.ndarray
    start: np.ndarray
    length: np.ndarray
    fence: np.ndarray
    dtype: np.dtype

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


def open_index(copy: str | os.PathLike[str]) -> TokenIndex | None:
    """The mapped index beside the copy at ``copy``; ``None`` when there is none. An index that
    is not one, or belongs to another copy, is refused in one line."""
    path, idx = Path(copy), index_path(copy)
    if not idx.is_file():
        return None
    with idx.open("rb") as f:
        raw = f.read(HEADER)
    try:
        if not raw.startswith(MAGIC):
            raise ValueError("no header")
        head = json.loads(raw[len(MAGIC) :].decode().strip())
        rows, version = int(head["rows"]), int(head["version"])
    except (ValueError, KeyError, UnicodeDecodeError):
        raise InputError(f"{idx}: not a varpack token index; remove it") from None
    stale = head.get("size") != path.stat().st_size or head.get("tail_sha256") != _tail_digest(path)
    posts = -(-rows // BLOCK)
    if version != VERSION or stale or idx.stat().st_size != HEADER + 24 * rows + 8 * posts:
        raise InputError(
            f"{idx} does not belong to {path} (the copy was rewritten, or the index is from "
            "another version); write both again with varpack lengths --arrow-copy, or remove "
            "the index to open the copy without it"
        )
    arrays = [_mapped(idx, HEADER + k * 8 * rows, rows) for k in range(3)]
    fence = np.fromfile(idx, dtype="<i8", count=posts, offset=HEADER + 24 * rows)
    return TokenIndex(arrays[0], arrays[1], arrays[2], fence, np.dtype(head["token_type"]))


def _mapped(path: Path, offset: int, rows: int) -> np.ndarray:
    """``rows`` int64 at ``offset`` of ``path``, mapped without read-ahead (lookups are random:
    read-ahead would bring whole neighbourhoods of the index into every process). A plain
    array over the map (not ``np.memmap``, whose indexing costs more than the lookup)."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    with path.open("rb") as f:
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(raw, dtype="<i8", count=rows, offset=offset)


class _Joined:
    """Several mapped arrays read as one (``joined[positions]``), none copied."""

    def __init__(self, parts: list[np.ndarray], base: np.ndarray) -> None:
        self.parts, self.base = parts, base

    def __len__(self) -> int:
        return int(self.base[-1])

    def __getitem__(self, pos: np.ndarray) -> np.ndarray:
        pos = np.asarray(pos, dtype=np.int64)
        part = np.searchsorted(self.base, pos, side="right") - 1
        out = np.empty(len(pos), dtype=np.int64)
        for k in np.unique(part).tolist():
            sel = part == k
            out[sel] = self.parts[k][pos[sel] - self.base[k]]
        return out


@dataclass
class Shards:
    """The indexes of several copies (one per input shard) as one: positions run on from copy
    to copy (``base``), and a lookup goes to the one copy whose id range holds the id, so each
    costs what it costs in one copy. Only for copies whose id ranges do not overlap
    (:meth:`of`)."""

    parts: list[TokenIndex]
    base: np.ndarray  # first position of each copy, and the end
    lows: np.ndarray  # the copies' smallest ids, ascending
    order: np.ndarray  # the copy of each entry of ``lows``

    @classmethod
    def of(cls, parts: list[TokenIndex]) -> Shards | None:
        """The copies as one, or None where two copies' id ranges overlap.

        >>> one = TokenIndex(np.array([1, 5]), None, None, np.array([1]), None)
        >>> two = TokenIndex(np.array([7, 9]), None, None, np.array([7]), None)
        >>> Shards.of([two, one]).find(np.array([5, 9, 6]))[0].tolist()
        [3, 1, 3]
        >>> Shards.of([one, TokenIndex(np.array([4]), None, None, np.array([4]), None)]) is None
        True
        """
        sizes = [len(p.ids) for p in parts]
        base = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        held = [k for k, n in enumerate(sizes) if n]
        lows = np.array([int(parts[k].ids[0]) for k in held], dtype=np.int64)
        highs = np.array([int(parts[k].ids[-1]) for k in held], dtype=np.int64)
        by_low = np.argsort(lows, kind="stable")
        if (highs[by_low][:-1] >= lows[by_low][1:]).any():
            return None
        return cls(parts, base, lows[by_low], np.asarray(held, dtype=np.int64)[by_low])

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position, found)`` of each id over the copies (:meth:`TokenIndex.find`)."""
        q = np.asarray(ids, dtype=np.int64)
        pos = np.zeros(len(q), dtype=np.int64)
        found = np.zeros(len(q), dtype=bool)
        if len(self.lows) == 0 or len(q) == 0:
            return pos, found
        copy = self.order[np.maximum(np.searchsorted(self.lows, q, side="right") - 1, 0)]
        for k in np.unique(copy).tolist():
            sel = np.flatnonzero(copy == k)
            at, hit = self.parts[k].find(q[sel])
            pos[sel], found[sel] = at + self.base[k], hit
        return pos, found

    @property
    def ids(self) -> _Joined:
        return _Joined([p.ids for p in self.parts], self.base)

    @property
    def start(self) -> _Joined:
        return _Joined([p.start for p in self.parts], self.base)

    @property
    def length(self) -> _Joined:
        return _Joined([p.length for p in self.parts], self.base)


@dataclass
class Opened:
    """Token copies opened through their indexes: the lookup, the sorted ids, each sample's
    start and length (mapped arrays, or joined views over several copies), the first position
    of each copy (several copies), and the token type."""

    index: TokenIndex | Shards
    ids: Any
    start: Any
    length: Any
    base: np.ndarray | None
    dtype: np.dtype


def open_copies(files: list[str]) -> Opened | None:
    """The copies at ``files`` through their indexes, as one; None where one has no index, or
    two copies' id ranges overlap. Copies of different token types are refused in one line."""
    found = [open_index(f) for f in files]
    parts = [index for index in found if index is not None]
    if len(parts) < len(files):
        return None
    for name, index in zip(files, parts, strict=True):
        if index.dtype != parts[0].dtype:
            raise InputError(
                f"{name}: holds another token type ({index.dtype}) than {files[0]} "
                f"({parts[0].dtype}); rewrite it with `varpack lengths ... --arrow-copy PATH`"
            )
    if len(parts) == 1:
        one = parts[0]
        return Opened(one, one.ids, one.start, one.length, None, one.dtype)
    shards = Shards.of(parts)
    if shards is None:
        return None
    return Opened(shards, shards.ids, shards.start, shards.length, shards.base, parts[0].dtype)
