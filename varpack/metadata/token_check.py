"""Check values tying a token copy's samples to their ids, written in its index, verified on read.

The token index (:mod:`varpack.metadata.token_index`) says where each sample's tokens lie in the
copy. A flipped bit in it, or a copy rewritten since (two samples of the same length swapped, a
copy of another dataset of the same size), would make the reader return another sample's tokens
with the length the plan expects. So the index also holds, per sample, a 64-bit **check value**
of ``(sample id, length, tokens)``, and the reader recomputes it over every sample it returns
(:func:`gather_verified`: one numba pass copies the micro-batch and hashes it on the way): a
wrong position, length, id or token is refused instead of trained on.

A sample longer than :data:`CHUNK` tokens has one check value per chunk of :data:`CHUNK` tokens
(:func:`chunk_span`), each of ``(id, length, chunk number, the chunk's tokens)``, so that a piece
of a split document (``--oversize split``) is verified by reading the chunks it overlaps, not the
whole document. Its entry in the index then holds where its chunks' values start in the index's
chunk table, which ties them to it just as well: a wrong pointer lands on another sample's values.

The hash: the tokens as unsigned integers of their width, four interleaved lanes of
``rotl((lane ^ token) * P1, 29)`` seeded from the id, length and chunk number, folded by a
murmur-style finaliser. Each step is a bijection of its lane and of its token, so a change of
any one token (a flipped bit) always changes the value; other damage goes undetected with
probability about 2^-64 per sample. It guards against damage and stale files, not against a
deliberate forgery (whoever can rewrite the copy can rewrite its index too).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: tokens per check value of a long sample (a piece reads at most the chunks it overlaps)
CHUNK = 4096

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)


@njit(inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(inline="always")
def _fmix(h: np.uint64) -> np.uint64:
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


@njit(inline="always")
def _step(lane: np.uint64, token: np.uint64) -> np.uint64:
    return _rotl((lane ^ token) * _P1, 29)


@njit(inline="always")
def _chunk_value(u: np.ndarray, a: int, n: int, sid: int, length: int, k: int) -> np.uint64:
    """Check value of tokens ``u[a : a + n]``, chunk ``k`` of sample ``sid`` of ``length``."""
    seed = _fmix((np.uint64(sid) * _P1) ^ (np.uint64(length) * _P2) ^ np.uint64(k))
    l0, l1, l2, l3 = seed + _P1, seed + _P2, seed + _P3, seed + _P4
    i, end = a, a + n
    while i + 4 <= end:  # four independent chains: the multiplies overlap
        l0 = _step(l0, np.uint64(u[i]))
        l1 = _step(l1, np.uint64(u[i + 1]))
        l2 = _step(l2, np.uint64(u[i + 2]))
        l3 = _step(l3, np.uint64(u[i + 3]))
        i += 4
    while i < end:
        l0 = _step(l0, np.uint64(u[i]))
        i += 1
    return _fmix(_rotl(l0, 1) + _rotl(l1, 7) + _rotl(l2, 12) + _rotl(l3, 18) + seed)


@njit(cache=True)
def _sample_values(
    u: np.ndarray, start: np.ndarray, length: np.ndarray, ids: np.ndarray, first: np.ndarray,
    check: np.ndarray, chunks: np.ndarray, chunk: int,
) -> None:  # fmt: skip
    for s in range(len(ids)):
        n, a = length[s], start[s]
        if n <= chunk:
            check[s] = _chunk_value(u, a, n, ids[s], n, 0)
            continue
        check[s] = first[s]
        for k in range((n + chunk - 1) // chunk):
            take = min(chunk, n - k * chunk)
            chunks[first[s] + k] = _chunk_value(u, a + k * chunk, take, ids[s], n, k)


def unsigned(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` seen as unsigned integers of their width (what the hash reads), no copy,
    read-only and contiguous (:func:`_given`)."""
    return _given(tokens.view(np.dtype(f"u{tokens.dtype.itemsize}")))


