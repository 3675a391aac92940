"""Encode sort keys into one comparable array (the ordering rule of ``varpack sort``).

The order is: the key columns in the order given (each ascending, or descending when listed in
``descending``), then ``sample_id`` ascending, so the order is total (ids are unique) and does not
depend on how the data is split across ranks.

Every field becomes an order-preserving unsigned code (integers: sign bit flipped; floats: the
IEEE-754 bit trick, NaN canonicalised to sort last, ``-0.0`` read as ``0.0``), shifted by the
global minimum so it needs only ``bit_length(max - min)`` bits; descending fields are inverted
within that range. The fields are packed, most significant first, into 64-bit words. When they
fit into one word (the usual case: a length and an id need ~50 bits) the key is a plain
``uint64`` array, sorted by NumPy's SIMD sort; otherwise the words are stored big-endian as a
fixed-width byte string (``S{8K}``) whose byte order is the lexicographic order of the words.
The encoding is invertible, so the distributed sort moves only the keys and decodes the columns
at the end. The global minima and maxima are the only thing ranks must agree on
(:func:`merge_stats` is what the MPI reduction computes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from varpack.errors import ConfigError

ID = "sample_id"
LEN = "seq_len"
_SIGN = np.uint64(1 << 63)
_ALL = np.uint64((1 << 64) - 1)
#: (min, max) of a field's codes where a rank holds no rows: the identities of MIN and MAX.
EMPTY_STATS = (int(_ALL), 0)


@dataclass(frozen=True)
class KeySpec:
    """The user's choice: key columns and which of them sort descending."""

    keys: tuple[str, ...] = (LEN,)
    descending: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("no sort key given; pass --key COLUMN (default seq_len)")
        dup = [k for k in self.keys if self.keys.count(k) > 1]
        if dup:
            raise ConfigError(f"key column '{dup[0]}' given twice; list each --key once")
        extra = [d for d in self.descending if d not in self.keys]
        if extra:
            raise ConfigError(
                f"--descending {extra[0]} is not a sort key (keys: {', '.join(self.keys)}); "
                f"add --key {extra[0]}"
            )

    @property
    def fields(self) -> tuple[str, ...]:
        """Columns that make up the composite key, most significant first (ends with the id)."""
        return self.keys if ID in self.keys else (*self.keys, ID)

    @property
    def columns(self) -> tuple[str, ...]:
        """Columns of the sorted output: id, length, then the other keys."""
        return tuple(dict.fromkeys([ID, LEN, *self.keys]))

    @property
    def payload(self) -> tuple[str, ...]:
        """Output columns not recoverable from the key (``seq_len`` unless it is a key)."""
        return tuple(c for c in self.columns if c not in self.fields)


@dataclass(frozen=True)
class Field:
    """One component of the composite key, with the global range of its codes."""

    name: str
    is_float: bool
    descending: bool
    lo: int
    hi: int

    @property
    def width(self) -> int:
        return max(self.hi - self.lo, 0).bit_length()


@dataclass(frozen=True)
class Layout:
    """Where each field lives: ``slots[i] = (word, shift)``; ``words`` words per key."""

    fields: tuple[Field, ...]
    slots: tuple[tuple[int, int], ...]
    words: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint64) if self.words == 1 else np.dtype(f"S{8 * self.words}")


def codes(values: np.ndarray, is_float: bool) -> np.ndarray:
    """Order-preserving uint64 codes of an integer or float column.

    >>> codes(np.array([-2, 0, 5]), False).argsort().tolist()
    [0, 1, 2]
    >>> c = codes(np.array([1.5, -np.inf, np.nan, -0.0, 0.0, -3.0]), True)
    >>> c.argsort(kind="stable").tolist()
    [1, 5, 3, 4, 0, 2]
    """
    if is_float:
        x = np.asarray(values, dtype=np.float64).copy()
        x[np.isnan(x)] = np.nan  # one canonical (positive) NaN: sorts after +inf
        x[x == 0] = 0.0  # -0.0 == 0.0 as in NumPy and polars
        bits = x.view(np.uint64)
        return bits ^ np.where(bits >> np.uint64(63), _ALL, _SIGN)
    c = np.asarray(values, dtype=np.int64).view(np.uint64) ^ _SIGN
    return c


