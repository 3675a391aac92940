"""Choose the P - 1 splitter keys of a sample sort from a weighted random sample (pure NumPy).

Each rank draws up to ``oversample`` of its composite keys at random and gives each the weight
``local_rows / drawn`` (so a rank with more rows counts for more); the splitters are the weighted
quantiles ``j / P`` of all ranks' samples together. Because the composite key ends with the unique
``sample_id``, keys never tie, so a length shared by 90 % of the rows is still cut wherever the
quantile falls: duplicate-heavy data splits as evenly as any other. With ``oversample`` samples
per rank, a part's relative size error is about ``1 / sqrt(oversample)``.
"""

from __future__ import annotations

import numpy as np


def draw_sample(keys: np.ndarray, oversample: int, seed: int) -> tuple[np.ndarray, float]:
    """Up to ``oversample`` keys drawn without replacement, and the weight of each.

    >>> s, w = draw_sample(np.arange(10, dtype=np.uint64), 4, seed=0)
    >>> len(s), w
    (4, 2.5)
    >>> draw_sample(np.arange(3, dtype=np.uint64), 4, seed=0)[1]
    1.0
    """
    n = len(keys)
    if n <= oversample:
        return keys.copy(), 1.0
    pos = np.sort(np.random.default_rng(seed).choice(n, size=oversample, replace=False))
    return keys[pos], n / oversample


def choose_splitters(samples: np.ndarray, weights: np.ndarray, parts: int) -> np.ndarray:
    """The ``parts - 1`` weighted-quantile keys; part ``r`` takes keys in ``[s[r-1], s[r])``.

    >>> keys = np.arange(100, dtype=np.uint64)
    >>> choose_splitters(keys, np.ones(100), 4).tolist()
    [25, 50, 75]
    """
    if parts <= 1 or len(samples) == 0:
        return samples[:0]
    order = np.argsort(samples, kind="stable")
    cum = np.cumsum(weights[order])
    targets = cum[-1] * np.arange(1, parts) / parts
    idx = np.minimum(np.searchsorted(cum, targets, side="left") + 1, len(samples) - 1)
    return samples[order][idx]
