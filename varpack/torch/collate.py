"""Collation of one manifest row into a batch: NumPy index arithmetic, no per-sample loops.

The ``pack_*`` functions are pure: token buffer + lengths + the row's shape in, arrays out. The
``collate_*`` functions wrap them into the dataclasses of :mod:`varpack.torch.batch`. Every
shape comes from the plan (``pad_to``, ``pad_rows``), never from the data, so the shapes a rank
sees are exactly the shapes the planner recorded.

>>> a = pack_packed(np.arange(1, 6), np.array([2, 3]), pad_to=8)
>>> a["input_ids"].tolist(), a["position_ids"].tolist(), a["cu_seqlens"].tolist()
([1, 2, 3, 4, 5, 0, 0, 0], [0, 1, 0, 1, 2, 0, 1, 2], [0, 2, 5, 8])
>>> a["labels"].tolist()
[-100, 2, -100, 4, 5, -100, -100, -100]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from varpack.errors import InputError, VarpackError
from varpack.torch.batch import IGNORE_INDEX, BlockBatch, PackedBatch, PaddedBatch

LAYOUTS = ("packed", "padded", "blocks")


@dataclass(frozen=True)
class RowInfo:
    """One manifest row (a micro-batch), with the flags the reader derives."""

    step: int
    micro: int
    sample_ids: np.ndarray
    seq_lens: np.ndarray
    pad_to: int
    lr_factor: float
    step_tokens: int
    step_samples: int
    warmup: bool
    is_last_micro: bool
    epoch: int = 0
    pad_rows: int = 0
    block_index: np.ndarray | None = None
    sample_offsets: np.ndarray | None = None  # --oversize split: each piece's first token
    carry: dict[str, np.ndarray] | None = None  # carried columns (strings: object arrays)

    def where(self) -> str:
        return f"step {self.step} micro {self.micro}"


def _segments(seg_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cu_seqlens (int32) and per-token position within its segment."""
    cu = np.zeros(len(seg_lens) + 1, dtype=np.int64)
    np.cumsum(seg_lens, out=cu[1:])
    pos = np.arange(int(cu[-1]), dtype=np.int64)
    pos -= np.repeat(cu[:-1], seg_lens)
    return cu.astype(np.int32), pos


def pack_packed(
    tokens: np.ndarray, lens: np.ndarray, pad_to: int, pad_id: int = 0
) -> dict[str, Any]:
    """One row of ``pad_to`` tokens: samples back to back, then the padding tail as one segment."""
    n = int(lens.sum())
    if n > pad_to:
        raise InputError(f"{n} tokens do not fit pad_to={pad_to}")
    ids = np.full(pad_to, pad_id, dtype=np.int64)
    ids[:n] = tokens
    seg_lens = np.append(lens, pad_to - n) if pad_to > n else np.asarray(lens, dtype=np.int64)
    cu, pos = _segments(seg_lens)
    labels = ids.copy()
    labels[cu[: len(lens)]] = IGNORE_INDEX  # first token of every sample predicts nothing
    labels[n:] = IGNORE_INDEX
    max_seqlen = int(seg_lens.max()) if len(seg_lens) else 0
    return {
        "input_ids": ids,
        "position_ids": pos,
        "labels": labels,
        "cu_seqlens": cu,
        "max_seqlen": max_seqlen,
    }


def pack_padded(
    tokens: np.ndarray, lens: np.ndarray, pad_to: int, pad_rows: int = 0, pad_id: int = 0
) -> dict[str, Any]:
    """``[B, T]`` right-padded rows, ``B = len(lens) + pad_rows``, ``T = pad_to``."""
    if len(lens) and int(lens.max()) > pad_to:
        raise InputError(f"a sample of {int(lens.max())} tokens does not fit pad_to={pad_to}")
    row_lens = np.concatenate([lens, np.zeros(pad_rows, dtype=np.int64)])
    valid = np.arange(pad_to)[None, :] < row_lens[:, None]
    ids = np.full(valid.shape, pad_id, dtype=np.int64)
    ids[valid] = tokens  # row-major boolean assignment = samples in order
    labels = np.where(valid, ids, IGNORE_INDEX)
    labels[: len(lens), 0] = IGNORE_INDEX
    pos = np.broadcast_to(np.arange(pad_to, dtype=np.int64), valid.shape).copy()
    return {
        "input_ids": ids,
        "position_ids": pos,
        "labels": labels,
        "attention_mask": valid.astype(np.int64),
    }