def uncodes(c: np.ndarray, is_float: bool) -> np.ndarray:
    """Inverse of :func:`codes` (int64 or float64)."""
    c = np.asarray(c, dtype=np.uint64)
    if is_float:
        return (c ^ np.where(c >> np.uint64(63), _SIGN, _ALL)).view(np.float64)
    return (c ^ _SIGN).view(np.int64)


def is_float_column(values: np.ndarray) -> bool:
    return bool(np.issubdtype(np.asarray(values).dtype, np.floating))


def local_stats(
    columns: Mapping[str, np.ndarray], spec: KeySpec, float_keys: Sequence[str]
) -> np.ndarray:
    """Per field ``[min, max]`` of the codes (uint64, shape ``(fields, 2)``); identities if empty."""
    out = np.empty((len(spec.fields), 2), dtype=np.uint64)
    for i, name in enumerate(spec.fields):
        col = columns[name]
        if len(col) == 0:
            out[i] = EMPTY_STATS
        else:
            c = codes(col, name in float_keys)
            out[i] = (c.min(), c.max())
    return out


def merge_stats(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Combine two ranks' stats (what the MIN/MAX allreduce computes)."""
    return np.stack([np.minimum(a[:, 0], b[:, 0]), np.maximum(a[:, 1], b[:, 1])], axis=1)


def make_layout(spec: KeySpec, stats: np.ndarray, float_keys: Sequence[str]) -> Layout:
    """Fields with their global ranges, packed greedily into 64-bit words (no field straddles).

    >>> spec = KeySpec(("seq_len",))
    >>> lay = make_layout(spec, np.array([[10, 1033], [0, 99]], dtype=np.uint64), ())
    >>> [f.width for f in lay.fields], lay.slots, lay.words
    ([10, 7], ((0, 7), (0, 0)), 1)
    """
    fields = tuple(
        Field(name, name in float_keys, name in spec.descending, int(lo), int(hi))
        for name, (lo, hi) in zip(spec.fields, stats.tolist(), strict=True)
    )
    groups: list[list[int]] = [[]]
    used = 0
    for i, f in enumerate(fields):
        if used + f.width > 64:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += f.width
    slots: list[tuple[int, int]] = [(0, 0)] * len(fields)
    for w, members in enumerate(groups):
        shift = 0
        for i in reversed(members):  # the first field of a word takes its highest bits
            slots[i] = (w, shift)
            shift += fields[i].width
    return Layout(fields, tuple(slots), len(groups))


def encode(columns: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray:
    """Composite keys (``layout.dtype``) of the rows; their sort order is the output order."""
    n = len(columns[layout.fields[0].name])
    words = np.zeros((layout.words, n), dtype=np.uint64)
    for f, (w, shift) in zip(layout.fields, layout.slots, strict=True):
        if f.width == 0:
            continue  # a constant field adds no order
        v = codes(columns[f.name], f.is_float)  # a fresh array: the ops below are in place
        v -= np.uint64(f.lo)
        if f.descending:
            np.subtract(np.uint64(f.hi - f.lo), v, out=v)
        v <<= np.uint64(shift)
        words[w] |= v
        del v
    if layout.words == 1:
        return words[0]
    return np.ascontiguousarray(words.T).astype(">u8").view(layout.dtype).reshape(n)


def decode(keys: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """The field columns (int64 or float64) of composite keys; inverse of :func:`encode`."""
    n = len(keys)
    if layout.words == 1:
        words = np.asarray(keys, dtype=np.uint64).reshape(1, n)
    else:
        words = keys.view(">u8").reshape(n, layout.words).astype(np.uint64).T
    out: dict[str, np.ndarray] = {}
    for f, (w, shift) in zip(layout.fields, layout.slots, strict=True):
        v = words[w] >> np.uint64(shift)  # fresh array; the rest is in place
        v &= np.uint64((1 << f.width) - 1)
        if f.descending:
            np.subtract(np.uint64(f.hi - f.lo), v, out=v)
        v += np.uint64(f.lo)
        if f.is_float:
            out[f.name] = uncodes(v, True)
        else:
            v ^= _SIGN
            out[f.name] = v.view(np.int64)
    return out
