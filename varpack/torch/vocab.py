"""Check the plan's token ids against a model's vocabulary before training starts.

A token id at or above the vocabulary size fails deep in the model (an ``IndexError`` in the
embedding on the CPU, a device-side assert on CUDA) after the model, optimizer and maybe a
compile were set up. :func:`check_vocab` reads every distinct sample of this rank's manifest
once, in chunks of samples (one vectorised gather per chunk, a memory-mapped gather for the Arrow
token copy), and raises one line naming the largest id, a sample holding it and what to do.

>>> import numpy as np
>>> data = {0: np.array([1, 2]), 1: np.array([7, 3]), 2: np.array([0])}
>>> token_range(data, np.array([2, 0, 1, 0]))
(0, 7, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.torch.dataset import fetch_flat

#: samples fetched per gather (bounds the memory the check needs)
CHUNK = 1 << 16


def token_range(
    dataset: Any, sample_ids: np.ndarray, chunk: int = CHUNK
) -> tuple[int, int, int | None]:
    """(smallest id, largest id, a sample holding the largest) over ``sample_ids``' tokens.

    Each distinct sample is read once. Empty input: ``(0, -1, None)``.
    """
    ids = np.unique(np.asarray(sample_ids, dtype=np.int64))
    lo, hi, where = 0, -1, None
    for a in range(0, len(ids), chunk):
        part = ids[a : a + chunk]
        tokens, lens = fetch_flat(dataset, part)
        if len(tokens) == 0:
            continue
        top = int(tokens.max())
        lo = min(lo, int(tokens.min())) if hi >= 0 else int(tokens.min())
        if top > hi:
            at = int(np.argmax(tokens))  # first position of the maximum
            hi, where = top, int(part[np.searchsorted(np.cumsum(lens), at, side="right")])
    return lo, hi, where


def check_vocab(loader: Any, vocab_size: int, what: str = "--vocab-size") -> int:
    """Raise :class:`InputError` (one line) if this rank's samples hold an id outside
    ``[0, vocab_size)``; returns the largest id found.

    ``loader``: a :class:`~varpack.torch.loader.PlanLoader` (its rank's manifest and dataset).
    ``what``: how the user sets the vocabulary, named in the message.
    """
    lo, hi, sample = token_range(loader.dataset.dataset, loader.rows.ids)
    if hi >= vocab_size:
        raise InputError(
            f"{loader.path}: rank {loader.rank}'s samples hold token id {hi:,} (sample id "
            f"{sample}) but the model's vocabulary has {vocab_size:,} entries (ids 0..{vocab_size - 1:,}); "
            f"raise {what} to at least {hi + 1:,}, or train on data tokenized for this model"
        )
    if lo < 0:
        raise InputError(
            f"{loader.path}: rank {loader.rank}'s samples hold the negative token id {lo}; "
            "token ids must be >= 0 (re-tokenize the data)"
        )
    return hi
