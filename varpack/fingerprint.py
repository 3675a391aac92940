"""Fingerprints: of a set of (sample_id, seq_len) pairs (order-independent), and of a file.

The fingerprint of a dataset must not depend on how it is sharded, ordered or split across MPI
ranks, so it is a sum (mod 2**64) of a strong 64-bit mix of every pair, plus the count and the
token total. Partial fingerprints combine by addition, which is what an MPI reduction needs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (wraps modulo 2**64 by design)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


@dataclass(frozen=True)
class Fingerprint:
    """Partial or whole fingerprint; ``a + b`` is the fingerprint of the union of disjoint parts."""

    count: int = 0
    tokens: int = 0
    digest: int = 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(
            self.count + other.count,
            self.tokens + other.tokens,
            (self.digest + other.digest) % (1 << 64),
        )

    @property
    def hex(self) -> str:
        """Stable text form, e.g. ``'n3-t60-8f0c...'`` (count, tokens, 64-bit digest)."""
        return f"n{self.count}-t{self.tokens}-{self.digest:016x}"


def fingerprint(sample_ids: np.ndarray, seq_lens: np.ndarray) -> Fingerprint:
    """Fingerprint of the pairs; independent of their order.

    >>> ids, lens = np.array([5, 1, 9]), np.array([10, 20, 30])
    >>> fingerprint(ids, lens) == fingerprint(ids[::-1], lens[::-1])
    True
    >>> a = fingerprint(ids[:1], lens[:1]) + fingerprint(ids[1:], lens[1:])
    >>> a == fingerprint(ids, lens)
    True
    """
    ids = np.asarray(sample_ids).astype(np.uint64, copy=False)
    lens = np.asarray(seq_lens).astype(np.uint64, copy=False)
    with np.errstate(over="ignore"):
        h = _mix64(_mix64(ids) ^ (lens * _GOLDEN))
    digest = int(h.sum(dtype=np.uint64)) if len(h) else 0
    return Fingerprint(int(len(ids)), int(lens.sum(dtype=np.uint64)), digest)


def sha256_file(path: str | os.PathLike[str], block: int = 1 << 22, skip: int = 0) -> str:
    """Hex sha256 of a file's bytes after the first ``skip``, read in blocks (the checksums of
    plan and sort outputs; a single-file sort output's records follow its header)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(skip)
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()