def block_order(block_index: np.ndarray) -> np.ndarray:
    """Order of the samples in block order (stable: within a block, the manifest order)."""
    return np.argsort(block_index, kind="stable")


def pack_blocks(
    tokens: np.ndarray,
    lens: np.ndarray,
    block_index: np.ndarray,
    pad_to: int,
    pad_rows: int = 0,
    pad_id: int = 0,
) -> dict[str, Any]:
    """``[num_blocks, T]``: samples (already in block order) back to back in their blocks.

    ``lens`` and ``block_index`` are in block order (see :func:`block_order`).
    """
    num_blocks = (int(block_index.max()) + 1 if len(block_index) else 0) + pad_rows
    fill = np.bincount(block_index, weights=lens, minlength=num_blocks).astype(np.int64)
    if len(fill) and int(fill.max()) > pad_to:
        raise InputError(
            f"a block of {int(fill.max())} tokens does not fit the block length {pad_to}"
        )
    valid = np.arange(pad_to)[None, :] < fill[:, None]
    ids = np.full(valid.shape, pad_id, dtype=np.int64)
    ids[valid] = tokens
    # Segments of the flattened view: each block's samples, then its tail (if any).
    tails = pad_to - fill
    key = np.concatenate([2 * block_index.astype(np.int64), 2 * np.arange(num_blocks) + 1])
    seg = np.concatenate([lens, tails])[np.argsort(key, kind="stable")]
    seg = seg[seg > 0]
    cu, pos = _segments(seg)
    block_start = np.zeros(num_blocks + 1, dtype=np.int64)
    np.cumsum(fill, out=block_start[1:])
    before = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=before[1:])
    starts = before[:-1] - block_start[block_index]  # offset of each sample inside its block
    flat_start = block_index.astype(np.int64) * pad_to + starts
    labels = np.where(valid, ids, IGNORE_INDEX)
    labels.reshape(-1)[flat_start] = IGNORE_INDEX
    resets = np.zeros(valid.shape, dtype=bool)
    resets.reshape(-1)[flat_start] = True
    return {
        "input_ids": ids,
        "position_ids": pos.reshape(valid.shape),
        "labels": labels,
        "attention_mask": valid.astype(np.int64),
        "starts": starts.astype(np.int32),
        "resets": resets,
        "cu_seqlens": cu,
        "max_seqlen": int(seg.max()) if len(seg) else 0,
    }


@dataclass
class RawBatch:
    """A collated micro-batch as NumPy arrays: what a DataLoader worker sends back.

    Pickled NumPy crosses the worker pipe several times faster than torch tensors (which go
    through one shared-memory segment each); :meth:`to_batch` then wraps the arrays without a copy.
    """

    layout: str
    fields: dict[str, Any]

    def to_batch(self) -> PackedBatch | PaddedBatch | BlockBatch:
        kw = info_tensors(self.fields)
        if self.layout == "packed":
            for key in ("input_ids", "position_ids", "labels"):
                # One packed row [1, N] with contiguous strides: compiled graphs guard on strides.
                kw[key] = kw[key].view(1, -1)
            return PackedBatch(**kw)
        if self.layout == "padded":
            return PaddedBatch(**kw)
        return BlockBatch(**kw)


def info_tensors(fields: dict[str, Any]) -> dict[str, Any]:
    """Collated fields as a batch takes them: arrays as tensors (no copy), carried string
    columns as lists of ``str``."""
    kw = _tensors(fields)
    kw["carry"] = {
        k: v.tolist() if v.dtype == object else torch.from_numpy(v)
        for k, v in fields.get("carry", {}).items()
    }
    return kw


def row_info(row: RowInfo, ids: np.ndarray, lens: np.ndarray) -> dict[str, Any]:
    """A row's bookkeeping fields (NumPy) for a batch of its samples in their planned order."""
    return _info(row, ids, lens)


def check_lengths(row: RowInfo, ids: np.ndarray, planned: np.ndarray, got: np.ndarray) -> None:
    """Refuse, in one line, a sample whose token count is not the plan's."""
    _check_lengths(row, ids, planned, got)


