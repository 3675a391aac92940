"""Vectorised gathers of samples and of pieces of samples (``--oversize split``).

:func:`segment_gather_index` turns (start, length) pairs into one index array, so a micro-batch
is one NumPy gather; :func:`slice_pieces` moves those pairs onto the pieces a plan names
(``tokens[offset : offset + length]`` of each document); :func:`fetch_flat` fetches a
micro-batch from any dataset keyed by sample id (``get_flat`` when it has one, else one lookup
per sample) and checks its tokens are ids an embedding can take (:func:`check_token_ids`).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.metadata.token_check import segments as segment_gather_index


def slice_pieces(
    starts: np.ndarray,
    lens: np.ndarray,
    piece: tuple[np.ndarray, Any, Any],
    split_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Where the pieces ``(ids, offsets, lengths)`` of samples at ``starts`` / ``lens`` lie.

    With the plan's ``split_len`` ``S`` every piece is checked against its document as the
    planner cut it: a piece shorter than ``S`` is a whole document or the last piece, so it ends
    where the document ends; a piece of ``S`` tokens starts at a multiple of ``S``.

    >>> slice_pieces(np.array([0]), np.array([10]), (np.array([7]), [8], [2]), 4)[1].tolist()
    [2]
    >>> slice_pieces(np.array([0]), np.array([11]), (np.array([7]), [8], [2]), 4)
    Traceback (most recent call last):
    varpack.errors.InputError: sample id 7 has 11 tokens in the dataset; the plan's piece at offset 8 of 2 tokens says 10; was the plan made from this data? (re-run varpack lengths and plan)
    """
    ids, offsets, lengths = piece
    offs = np.asarray(offsets, dtype=np.int64)
    want = np.asarray(lengths, dtype=np.int64)
    bad = (offs < 0) | (offs + want > lens)
    if split_len:
        tail = want < split_len
        bad |= (tail & (offs + want != lens)) | (offs % split_len != 0) | (want > split_len)
    if bad.any():
        k = int(np.argmax(bad))
        says = (
            f"says {int(offs[k] + want[k])}" if offs[k] + want[k] <= lens[k] else "lies outside it"
        )
        raise InputError(
            f"sample id {int(ids[k])} has {int(lens[k])} tokens in the dataset; the plan's piece at "
            f"offset {int(offs[k])} of {int(want[k])} tokens {says}; was the plan made from this "
            "data? (re-run varpack lengths and plan)"
        )
    return starts + offs, want


def fetch_flat(
    dataset: Any,
    sample_ids: np.ndarray,
    offsets: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    split_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``sample_ids`` concatenated, and their lengths, from any dataset keyed by id.

    Uses ``dataset.get_flat`` when it exists (batched reads; with pieces it is called as
    ``get_flat(ids, offsets, lengths)``); otherwise one ``dataset[id]`` each (a dict, a Hugging
    Face dataset indexed by id, ...), converting tensors or lists to NumPy. With ``offsets`` and
    ``lengths`` each sample is the piece ``tokens[offset:offset + length]`` of its document.
    """
    if hasattr(dataset, "get_flat"):
        if offsets is None:
            got = dataset.get_flat(sample_ids)
        elif split_len and _takes_split_len(dataset.get_flat):
            got = dataset.get_flat(sample_ids, offsets, lengths, split_len=split_len)
        else:
            got = dataset.get_flat(sample_ids, offsets, lengths)
        flat, lens = np.asarray(got[0]), np.asarray(got[1], dtype=np.int64)
    else:
        flat, lens = _fetch_each(dataset, sample_ids)
        if offsets is not None:
            starts = np.cumsum(lens) - lens
            starts, lens = slice_pieces(starts, lens, (sample_ids, offsets, lengths), split_len)
            flat = flat[segment_gather_index(starts, lens)]
    check_token_ids(flat, sample_ids, lens)
    return flat, lens


def check_token_ids(tokens: np.ndarray, sample_ids: np.ndarray, lens: np.ndarray) -> None:
    """Every token an integer id an embedding can index: ``>= 0`` and within int64 (the check
    ``varpack lengths`` makes, here for any dataset); one vectorised pass over the batch.

    >>> check_token_ids(np.array([3, -1]), np.array([5, 9]), np.array([1, 1]))
    Traceback (most recent call last):
    varpack.errors.InputError: sample id 9: token id -1 in the dataset; token ids are integers >= 0 within int64 (check the tokenizer's output)
    """
    if not len(tokens):
        return
    if tokens.dtype.kind not in "iu":
        raise InputError(
            f"sample id {int(sample_ids[0])}: the dataset gives {tokens.dtype} tokens, expected "
            "integer token ids; tokenize the text first, or choose the token column"
        )
    if tokens.dtype.kind == "i":
        bad = tokens < 0 if tokens.min() < 0 else None
    else:
        bad = tokens > np.iinfo(np.int64).max if tokens.max() > np.iinfo(np.int64).max else None
    if bad is not None:
        at = int(np.argmax(bad))
        k = int(np.searchsorted(np.cumsum(lens), at, side="right"))
        raise InputError(
            f"sample id {int(sample_ids[k])}: token id {tokens[at]} in the dataset; token ids are "
            "integers >= 0 within int64 (check the tokenizer's output)"
        )


def _fetch_each(dataset: Any, sample_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One ``dataset[id]`` per sample, concatenated."""
    parts = []
    for sid in sample_ids.tolist():
        try:
            item = dataset[sid]
        except (KeyError, IndexError):
            raise InputError(
                f"sample id {sid} is not in the dataset; was the plan made from this data?"
            ) from None
        if hasattr(item, "numpy"):  # a torch tensor
            item = item.numpy()
        parts.append(np.asarray(item).reshape(-1))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lens = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    return np.concatenate(parts), lens


def _takes_split_len(method: Any) -> bool:
    """Whether a dataset's ``get_flat`` checks pieces itself (``split_len=``, as
    :class:`~varpack.torch.dataset.ParquetTokenDataset` does)."""
    try:
        return "split_len" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
