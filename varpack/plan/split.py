"""Splitting long documents into pieces (``--oversize split``), vectorised.

A document longer than the split length ``S`` becomes ``ceil(L / S)`` consecutive pieces: pieces
``0 .. k-2`` hold ``S`` tokens, the last one the rest; piece ``j`` starts at token ``j * S`` of
its document (its *offset*). Every other document stays one unit with offset 0. The planner then
works on units (ids, lengths, offsets) sorted by ``(length, id, offset)``, the order it expects
its input in, so every later stage plans pieces like any sample.

``group`` numbers the split documents (``-1`` for a whole one): the packer uses it to keep the
pieces of one document out of each other's micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from varpack.plan.rules import round_up


@dataclass
class Units:
    """Documents and pieces in planning order (sorted by length, id, offset)."""

    ids: np.ndarray
    lens: np.ndarray
    offsets: np.ndarray  # first token of the unit in its document
    group: np.ndarray  # split document number, -1 for a whole document


def fit_len(max_tokens: int, pad_multiple: int) -> int:
    """The longest sample that fits a budget alone (packed or padded: one row, rounded up).

    >>> fit_len(100, 1), fit_len(100, 64), fit_len(100, 40)
    (100, 64, 80)
    """
    return (max_tokens // pad_multiple) * pad_multiple


def unit_count(lens: np.ndarray, split_len: int | None) -> int:
    """Units the planner will see: documents, each split one counted as its pieces.

    >>> unit_count(np.array([3, 10, 25]), 8), unit_count(np.array([3]), None)
    (7, 1)
    """
    if split_len is None:
        return len(lens)
    long = lens[lens > split_len]
    return len(lens) + int((-(-long // split_len) - 1).sum())


def pieces(ids: np.ndarray, lens: np.ndarray, split_len: int) -> Units:
    """The pieces of documents ``ids`` / ``lens`` (all longer than ``split_len``), sorted.

    >>> u = pieces(np.array([7, 3]), np.array([5, 4]), 2)
    >>> u.ids.tolist(), u.lens.tolist(), u.offsets.tolist(), u.group.tolist()
    ([7, 3, 3, 7, 7], [1, 2, 2, 2, 2], [4, 0, 2, 0, 2], [0, 1, 1, 0, 0])
    """
    lens = lens.astype(np.int64, copy=False)
    count = -(-lens // split_len)
    doc = np.repeat(np.arange(len(lens), dtype=np.int64), count)
    first = np.cumsum(count) - count
    offs = (np.arange(len(doc), dtype=np.int64) - np.repeat(first, count)) * split_len
    plens = np.minimum(split_len, lens[doc] - offs)
    pid = ids[doc]
    order = np.lexsort((offs, pid, plens))
    return Units(pid[order], plens[order], offs[order], doc[order])


def split_units(ids: np.ndarray, lens: np.ndarray, split_len: int) -> Units | None:
    """Every document as units: those longer than ``split_len`` in pieces (``None``: none is).

    ``ids`` / ``lens`` are sorted by (length, id); so is the result, by (length, id, offset): a
    merge of the whole documents with the pieces (one pass, no sort of the whole input).
    """
    long = lens > split_len
    if not long.any():
        return None
    keep = ~long
    part = pieces(ids[long], lens[long], split_len)
    take = _merge(lens[keep], ids[keep], part.lens, part.ids, part.offsets)
    n_whole = int(keep.sum())
    whole = np.flatnonzero(keep)
    src_ids = np.concatenate((ids[whole], part.ids))
    src_lens = np.concatenate((lens[whole], part.lens))
    src_offs = np.concatenate((np.zeros(n_whole, np.int64), part.offsets))
    src_group = np.concatenate((np.full(n_whole, -1, np.int64), part.group))
    return Units(src_ids[take], src_lens[take], src_offs[take], src_group[take])


@njit(cache=True)
def _merge(lens_a, ids_a, lens_b, ids_b, offs_b):  # type: ignore[no-untyped-def]
    """Positions (``a`` first, then ``b`` shifted by ``len(a)``) of the merge of two runs sorted
    by (length, id[, offset]); a whole document and a piece never share an id."""
    na, nb = len(lens_a), len(lens_b)
    out = np.empty(na + nb, dtype=np.int64)
    i = j = k = 0
    while i < na and j < nb:
        if lens_a[i] < lens_b[j] or (lens_a[i] == lens_b[j] and ids_a[i] < ids_b[j]):
            out[k] = i
            i += 1
        else:
            out[k] = na + j
            j += 1
        k += 1
    while i < na:
        out[k] = i
        i += 1
        k += 1
    while j < nb:
        out[k] = na + j
        j += 1
        k += 1
    return out


def token_figures(
    total: int, dropped: int, split: int, documents_split: int, num_pieces: int
) -> dict[str, int | float]:
    """plan.json ``stats.tokens``: tokens kept (planned, split ones included), split and dropped,
    as counts and as shares of all input tokens, plus the documents split and their pieces.

    >>> token_figures(100, 10, 30, 1, 4)["kept_share"]
    0.9
    """

    def share(x: int) -> float:
        return x / total if total else 0.0

    kept = total - dropped
    return {
        "total": total,
        "kept": kept,
        "split": split,
        "dropped": dropped,
        "kept_share": share(kept),
        "split_share": share(split),
        "dropped_share": share(dropped),
        "documents_split": documents_split,
        "pieces": num_pieces,
    }


def alone_volume(lens: np.ndarray, pad_multiple: int) -> np.ndarray:
    """Tokens a micro-batch of one sample processes (one row, rounded up; both layouts)."""
    return round_up(lens.astype(np.int64, copy=False), pad_multiple)
