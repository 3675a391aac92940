"""Several token copies (one per input shard) read as one through their indexes.

A corpus copied shard by shard (each shard by its own ``varpack lengths --arrow-copy``) has one
copy and one index (:mod:`varpack.metadata.token_index`) per shard. Where the copies' id ranges
do not overlap (ids numbered per shard range, or per-shard ids in disjoint blocks) they open as
one (:class:`Shards`): positions run on from copy to copy, and a lookup goes to the one copy
whose range holds the id, so it costs what it costs in one copy; nothing is built or copied at
open (:func:`open_copies`). Copies whose ranges overlap are opened without their indexes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.errors import InputError
from varpack.metadata import token_check, token_index
from varpack.metadata.token_index import TokenIndex, open_index


class _Joined:
    """Several mapped arrays read as one (``joined[positions]``), none copied."""

    def __init__(self, parts: list[np.ndarray], base: np.ndarray) -> None:
        self.parts, self.base = parts, base

    def __len__(self) -> int:
        return int(self.base[-1])

    def __getitem__(self, pos: np.ndarray) -> np.ndarray:
        pos = np.asarray(pos, dtype=np.int64)
        part = np.searchsorted(self.base, pos, side="right") - 1
        out = np.empty(len(pos), dtype=self.parts[0].dtype if self.parts else np.int64)
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

    def _copy_of(self, ids: np.ndarray) -> np.ndarray:
        return self.order[np.maximum(np.searchsorted(self.lows, ids, side="right") - 1, 0)]

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position, found)`` of each id over the copies (:meth:`TokenIndex.find`)."""
        q = np.asarray(ids, dtype=np.int64)
        pos = np.zeros(len(q), dtype=np.int64)
        found = np.zeros(len(q), dtype=bool)
        if len(self.lows) == 0 or len(q) == 0:
            return pos, found
        copy = self._copy_of(q)
        for k in np.unique(copy).tolist():
            sel = np.flatnonzero(copy == k)
            at, hit = self.parts[k].find(q[sel])
            pos[sel], found[sel] = at + self.base[k], hit
        return pos, found

    def damaged(self, ids: np.ndarray) -> int | None:
        """The first copy whose index fails :meth:`TokenIndex.intact` for ``ids``, or None."""
        q = np.asarray(ids, dtype=np.int64)
        copy = self._copy_of(q) if len(self.lows) else np.zeros(0, dtype=np.int64)
        bad = [k for k in np.unique(copy).tolist() if not self.parts[k].intact(q[copy == k])]
        return bad[0] if bad else None

    @property
    def ids(self) -> _Joined:
        return _Joined([p.ids for p in self.parts], self.base)

    @property
    def start(self) -> _Joined:
        return _Joined([p.start for p in self.parts], self.base)

    @property
    def length(self) -> _Joined:
        return _Joined([p.length for p in self.parts], self.base)

    @property
    def records(self) -> _Joined:
        return _Joined([p.records for p in self.parts], self.base)


@dataclass
class Reads:
    """What to read for a micro-batch, and what it must hash to: per sample its copy
    (``file``), where the read starts in it and how many tokens (``start``, ``count``), where
    that lies in the sample (``offset``), the sample's ``length``, its first chunk read ``k0``
    (:func:`~varpack.metadata.token_check.chunk_span`) and its ``check`` value from the index;
    per copy its chunk values (``tables``) and path (``files``, to name one that fails)."""

    file: np.ndarray
    start: np.ndarray
    count: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    k0: np.ndarray
    check: np.ndarray
    tables: list[np.ndarray]
    files: list[str]

    def refuse(self, bad: int, ids: np.ndarray) -> None:
        """One line for the sample ``bad`` whose tokens do not hash to their values."""
        name = self.files[int(self.file[bad])]
        raise InputError(
            f"{name}: the tokens read for sample id {int(ids[bad])} do not match its check "
            f"value in {name}{token_index.SUFFIX} (the copy or its index was damaged, or "
            f"the copy was rewritten since); {token_index.REWRITE.format(name)}"
        )


