"""Fixed-length blocks of whole samples (BLoad): ``--batching blocks --block-len T``.

Video and recurrent models want every row to be exactly ``T`` frames long, made of whole samples
(never cut, so temporal context survives) plus a little tail padding, and a *reset table*: where
each sample starts inside its block, so state carried between frames can be reset there.

BLoad (Iftekhar et al.) fills blocks of ``T_max`` (the longest sample) by random draws; on Action
Genome that pads 3,695 frames of 166,785 (2.2 %). Here each window of the sample stream is packed
by *best fit decreasing* (each sample, longest first, goes into the open block it fills most
tightly), which is near optimal and keeps samples close to their stream position (the window
bounds how far a sample moves, which matters for a shuffled order). Best fit is sequential, so it
runs in a numba kernel with a segment tree over remaining capacities: O(n log T).

A micro-batch holds ``blocks_per_batch`` blocks (the last one of the plan is completed with empty
blocks, counted as ``pad_rows``). The manifest keeps ``pad_to = T`` and a ``block_index`` list
parallel to ``sample_ids``: which block of the micro-batch each sample sits in, in order; the
reader rebuilds the reset table with :func:`reset_table`.

As a batching strategy (:func:`build`), per epoch: the order stage gives a plain permutation (or
the sorted order), the blocks are packed, a shuffled order renumbers each window's blocks at
random (best fit sorts them), and blocks are grouped into micro-batches, a multiple of
``dp x grad_accum`` of them (completed by splitting the fullest micro-batches, or blocks).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from varpack.errors import ConfigError
from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.pack import complete
from varpack.plan.segments import segment_sums
from varpack.plan.stages.batching.common import EpochJoiner, epoch_order, order_rule

#: Default window of the stream packed together, in samples.
DEFAULT_WINDOW = 8192


class BlockPacking(NamedTuple):
    """Result of :func:`pack_blocks` (indices are positions in the input stream)."""

    #: Block of each input sample (-1 for oversize samples), blocks numbered in plan order.
    block_of_sample: np.ndarray
    #: Packed samples in plan order: block by block, within a block by stream position.
    order: np.ndarray
    #: Real length (frames/tokens) in each block; the block's padding is ``block_len - fill``.
    block_fill: np.ndarray
    #: Samples longer than ``block_len`` (left out; the planner applies ``--oversize``).
    oversize: np.ndarray


@numba.njit(cache=True)
def _tree_add(tree: np.ndarray, size: int, c: int, d: int) -> None:
    i = c + size
    while i >= 1:
        tree[i] += d
        i //= 2


@numba.njit(cache=True)
def _tree_first_at_least(tree: np.ndarray, size: int, x: int) -> int:
    """Smallest capacity >= x with an open block, or -1."""
    i = x + size
    if tree[i] > 0:
        return x
    while i > 1:
        if i % 2 == 0 and tree[i + 1] > 0:
            i += 1
            while i < size:
                i = 2 * i if tree[2 * i] > 0 else 2 * i + 1
            return i - size
        i //= 2
    return -1


@numba.njit(cache=True)
def _best_fit_windows(lens: np.ndarray, block_len: int, window: int) -> np.ndarray:
    n = lens.size
    size = 1
    while size < block_len + 1:
        size *= 2
    tree = np.zeros(2 * size, np.int64)
    head = np.full(block_len + 1, -1, np.int64)  # stack of open blocks per remaining capacity
    nxt = np.full(n + 1, -1, np.int64)
    rem = np.zeros(n + 1, np.int64)
    block = np.full(n, -1, np.int64)
    nb = 0
    for w0 in range(0, n, window):
        w1 = min(n, w0 + window)
        first_block = nb
        order = np.argsort(-lens[w0:w1], kind="mergesort") + w0  # longest first, stable
        for i in order:
            x = lens[i]
            if x > block_len:
                continue
            c = _tree_first_at_least(tree, size, x)
            if c < 0:
                b = nb
                nb += 1
                c_new = block_len - x
            else:
                b = head[c]
                head[c] = nxt[b]
                _tree_add(tree, size, c, -1)
                c_new = c - x
            block[i] = b
            rem[b] = c_new
            if c_new > 0:
                nxt[b] = head[c_new]
                head[c_new] = b
                _tree_add(tree, size, c_new, 1)
        # Close the window's blocks: samples never move further than one window.
        for b in range(first_block, nb):
            if rem[b] > 0:
                _tree_add(tree, size, rem[b], -1)
                head[rem[b]] = -1
    return block


def pack_blocks(lens: np.ndarray, block_len: int, window: int = DEFAULT_WINDOW) -> BlockPacking:
    """Pack whole samples into blocks of ``block_len`` by best fit decreasing within windows.

    ``lens``: sample lengths (frames or tokens) in stream order (sorted or shuffled); ``window``:
    samples packed together (consecutive stream positions), blocks closed at the window's end.
    Deterministic. See :class:`BlockPacking` for the result.

    >>> p = pack_blocks(np.array([6, 3, 4, 2, 5, 12]), 10)
    >>> p.block_of_sample.tolist(), p.order.tolist(), p.block_fill.tolist(), p.oversize.tolist()
    ([0, 1, 0, 1, 1, -1], [0, 2, 1, 3, 4], [10, 10], [5])
    """
    if block_len < 1:
        raise ConfigError(f"--block-len must be >= 1, got {block_len}")
    if window < 1:
        raise ConfigError(f"the block window must be >= 1 sample, got {window}")
    a = np.asarray(lens, np.int64)
    block = _best_fit_windows(a, int(block_len), int(window))
    packed = np.flatnonzero(block >= 0)
    order = packed[np.lexsort((packed, block[packed]))]
    n_blocks = int(block.max()) + 1 if packed.size else 0
    fill = np.bincount(block[packed], weights=a[packed], minlength=n_blocks).astype(np.int64)
    return BlockPacking(block, order, fill, np.flatnonzero(a > block_len))


def _starts(lens: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Offset of each sample inside its block (blocks are contiguous runs)."""
    before = np.cumsum(lens) - lens
    if lens.size == 0:
        return before
    first = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
    run = np.cumsum(np.r_[True, block[1:] != block[:-1]]) - 1
    return before - before[first][run]