def _given(a: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """A kernel's input as one numba type: C-contiguous, of ``dtype``, read-only (a view; a
    copy only where the layout or dtype differ). numba compiles a kernel again for each
    readonly flag and layout it meets (a memory map, an Arrow buffer, a slice): 18 variants
    of the read kernel in one test run, a second of CPU each. (The planner's kernels do the
    same through ``varpack.plan.kernels.inputs.frozen``; metadata may not import the planner.)"""
    v = np.ascontiguousarray(a, dtype=dtype).view()
    v.flags.writeable = False
    return v


def sample_values(
    tokens: np.ndarray, start: np.ndarray, length: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(check, chunks)`` of the samples ``ids`` lying at ``tokens[start : start + length]``:
    per sample its check value, or for a sample longer than :data:`CHUNK` the position of its
    first chunk value in ``chunks`` (where its chunks' values follow in order).

    >>> t = np.arange(5000, dtype=np.int32)
    >>> check, chunks = sample_values(t, np.array([0, 10]), np.array([3, 4990]), np.array([7, 8]))
    >>> int(check[1]), len(chunks)
    (0, 2)
    """
    long = length > CHUNK
    count = np.where(long, -(-length // CHUNK), 0)
    first = np.cumsum(count) - count
    check = np.empty(len(ids), dtype=np.uint64)
    chunks = np.empty(int(count.sum()), dtype=np.uint64)
    i64 = np.int64
    _sample_values(
        unsigned(tokens), _given(start, i64), _given(length, i64), _given(ids, i64),
        _given(first, i64), check, chunks, CHUNK,
    )  # fmt: skip
    return check, chunks


def chunk_span(
    offset: np.ndarray, want: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(first chunk, chunks)`` to read for tokens ``[offset, offset + want)`` of samples of
    ``length``: all of a sample of at most :data:`CHUNK` tokens (one value), else the chunks
    the range overlaps, at least one and none past the sample's last (a range outside the
    sample is then refused by the plan check, after the chunk read has been verified).

    >>> [x.tolist() for x in chunk_span(np.array([0, 8192, 5000, 9000]),
    ...     np.array([10, 4096, 4000, 10]), np.array([20, 12288, 12288, 8000]))]
    [[0, 2, 1, 1], [1, 1, 2, 1]]
    """
    count = np.where(length > CHUNK, -(-length // CHUNK), 1)
    last = np.maximum(count - 1, 0)
    lo = np.minimum(np.maximum(offset, 0) // CHUNK, last)
    hi = np.minimum(-(-(offset + want) // CHUNK), count)
    lo = np.where(length > CHUNK, lo, 0)
    return lo, np.maximum(np.where(length > CHUNK, hi - lo, 1), 1)


@njit(cache=True)
def _out_of_bounds(
    file: np.ndarray, start: np.ndarray, length: np.ndarray, tokens: np.ndarray,
    longest: np.ndarray,
) -> int:  # fmt: skip
    for s in range(len(start)):
        f = file[s]
        if not (0 <= length[s] <= longest[f] and 0 <= start[s] <= tokens[f] - length[s]):
            return s
    return -1


def out_of_bounds(
    file: np.ndarray, start: np.ndarray, length: np.ndarray, tokens: np.ndarray,
    longest: np.ndarray,
) -> int:  # fmt: skip
    """The first sample whose ``[start, start + length)`` does not lie in its copy ``file``
    of ``tokens[file]`` tokens, or is longer than its copy's longest sample; -1 if none.

    >>> one = np.array([0, 0])
    >>> out_of_bounds(one, np.array([0, 5]), np.array([5, 6]), np.array([10]), np.array([6]))
    1
    """
    args = (_given(a, np.int64) for a in (file, start, length, tokens, longest))
    return int(_out_of_bounds(*args))


@njit(cache=True)
def _gather_verified(
    src: np.ndarray, src_start: np.ndarray, count: np.ndarray, dst: np.ndarray,
    dst_start: np.ndarray, ids: np.ndarray, length: np.ndarray, k0: np.ndarray,
    check: np.ndarray, table: np.ndarray, chunk: int,
) -> int:  # fmt: skip
    for s in range(len(count)):
        a, b, n, size = src_start[s], dst_start[s], count[s], length[s]
        for i in range(n):  # the copy, then the hash over it while it is in the cache
            dst[b + i] = src[a + i]
        k, end = k0[s], b + n
        first = np.int64(check[s]) if check[s] < np.uint64(1 << 62) else np.int64(-1)
        while True:  # one value for a short sample, one per chunk read of a long one
            take = size if size <= chunk else min(chunk, size - k * chunk)
            if take < 0 or b + take > end:
                return s
            if size <= chunk:
                want = check[s]
            elif 0 <= first and first + k < len(table):  # the sample's chunk values
                want = table[first + k]
            else:
                return s
            if _chunk_value(dst, b, take, ids[s], size, k) != want:
                return s
            b, k = b + take, k + 1
            if b >= end:
                break
    return -1


def gather_verified(
    src: np.ndarray,
    src_start: np.ndarray,
    count: np.ndarray,
    dst: np.ndarray,
    dst_start: np.ndarray,
    ids: np.ndarray,
    length: np.ndarray,
    k0: np.ndarray,
    check: np.ndarray,
    table: np.ndarray,
) -> int:
    """Copy ``src[src_start : src_start + count]`` of each sample to ``dst[dst_start : ...]``
    and verify it on the way: the first sample whose tokens do not hash to their check values
    (or whose chunk values lie outside ``table``), or -1.

    Sample ``s`` (id ``ids[s]``, ``length[s]`` tokens) is read whole when it is at most
    :data:`CHUNK` long, and hashes to ``check[s]``; else it is read as its chunks from
    ``k0[s]`` on (:func:`read_span`), which hash to ``table[check[s] + k]``. One pass, in
    numba: the copy costs less than NumPy's gather, the hash about as much again.

    >>> t = np.arange(20, dtype=np.int32)
    >>> check, table = sample_values(t, np.array([0, 5]), np.array([5, 15]), np.array([1, 2]))
    >>> out, zero = np.empty(20, dtype=np.int32), np.zeros(2, dtype=np.int64)
    >>> args = np.array([5, 15]), out, np.array([0, 5]), np.array([1, 2]), np.array([5, 15])
    >>> gather_verified(t, np.array([0, 5]), *args, zero, check, table)
    -1
    >>> gather_verified(t, np.array([0, 5]), *args, zero, check[::-1], table)
    0
    """
    i64, u64 = np.int64, np.uint64
    return int(
        _gather_verified(
            unsigned(src),
            _given(src_start, i64),
            _given(count, i64),
            dst.view(np.dtype(f"u{dst.dtype.itemsize}")),
            _given(dst_start, i64),
            _given(ids, i64),
            _given(length, i64),
            _given(k0, i64),
            _given(check, u64),
            _given(table, u64),
            CHUNK,
        )  # fmt: skip
    )


def warm() -> None:
    """Start the read kernels now. numba's first call in a process costs about half a second
    of CPU (its compiler's tables, even when the kernel comes from its cache), the same at
    every dataset size: :mod:`varpack.torch` pays it when it is imported, with the imports, so
    that opening a copy and reading its first micro-batch do not, and DataLoader workers forked
    later inherit it."""
    t = np.zeros(1, dtype=np.int32)
    one = np.ones(1, dtype=np.int64)
    out_of_bounds(0 * one, 0 * one, one, one, one)
    gather_verified(
        t,
        0 * one,
        one,
        t.copy(),
        0 * one,
        one,
        one,
        0 * one,
        one.astype(np.uint64),
        one.astype(np.uint64),
    )


def segments(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ranges ``[s, s + l)`` for every (start, length), vectorised.

    >>> segments(np.array([10, 3]), np.array([2, 3])).tolist()
    [10, 11, 3, 4, 5]
    """
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lens)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lens), lens)


def read_span(
    k0: np.ndarray, count: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(offset, tokens)`` within each sample that its chunks ``k0 .. k0 + count - 1`` cover.

    >>> [x.tolist() for x in read_span(np.array([0, 1]), np.array([1, 2]), np.array([7, 9000]))]
    [[0, 4096], [7, 4904]]
    """
    long = length > CHUNK
    lo = np.where(long, k0 * CHUNK, 0)
    hi = np.where(long, np.minimum((k0 + count) * CHUNK, length), length)
    return lo, hi - lo


@njit(cache=True)
def _block_values(ids: np.ndarray, block: int, b0: int, total: int, out: np.ndarray) -> None:
    for b in range(len(out)):
        a = b * block
        out[b] = _chunk_value(ids, a, min(block, len(ids) - a), b0 + b, total, 0)


def block_values(ids: np.ndarray, block: int, b0: int = 0, total: int = -1) -> np.ndarray:
    """One check value per ``block`` ids (the lookup's blocks), for ``ids`` starting at block
    ``b0`` of an index of ``total`` ids (default: ``ids`` is all of them): verified when a
    lookup fails, to tell a damaged index from an id the copy does not hold.

    >>> v = block_values(np.arange(10), 4)
    >>> len(v), int(block_values(np.arange(4, 8), 4, 1, 10)[0]) == int(v[1])
    (3, True)
    """
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    out = np.empty(-(-len(ids) // block), dtype=np.uint64)
    _block_values(unsigned(ids), block, b0, len(ids) if total < 0 else total, out)
    return out