@dataclass
class Opened:
    """Token copies opened through their indexes: the lookup, the sorted ids, each sample's
    start and length (mapped arrays, or joined views over several copies), the first position
    of each copy (several copies), the token type, and per copy its path, length in tokens and
    longest sample (what a position read from the index must stay within); per copy, which of
    its record batches this process found as the index describes them (``verified``)."""

    index: TokenIndex | Shards
    ids: Any
    start: Any
    length: Any
    base: np.ndarray | None
    dtype: np.dtype
    files: list[str]
    tokens: np.ndarray
    max_length: np.ndarray
    verified: list[np.ndarray] = field(default_factory=list)
    all_verified: bool = False

    def __post_init__(self) -> None:
        self.verified = [np.zeros(len(b), dtype=bool) for b in self.batches]
        self.all_verified = all(done.all() for done in self.verified)

    @property
    def batches(self) -> list[np.ndarray]:
        """Each copy's record batches as its index holds them (:data:`token_index.BATCH`)."""
        index = self.index
        parts = index.parts if isinstance(index, Shards) else [index]
        return [p.batches for p in parts]

    def check_batches(self, file: np.ndarray, start: np.ndarray, length: np.ndarray) -> None:
        """Refuse in one line if a record batch that holds one of these samples (its copy
        ``file``, its first token ``start``) no longer holds the sample ids and token offsets
        its index was written with (the copy rewritten in place since): each batch is hashed
        once per process, the first time one of its samples is read (then nothing is left
        to do: a run soon reads a sample of every batch)."""
        if self.all_verified:
            return
        for f in np.unique(file).tolist() if self.base is not None else [0]:
            sel = slice(None) if self.base is None else file == f
            first, done = self.batches[f]["first"], self.verified[f]
            at = start[sel][length[sel] > 0]  # an empty sample lies in no batch's tokens
            b = np.maximum(np.searchsorted(first, at, side="right") - 1, 0)
            todo = np.unique(b[~done[b]]) if len(first) else b[:0]
            if len(todo):
                self._check_batches(f, todo.tolist())
                done[todo] = True
        self.all_verified = all(done.all() for done in self.verified)

    def _check_batches(self, f: int, batches: list[int]) -> None:
        """Hash record batches ``batches`` of copy ``f``: mapped for the while (only the pages
        of their ids and offsets are read; unmapped again, so ``read="pread"`` keeps no map)."""
        from varpack.metadata.tokens import ID, TOKENS

        name, want = self.files[f], self.batches[f]["digest"]
        got: dict[int, int] = {}
        try:
            with pa.memory_map(name) as mapped:
                reader = pa.ipc.open_file(mapped)
                for k in batches:
                    batch = reader.get_batch(k)
                    got[k] = token_index.batch_digest(batch.column(ID), batch.column(TOKENS))
                del reader, batch
        except (OSError, pa.ArrowException, KeyError, IndexError):
            pass  # what was not hashed is refused below
        for k in batches:
            if got.get(k) != int(want[k]):
                raise InputError(
                    f"{name}: its sample ids or token offsets (record batch {k}) are not those "
                    f"{name}{token_index.SUFFIX} was written with (the copy was rewritten "
                    f"since); {token_index.REWRITE.format(name)}"
                )

    def reads(
        self, pos: np.ndarray, ids: np.ndarray, offset: Any = None, want: Any = None
    ) -> Reads:
        """The reads of samples ``ids`` at index positions ``pos``: whole, or the chunks that
        cover tokens ``[offset, offset + want)`` of each. A position or length outside its copy
        or beyond the longest sample is refused before anything is read (one line)."""
        rec = self.index.records[pos]
        start, length, check = rec["start"], rec["length"], rec["check"]
        file = self.file_of(pos)
        bad = token_check.out_of_bounds(file, start, length, self.tokens, self.max_length)
        if bad >= 0:
            name = self.files[int(file[bad])]
            raise InputError(
                f"{name}{token_index.SUFFIX}: the token index places sample id {int(ids[bad])} "
                f"at token {int(start[bad]):,}, {int(length[bad]):,} tokens long: outside its "
                f"copy ({int(self.tokens[file[bad]]):,} tokens, the longest sample "
                f"{int(self.max_length[file[bad]]):,}), so the index is damaged or belongs to "
                f"another copy; {token_index.REWRITE.format(name)}"
            )
        self.check_batches(file, start, length)
        tables = self.tables
        if offset is None:  # whole samples: a long one is read as all its chunks
            zero = np.zeros(len(pos), dtype=np.int64)
            return Reads(file, start, length, zero, length, zero, check, tables, self.files)
        k0, count = token_check.chunk_span(np.asarray(offset), np.asarray(want), length)
        at, n = token_check.read_span(k0, count, length)
        return Reads(file, start + at, n, at, length, k0, check, tables, self.files)

    def check_ids(self, missing: np.ndarray) -> None:
        """Refuse in one line if the ids where ``missing`` were looked for are damaged (so
        that the id is not called unknown)."""
        index = self.index
        bad = index.damaged(missing) if isinstance(index, Shards) else (
            None if index.intact(missing) else 0)  # fmt: skip
        if bad is not None:
            name = self.files[bad]
            raise InputError(
                f"{name}{token_index.SUFFIX}: the token index is damaged (its ids, where sample "
                f"id {int(missing[0])} was looked for); {token_index.REWRITE.format(name)}"
            )

    @property
    def tables(self) -> list[np.ndarray]:
        """Each copy's chunk values."""
        index = self.index
        return [p.chunks for p in index.parts] if isinstance(index, Shards) else [index.chunks]

    def file_of(self, pos: np.ndarray) -> np.ndarray:
        if self.base is None:
            return np.zeros(len(pos), dtype=np.int64)
        return np.searchsorted(self.base, pos, side="right") - 1


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
    tokens = np.array([p.tokens for p in parts], dtype=np.int64)
    longest = np.array([p.max_length for p in parts], dtype=np.int64)
    if len(parts) == 1:
        one = parts[0]
        return Opened(one, one.ids, one.start, one.length, None, one.dtype, files, tokens, longest)
    shards = Shards.of(parts)
    if shards is None:
        return None
    return Opened(shards, shards.ids, shards.start, shards.length, shards.base, parts[0].dtype,
                  files, tokens, longest)  # fmt: skip
