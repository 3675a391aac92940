"""A synthetic ``source`` column (``varpack synth --sources K``): which corpus a sample came from.

Real corpora carry such columns (a source, a language); ``varpack plan --carry source`` takes
one into the manifests. The synthetic one is a pure function of the sample id (a multiplicative
hash), so it is the same however the rows are cut into blocks or shards. Sources are skewed like
a real mixture: source ``k`` is drawn with weight ``1 / (k + 1)``.

>>> source_column(np.array([1, 2, 3, 4]), 3).to_pylist()
['code', 'web', 'books', 'web']
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from varpack.errors import ConfigError

NAME = "source"
#: Names of the first sources; more are called ``source-K``.
NAMES = ("web", "code", "books", "papers", "wiki", "chat", "math", "forums")
MAX_SOURCES = 1000
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def source_names(k: int) -> list[str]:
    """The names of ``k`` sources.

    >>> source_names(2)
    ['web', 'code']
    """
    if not 1 <= k <= MAX_SOURCES:
        raise ConfigError(f"--sources {k}: give between 1 and {MAX_SOURCES} sources")
    return [NAMES[i] if i < len(NAMES) else f"source-{i}" for i in range(k)]


def source_column(ids: np.ndarray, k: int) -> pa.DictionaryArray:
    """The source of every sample id, dictionary-encoded (``k`` names, weights ``1/(i+1)``)."""
    names = source_names(k)
    mixed = np.asarray(ids).astype(np.uint64) * _GOLDEN  # wraps: a keyed bijection of the id
    u = (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    weights = np.cumsum(1.0 / np.arange(1, k + 1))
    index = np.searchsorted(weights / weights[-1], u, side="right").astype(np.int32)
    return pa.DictionaryArray.from_arrays(np.minimum(index, k - 1), pa.array(names))