@dataclass(frozen=True)
class Failed:
    """A user error met while reading a micro-batch, carried out of a DataLoader worker as data,
    so that the trainer raises the error itself (one line) rather than the DataLoader's
    multi-line "Caught InputError in DataLoader worker process" wrapper."""

    kind: type[VarpackError]
    message: str

    def error(self) -> VarpackError:
        return self.kind(self.message)


def _info(
    row: RowInfo, ids: np.ndarray, lens: np.ndarray, order: np.ndarray | None = None
) -> dict[str, Any]:
    carry = row.carry or {}
    return {
        # in the batch's sample order (``order``: block order); copies, like the ids below
        "carry": {k: np.array(v if order is None else v[order]) for k, v in carry.items()},
        "step": row.step,
        "micro": row.micro,
        "lr_factor": row.lr_factor,
        "step_tokens": row.step_tokens,
        "step_samples": row.step_samples,
        "is_last_micro": row.is_last_micro,
        "warmup": row.warmup,
        "epoch": row.epoch,
        # Copies: the manifest's arrays are read-only views of Arrow memory.
        "sample_ids": np.array(ids, dtype=np.int64),
        "seq_lens": np.array(lens, dtype=np.int32),
        "sample_offsets": _offsets(row, order),
    }


def _offsets(row: RowInfo, order: np.ndarray | None) -> np.ndarray | None:
    """Each piece's first token in its document (``--oversize split``), in the batch's order."""
    offs = row.sample_offsets
    if offs is None:
        return None
    return np.array(offs if order is None else offs[order], dtype=np.int64)


def _check_lengths(row: RowInfo, ids: np.ndarray, planned: np.ndarray, got: np.ndarray) -> None:
    bad = planned != got
    if bad.any():
        k = int(np.argmax(bad))
        raise InputError(
            f"{row.where()}: sample id {int(ids[k])} has {int(got[k])} tokens in the dataset, the plan "
            f"says {int(planned[k])}; the plan was made from different data (re-run varpack lengths/plan)"
        )


def _tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def collate_numpy(
    row: RowInfo, fetch: Any, layout: str, pad_id: int = 0, positions: str = "restart"
) -> RawBatch:
    """Fetch the row's samples (``fetch(ids) -> (flat tokens, lens)``; pieces of split documents
    ``fetch(ids, offsets, lens)``) and collate them (NumPy). Every piece is a sequence of its
    own: no label crosses its boundary; ``positions="continue"`` numbers its positions from its
    offset in the document instead of from 0."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    ids, planned = row.sample_ids, row.seq_lens.astype(np.int64)
    order = None
    if layout == "blocks":
        if row.block_index is None:
            raise InputError(
                f"{row.where()}: the plan has no block_index column; plan with --batching blocks"
            )
        order = block_order(row.block_index)
        ids, planned, bidx = ids[order], planned[order], row.block_index[order]
    offs = row.sample_offsets
    tokens, lens = fetch(ids) if offs is None else fetch(ids, offs, planned)
    _check_lengths(row, ids, planned, lens)
    fields = _info(row, ids, lens, order)
    if layout == "packed":
        fields.update(pack_packed(tokens, lens, row.pad_to, pad_id))
    elif layout == "padded":
        fields.update(
            pack_padded(tokens, lens, row.pad_to, row.pad_rows, pad_id), pad_rows=row.pad_rows
        )
    else:
        fields.update(pack_blocks(tokens, lens, bidx, row.pad_to, row.pad_rows, pad_id))
        fields.update(block_index=bidx.astype(np.int32), pad_rows=row.pad_rows)
    if positions == "continue" and offs is not None and layout != "blocks":
        _continue_positions(fields["position_ids"], offs, lens, layout)
    return RawBatch(layout, fields)


def _continue_positions(pos: np.ndarray, offs: np.ndarray, lens: np.ndarray, layout: str) -> None:
    """Shift each piece's positions by its offset in its document (in place)."""
    if layout == "packed":
        pos[: int(lens.sum())] += np.repeat(offs.astype(np.int64), lens)
    else:
        pos[: len(offs)] += offs.astype(np.int64)[:, None]


def collate(
    row: RowInfo, fetch: Any, layout: str, pad_id: int = 0, positions: str = "restart"
) -> PackedBatch | PaddedBatch | BlockBatch:
    """Fetch the row's samples and build its batch dataclass (tensors on the CPU)."""
    return collate_numpy(row, fetch, layout, pad_id, positions).to_batch()