def reset_table(seq_lens: np.ndarray, block_index: np.ndarray) -> np.ndarray:
    """Start offset of every sample inside its block, from one manifest row (reader side).

    ``seq_lens`` and ``block_index``: the row's lists. A recurrent model resets its carried state
    at these offsets.

    >>> reset_table(np.array([6, 4, 3, 2, 5]), np.array([0, 0, 1, 1, 2])).tolist()
    [0, 6, 0, 3, 0]
    """
    return _starts(np.asarray(seq_lens, np.int64), np.asarray(block_index, np.int64))


def check_blocks(
    offsets: np.ndarray,
    seq_lens: np.ndarray,
    block_index: np.ndarray,
    pad_to: np.ndarray,
    block_len: int,
    blocks_per_batch: int,
    rank: int | None = None,
) -> list[str]:
    """Violations of the block rules on one rank (flat lists in execution order; empty if fine).

    Every micro-batch has ``pad_to == block_len``; its ``block_index`` is non-decreasing from 0
    without gaps and below ``blocks_per_batch``; no block holds more than ``block_len``.

    >>> off = np.array([0, 3, 4])
    >>> check_blocks(off, np.array([6, 4, 9, 5]), np.array([0, 0, 1, 0]), np.array([10, 10]), 10, 2)
    []
    >>> check_blocks(off, np.array([6, 5, 9, 5]), np.array([0, 0, 2, 0]), np.array([10, 9]), 10, 2)
    ['micro-batch 1: pad_to 9, not the block length 10', 'micro-batch 0: block_index not 0, 1, 2, ... in order or over --blocks-per-batch 2', 'micro-batch 0: block 0 holds 11, over the block length 10']
    """
    where = "" if rank is None else f"rank {rank} "
    off = np.asarray(offsets, np.int64)
    lens = np.asarray(seq_lens, np.int64)
    bi = np.asarray(block_index, np.int64)
    t = np.asarray(pad_to, np.int64)
    out: list[str] = []
    for i in np.flatnonzero(t != block_len)[:10]:
        out.append(f"{where}micro-batch {i}: pad_to {t[i]}, not the block length {block_len}")
    if bi.size != lens.size:
        return [*out, f"{where}block_index has {bi.size} entries for {lens.size} samples"]
    if lens.size == 0:
        return out
    mb = np.repeat(np.arange(off.size - 1), np.diff(off))
    head = np.zeros(lens.size, bool)
    head[off[:-1][np.diff(off) > 0]] = True
    step = np.diff(bi, prepend=0)
    ok = np.where(head, bi == 0, (step == 0) | (step == 1)) & (bi < blocks_per_batch)
    for i in np.unique(mb[~ok])[:10]:
        out.append(
            f"{where}micro-batch {i}: block_index not 0, 1, 2, ... in order or over "
            f"--blocks-per-batch {blocks_per_batch}"
        )
    key = mb * blocks_per_batch + np.minimum(bi, blocks_per_batch - 1)
    run = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    fill = np.add.reduceat(lens, run)
    for j in np.flatnonzero(fill > block_len)[:10]:
        out.append(
            f"{where}micro-batch {mb[run[j]]}: block {bi[run[j]]} holds {fill[j]}, over the "
            f"block length {block_len}"
        )
    return out


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # always None: --oversize split is refused here
) -> Batches:
    """``--batching blocks``: best-fit blocks of whole samples, ``blocks_per_batch`` per row."""
    t, per = cfg.block_len, cfg.blocks_per_batch
    assert t is not None and per is not None
    per_step = cfg.micro_per_step
    orule = order_rule(cfg)
    joined, bidx, prows = EpochJoiner(), [], []
    for epoch in range(cfg.epochs):
        idx, _ = epoch_order(lens, cfg, epoch, "none", orule)
        packing = pack_blocks(lens[idx], t, cfg.block_window)
        blk = packing.block_of_sample[packing.order]
        fill = packing.block_fill
        if cfg.order == "shuffle":  # a window's blocks in random order (best fit sorts them)
            blk, fill, moved = _shuffle_blocks(blk, fill, packing.order, cfg, epoch)
            idx = idx[packing.order[moved]]
        else:
            idx = idx[packing.order]
        soff, b_index, b_rows = _block_micro_batches(
            lens[idx], blk, fill, per, per_step, f"epoch {epoch}"
        )
        joined.add(epoch, idx, soff, per_step)
        bidx.append(b_index)
        prows.append(b_rows)
    stream, offsets, step = joined.join()
    return Batches(
        stream, offsets, step, joined.epochs, None, np.concatenate(prows), np.concatenate(bidx), 0
    )


