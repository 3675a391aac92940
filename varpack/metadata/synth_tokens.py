"""The token ids of a synthetic tokenized dataset (``varpack synth --tokenized``), by pattern.

- ``random``: ids uniform in ``[0, V)``, independent: realistic bytes for benchmarks, nothing
  a model can learn (its loss stays at ``ln V``).
- ``count``: each sample counts up by one from a random id, wrapping at ``V`` (``17, 18, 19,
  ...``): the next token follows from the one before, so a model learns it within a few dozen
  steps and its loss falls far below ``ln V`` (``make demo`` trains on it).

Both draw from the caller's generator in row order, one vectorised pass per block of rows, so
the same seed gives the same bytes whatever the shard count.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: token patterns of ``synth --tokenized``
PATTERNS = ("random", "count")
#: Upper bound on tokens per row group of a tokenized dataset (~32 MiB of int32 tokens).
TOKENS_PER_GROUP = 1 << 23
#: Default rows per row group of a tokenized dataset (the token bound usually cuts first).
TOKENIZED_GROUP_ROWS = 4096


def group_cuts(lens: np.ndarray, max_rows: int, max_tokens: int = TOKENS_PER_GROUP) -> np.ndarray:
    """Row-group boundaries (start offsets plus the end) so groups hold <= ``max_rows`` rows and
    about ``max_tokens`` tokens (a group may exceed it by its last row).

    >>> group_cuts(np.array([5, 5, 5, 5, 5]), max_rows=2, max_tokens=100).tolist()
    [0, 2, 4, 5]
    >>> group_cuts(np.array([60, 60, 60]), max_rows=10, max_tokens=100).tolist()
    [0, 2, 3]
    """
    n = len(lens)
    before = np.cumsum(lens) - lens
    by_tokens = np.flatnonzero(np.diff(before // max_tokens)) + 1
    by_rows = np.arange(0, n, max(1, max_rows))
    return np.unique(np.concatenate([[0, n], by_rows, by_tokens]))


def token_values(
    lens: np.ndarray, rng: np.random.Generator, vocab: int, pattern: str = "random"
) -> np.ndarray:
    """The flat int32 token ids of samples of lengths ``lens``, one pattern of :data:`PATTERNS`.

    >>> token_values(np.array([3, 2]), np.random.default_rng(0), 10, "count").tolist()
    [8, 9, 0, 6, 7]
    """
    total = int(lens.sum())
    if pattern == "random":
        return rng.integers(0, vocab, size=total, dtype=np.int32)
    start = rng.integers(0, vocab, size=len(lens), dtype=np.int64)
    first = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64) - np.repeat(first, lens)
    return ((np.repeat(start, lens) + pos) % vocab).astype(np.int32)


def token_table(
    ids: np.ndarray,
    lens: np.ndarray,
    rng: np.random.Generator,
    vocab: int,
    pattern: str = "random",
) -> pa.Table:
    """A tokenized table (``sample_id``, ``input_ids`` list<int32>) of one pattern.

    Built from one offsets array and one flat array of ids, no per-row work.

    >>> t = token_table(np.array([7, 9]), np.array([2, 3]), np.random.default_rng(0), 10)
    >>> [len(x) for x in t.column("input_ids").to_pylist()]
    [2, 3]
    """
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    values = token_values(lens, rng, vocab, pattern)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table({"sample_id": pa.array(ids, pa.int64()), "input_ids": tokens})
