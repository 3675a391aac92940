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

from varpack.plan.kernels.inputs import frozen
from varpack.plan.rules import round_up
from varpack.plan.segments import gather_positions


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

    ``ids`` / ``lens`` are sorted by (length, id); so is the result, by (length, id, offset): one
    merge pass of the whole documents with the pieces (no sort, no gather of the whole input).
    """
    long = lens > split_len
    if not long.any():
        return None
    part = pieces(ids[long], lens[long], split_len)
    n = len(ids) - int(long.sum()) + len(part.ids)
    out = Units(
        np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    )
    merge_pieces(
        frozen(ids, np.int64),
        frozen(lens, np.int64),
        long,
        part.ids,
        part.lens,
        part.offsets,
        part.group,
        out.ids,
        out.lens,
        out.offsets,
        out.group,
    )
    return out


@njit(cache=True)
def merge_pieces(ids, lens, long, pid, plen, poff, pgroup, o_ids, o_lens, o_offs, o_group):  # type: ignore[no-untyped-def]
    """Merge the whole documents (``ids``/``lens`` where not ``long``) with the pieces, both
    sorted by (length, id[, offset]), into the ``o_*`` arrays; a document and a piece never
    share an id."""
    na, nb = len(ids), len(pid)
    i = j = k = 0
    while True:
        while i < na and long[i]:
            i += 1
        if i >= na and j >= nb:
            break
        if j >= nb or (i < na and (lens[i] < plen[j] or (lens[i] == plen[j] and ids[i] < pid[j]))):
            o_ids[k], o_lens[k], o_offs[k], o_group[k] = ids[i], lens[i], 0, -1
            i += 1
        else:
            o_ids[k], o_lens[k], o_offs[k], o_group[k] = pid[j], plen[j], poff[j], pgroup[j]
            j += 1
        k += 1


@dataclass
class Documents:
    """The documents that units are made of (``plan --mix`` draws documents, then plans their
    pieces): document ``d`` is units ``order[start[d] : start[d] + count[d]]``, in offset order."""

    ids: np.ndarray
    lens: np.ndarray  # the document's tokens: its units' summed
    count: np.ndarray  # its units (1: a whole document)
    start: np.ndarray
    order: np.ndarray
    of_unit: np.ndarray  # each unit's document

    def expand(self, drawn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The units of the documents ``drawn`` (positions, with repeats), and for each unit
        its drawn document's place in ``drawn``."""
        counts = self.count[drawn]
        pos, _ = gather_positions(self.start[drawn], counts)
        return self.order[pos], np.repeat(np.arange(len(drawn), dtype=np.int64), counts)


def documents(ids: np.ndarray, lens: np.ndarray, offsets: np.ndarray | None,
              group: np.ndarray | None) -> Documents:  # fmt: skip
    """The documents of units ``ids`` / ``lens`` (``group``: each unit's split document, -1 for
    a whole one; ``None``: every unit is a whole document), numbered split ones first.

    >>> d = documents(np.array([7, 3, 5, 7]), np.array([1, 2, 2, 2]), np.array([2, 0, 0, 0]),
    ...               np.array([0, -1, -1, 0]))
    >>> d.ids.tolist(), d.lens.tolist(), d.count.tolist()
    ([7, 3, 5], [3, 2, 2], [2, 1, 1])
    >>> [a.tolist() for a in d.expand(np.array([0, 2, 0]))]
    [[3, 0, 2, 3, 0], [0, 0, 1, 2, 2]]
    """
    n = len(ids)
    if group is None or offsets is None:
        at = np.arange(n, dtype=np.int64)
        return Documents(ids, lens.astype(np.int64), np.ones(n, np.int64), at, at, at)
    whole = group < 0
    split = int(group.max()) + 1 if not whole.all() else 0
    doc = np.where(whole, split + np.cumsum(whole) - 1, group).astype(np.int64)
    count = np.bincount(doc, minlength=split + int(whole.sum())).astype(np.int64)
    d_ids = np.empty(len(count), np.int64)
    d_ids[doc] = ids
    d_lens = np.bincount(doc, weights=lens, minlength=len(count)).astype(np.int64)
    order = np.lexsort((offsets, doc))
    start = np.cumsum(count) - count
    return Documents(d_ids, d_lens, count, start, order, doc)


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