def _shuffle_blocks(
    blk: np.ndarray, fill: np.ndarray, pos: np.ndarray, cfg: PlanConfig, epoch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renumber blocks in a random order within each window of the stream (seeded per epoch).

    ``blk``: block of each packed sample in block order, ``pos`` its stream position. Returns the
    new block ids (non-decreasing after re-ordering), block fills, and the re-ordering of samples.
    """
    nb = len(fill)
    first = np.flatnonzero(np.r_[True, blk[1:] != blk[:-1]])
    window = pos[first] // cfg.block_window
    key = np.random.default_rng([cfg.seed, epoch, 1]).random(nb)
    new_order = np.lexsort((key, window))
    new_id = np.empty(nb, np.int64)
    new_id[new_order] = np.arange(nb)
    moved = np.lexsort((np.arange(len(blk)), new_id[blk]))
    return new_id[blk][moved], fill[new_order], moved


def _block_micro_batches(
    lens: np.ndarray, blk: np.ndarray, fill: np.ndarray, per: int, per_step: int, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (samples in block order) to micro-batches of ``per`` blocks, a multiple of
    ``per_step`` of them: ``(sample offsets, block_index, pad_rows)``.

    The count is completed by splitting the fullest micro-batches at a block boundary (two
    micro-batches with fewer blocks, the rest empty blocks: ``pad_rows``). If that is not enough
    (one block per micro-batch), blocks themselves are split at a token midpoint, one block each.
    """
    nb = len(fill)
    boff = np.append(np.arange(0, nb, per, dtype=np.int64), nb)
    sums = lambda o, v: segment_sums(o, v).astype(np.float64)  # noqa: E731
    try:
        boff = complete(boff, fill, per_step, sums, where)
    except ConfigError:
        # One block per micro-batch, and split blocks (two lighter blocks, both within T).
        starts = np.searchsorted(blk, np.arange(nb + 1), side="left")
        soff = complete(starts, lens, per_step, sums, where)
        return soff, np.zeros(len(lens), np.int32), np.full(len(soff) - 1, per - 1, np.int32)
    soff = np.searchsorted(blk, boff, side="left")
    first_block = np.repeat(boff[:-1], np.diff(soff))
    return soff, (blk - first_block).astype(np.int32), (per - np.diff(boff)).astype(np.int32)
