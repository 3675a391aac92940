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
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from varpack.errors import ConfigError

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


def block_batches(
    lens_in_order: np.ndarray, block_in_order: np.ndarray, blocks_per_batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group blocks into micro-batches of ``blocks_per_batch`` and index samples within them.

    ``lens_in_order``, ``block_in_order``: lengths and block ids of the packed samples in plan
    order (``lens[order]``, ``block_of_sample[order]``; block ids non-decreasing from 0).
    Returns ``(offsets, block_index, start, pad_rows)``: micro-batch boundaries into the ordered
    samples (``n_mb + 1``); each sample's block within its micro-batch (``int32``, the manifest's
    ``block_index``); its start offset inside its block (the reset table); the empty blocks that
    complete each micro-batch (``int32``, only the last can be short).

    >>> off, bi, st, pr = block_batches(np.array([6, 4, 3, 2, 5]), np.array([0, 0, 1, 1, 2]), 2)
    >>> off.tolist(), bi.tolist(), st.tolist(), pr.tolist()
    ([0, 4, 5], [0, 0, 1, 1, 0], [0, 6, 0, 3, 0], [0, 1])
    """
    if blocks_per_batch < 1:
        raise ConfigError(f"--blocks-per-batch must be >= 1, got {blocks_per_batch}")
    lens = np.asarray(lens_in_order, np.int64)
    blk = np.asarray(block_in_order, np.int64)
    n_blocks = int(blk[-1]) + 1 if blk.size else 0
    n_mb = -(-n_blocks // blocks_per_batch)
    first_blocks = np.arange(n_mb + 1, dtype=np.int64) * blocks_per_batch
    offsets = np.searchsorted(blk, first_blocks, side="left").astype(np.int64)
    block_index = (blk % blocks_per_batch).astype(np.int32)
    pad_rows = np.zeros(n_mb, np.int32)
    if n_mb:
        pad_rows[-1] = n_mb * blocks_per_batch - n_blocks
    return offsets, block_index, _starts(lens, blk), pad_rows


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


def default_block_len(lens: np.ndarray, pad_multiple: int = 1) -> int:
    """BLoad's choice: the longest sample (rounded up to ``pad_multiple``), so nothing is oversize.

    >>> default_block_len(np.array([3, 94, 20]))
    94
    """
    top = int(np.asarray(lens).max())
    return -(-top // pad_multiple) * pad_multiple


def default_blocks_per_batch(block_len: int, max_tokens: int | None) -> int:
    """Blocks per micro-batch from the token budget: ``max_tokens // block_len`` (at least 1).

    >>> default_blocks_per_batch(94, 1024), default_blocks_per_batch(94, None)
    (10, 1)
    """
    if max_tokens is None:
        return 1
    if max_tokens < block_len:
        raise ConfigError(
            f"--block-len {block_len} exceeds --max-tokens {max_tokens}; a micro-batch must hold "
            "at least one block"
        )
    return max_tokens // block_len


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


def action_genome_lengths(seed: int = 0) -> np.ndarray:
    """Reference video data shaped like Action Genome's training set (the BLoad paper's figures).

    7,464 frame counts in [3, 94] summing to exactly 166,785 (mean 22.3), drawn from a clipped
    lognormal and nudged by +-1 frame to hit the total; both bounds occur. Deterministic in
    ``seed``. For tests and benchmarks.

    >>> a = action_genome_lengths()
    >>> a.size, int(a.sum()), int(a.min()), int(a.max())
    (7464, 166785, 3, 94)
    """
    n, total, lo, hi = 7464, 166_785, 3, 94
    rng = np.random.default_rng(seed)
    a = np.clip(np.rint(np.exp(np.log(19.2) + 0.55 * rng.standard_normal(n))), lo, hi).astype(
        np.int64
    )
    a[0], a[1] = lo, hi
    while (diff := total - int(a.sum())) != 0:
        sign = 1 if diff > 0 else -1
        movable = np.flatnonzero((a < hi) if sign > 0 else (a > lo))
        movable = movable[movable > 1]
        pick = rng.choice(movable, size=min(abs(diff), movable.size), replace=False)
        a[pick] += sign
    return a
