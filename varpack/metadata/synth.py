"""Synthetic length metadata (and tokenized datasets) with realistic length distributions.

Everything here is pure and vectorised except :func:`write_synth`, the thin writer. The data is a
function of ``(dist, num_samples, seed, bounds)`` only: global row ``i`` always has the same id
and length, whatever the shard count, because lengths are drawn in fixed blocks of
:data:`CHUNK` rows from a generator seeded by ``(seed, block)`` and ids are a keyed bijection of
the row index. That also makes generation streamable: memory is bounded by one block.

Distributions (defaults; ``min_len``/``max_len`` move the bounds):

- ``long-tail``: chat-like. A lognormal body (median ~300 tokens) plus a 2% bounded-Pareto tail
  starting at 10K tokens (tens of thousands), capped at 128K.
- ``bimodal``: long-context SFT mix. 40% short samples below 8K, 60% between 8K and 128K.
- ``video``: frame counts in [3, 94] with mean ~22.3, shaped like Action Genome
  (7,464 videos, 166,785 frames).
- ``uniform``: integers uniform in [64, 8192].

>>> rng = np.random.default_rng(0)
>>> lens = sample_lengths("video", 10_000, rng)
>>> int(lens.min()) >= 3 and int(lens.max()) <= 94
True
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.progress import Progress, TaskID

from varpack.atomic import atomic_dir
from varpack.console import progress
from varpack.errors import ConfigError
from varpack.metadata.contract import ID, LEN, WRITE_OPTIONS, WRITE_SCHEMA, shard_name
from varpack.metadata.shards import ROW_GROUP_ROWS, ShardedWriter
from varpack.metadata.sources import NAME as SOURCE
from varpack.metadata.sources import source_column, source_names
from varpack.metadata.synth_tokens import (
    PATTERNS,
    TOKENIZED_GROUP_ROWS,
    group_cuts,
    token_table,
)

TASK = TaskID(0)  # the one task of varpack.console.progress
DISTS = ("long-tail", "bimodal", "video", "uniform")
#: (min_len, max_len) of each distribution unless overridden.
DEFAULT_BOUNDS = {
    "long-tail": (16, 131_072),
    "bimodal": (64, 131_072),
    "video": (3, 94),
    "uniform": (64, 8_192),
}
#: Rows per independent random block (the unit of determinism, not of I/O).
CHUNK = 1 << 16
DEFAULT_VOCAB = 32_000
_MAX_LEN = int(np.iinfo(np.int32).max)

# long-tail: lognormal body, bounded Pareto tail
BODY_MEDIAN, BODY_SIGMA = 300.0, 1.0
TAIL_FRACTION, TAIL_START, TAIL_ALPHA = 0.02, 10_000, 1.5
# bimodal: short mode below SPLIT, long mode above, each a Beta on the log2 scale (bounded, smooth)
SHORT_FRACTION, SPLIT = 0.40, 8_192
SHORT_BETA, LONG_BETA = (3.0, 3.0), (2.0, 3.0)
# video: lognormal with median 19.2 frames at the default bounds (mean ~22.3), ~0.2% clipped at 94
VIDEO_MEDIAN_AT, VIDEO_SIGMA = 16.2 / 91.0, 0.55


def resolve_bounds(
    dist: str, min_len: int | None = None, max_len: int | None = None
) -> tuple[int, int]:
    """The (min, max) length of ``dist`` after overrides, checked.

    >>> resolve_bounds("video")
    (3, 94)
    >>> resolve_bounds("uniform", max_len=100)
    (64, 100)
    """
    if dist not in DEFAULT_BOUNDS:
        raise ConfigError(f"unknown distribution '{dist}'; choose one of {', '.join(DISTS)}")
    lo, hi = DEFAULT_BOUNDS[dist]
    lo = lo if min_len is None else int(min_len)
    hi = hi if max_len is None else int(max_len)
    if lo < 1:
        raise ConfigError(f"--min-len {lo}: lengths must be >= 1")
    if hi < lo:
        raise ConfigError(f"--max-len {hi} is below --min-len {lo}; give max >= min")
    if hi > _MAX_LEN:
        raise ConfigError(f"--max-len {hi} exceeds {_MAX_LEN} (int32); choose a smaller bound")
    if dist == "bimodal" and not lo < SPLIT < hi:
        raise ConfigError(
            f"bimodal splits at {SPLIT} tokens; it needs --min-len < {SPLIT} < --max-len "
            f"(got {lo}..{hi})"
        )
    return lo, hi


def sample_lengths(
    dist: str,
    n: int,
    rng: np.random.Generator,
    min_len: int | None = None,
    max_len: int | None = None,
) -> np.ndarray:
    """Draw ``n`` lengths (int64) from ``dist`` with ``rng``."""
    lo, hi = resolve_bounds(dist, min_len, max_len)
    if dist == "long-tail":
        return _long_tail(n, rng, lo, hi)
    if dist == "bimodal":
        return _bimodal(n, rng, lo, hi)
    if dist == "video":
        return _video(n, rng, lo, hi)
    return rng.integers(lo, hi + 1, n, dtype=np.int64)


def _long_tail(n: int, rng: np.random.Generator, lo: int, hi: int) -> np.ndarray:
    normal = rng.standard_normal(n, dtype=np.float32)
    body = np.exp(np.float32(math.log(BODY_MEDIAN)) + np.float32(BODY_SIGMA) * normal)
    tail = rng.random(n, dtype=np.float32) < TAIL_FRACTION
    start = min(max(TAIL_START, lo), hi)
    body[tail] = _bounded_pareto(rng.random(int(tail.sum())), start, hi, TAIL_ALPHA)
    return np.clip(np.rint(body), lo, hi).astype(np.int64)


def _video(n: int, rng: np.random.Generator, lo: int, hi: int) -> np.ndarray:
    # Right-skewed around the median, clipped at the bounds: like a real capture limit, a few
    # samples sit exactly at the maximum.
    median = lo + (hi - lo) * VIDEO_MEDIAN_AT
    normal = rng.standard_normal(n, dtype=np.float32)
    frames = np.exp(np.float32(math.log(median)) + np.float32(VIDEO_SIGMA) * normal)
    return np.clip(np.rint(frames), lo, hi).astype(np.int64)


def _bounded_pareto(u: np.ndarray, lo: float, hi: float, alpha: float) -> np.ndarray:
    """Inverse CDF of a Pareto(alpha) truncated to [lo, hi] (no spike at the cap)."""
    shrink = 1.0 - (lo / hi) ** alpha
    return lo * (1.0 - u * shrink) ** (-1.0 / alpha)


def _bimodal(n: int, rng: np.random.Generator, lo: int, hi: int) -> np.ndarray:
    short = rng.random(n) < SHORT_FRACTION
    out = np.empty(n, dtype=np.int64)
    k = int(short.sum())
    out[short] = np.clip(np.floor(_log_beta(rng, k, lo, SPLIT, SHORT_BETA)), lo, SPLIT - 1)
    out[~short] = np.clip(np.ceil(_log_beta(rng, n - k, SPLIT, hi, LONG_BETA)), SPLIT, hi)
    return out


def _log_beta(
    rng: np.random.Generator, n: int, lo: float, hi: float, ab: tuple[float, float]
) -> np.ndarray:
    """Values in [lo, hi] whose log2 is Beta-distributed across [log2 lo, log2 hi]."""
    a, b = math.log2(lo), math.log2(hi)
    return np.exp2(a + (b - a) * rng.beta(ab[0], ab[1], n))


def lengths_range(
    dist: str,
    start: int,
    stop: int,
    seed: int,
    min_len: int | None = None,
    max_len: int | None = None,
) -> np.ndarray:
    """Lengths of global rows ``[start, stop)``; identical however the range is cut.

    >>> whole = lengths_range("long-tail", 0, 200_000, seed=1)
    >>> part = lengths_range("long-tail", 70_000, 150_000, seed=1)
    >>> bool((whole[70_000:150_000] == part).all())
    True
    """
    resolve_bounds(dist, min_len, max_len)
    if stop <= start:
        return np.empty(0, dtype=np.int64)
    blocks = []
    for block in range(start // CHUNK, (stop - 1) // CHUNK + 1):
        rng = np.random.default_rng([seed, 0, block])
        lens = sample_lengths(dist, CHUNK, rng, min_len, max_len)
        lo = max(start - block * CHUNK, 0)
        hi = min(stop - block * CHUNK, CHUNK)
        blocks.append(lens[lo:hi])
    return np.concatenate(blocks)


def sparse_ids(positions: np.ndarray, num_samples: int, seed: int) -> np.ndarray:
    """Unique, shuffled, non-contiguous ids for row positions in ``[0, num_samples)``.

    A keyed bijection of ``[0, 2**bits)`` with ``2**bits >= 4 * num_samples`` (odd multiply,
    add, xor-shift, three rounds; each step is invertible modulo ``2**bits``), so distinct
    positions always get distinct ids, about one id in four of the id space is used, and any
    slice can be computed on its own.

    >>> ids = sparse_ids(np.arange(1000), 1000, seed=3)
    >>> len(np.unique(ids)) == 1000 and int(ids.min()) >= 0
    True
    >>> bool((np.diff(np.sort(ids)) > 1).any())
    True
    """
    bits = max(8, math.ceil(math.log2(max(4 * num_samples, 2))))
    if bits > 62:
        raise ConfigError(f"--num-samples {num_samples} is too large for int64 ids")
    mask = np.uint64((1 << bits) - 1)
    keys = np.random.default_rng([seed, 2]).integers(0, 1 << 62, size=6, dtype=np.uint64)
    x = np.asarray(positions).astype(np.uint64)
    for r in range(3):
        np.multiply(x, keys[2 * r] | np.uint64(1), out=x)
        np.add(x, keys[2 * r + 1], out=x)
        np.bitwise_and(x, mask, out=x)
        np.bitwise_xor(x, x >> np.uint64(bits // 2 + r), out=x)
    return x.astype(np.int64)


def shard_sizes(num_samples: int, shards: int, seed: int) -> np.ndarray:
    """Unequal shard sizes summing to ``num_samples`` (lognormal weights; >= 1 row each if possible).

    >>> sizes = shard_sizes(1000, 4, seed=0)
    >>> int(sizes.sum()), len(sizes), len(set(sizes.tolist())) > 1
    (1000, 4, True)
    """
    if shards < 1:
        raise ConfigError(f"--shards {shards}: need at least one shard")
    weights = np.random.default_rng([seed, 1, 0]).lognormal(0.0, 1.0, shards)
    floor = 1 if num_samples >= shards else 0
    spare = num_samples - floor * shards
    raw = spare * weights / weights.sum()
    sizes = np.floor(raw).astype(np.int64)
    # largest remainder: hand out what flooring lost, deterministically
    order = np.argsort(-(raw - sizes), kind="stable")
    sizes[order[: spare - int(sizes.sum())]] += 1
    return sizes + floor


def iter_blocks(
    dist: str,
    num_samples: int,
    seed: int,
    block_rows: int = 1 << 20,
    min_len: int | None = None,
    max_len: int | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(ids, lens)`` for consecutive global rows of ``[start, stop)`` in blocks."""
    stop = num_samples if stop is None else stop
    for a in range(start, stop, block_rows):
        b = min(a + block_rows, stop)
        ids = sparse_ids(np.arange(a, b, dtype=np.uint64), num_samples, seed)
        yield ids, lengths_range(dist, a, b, seed, min_len, max_len)


@dataclass(frozen=True)
class SynthResult:
    """What :func:`write_synth` wrote."""

    files: list[Path]
    num_samples: int
    tokens: int


def write_synth(
    output: str | os.PathLike[str],
    dist: str,
    num_samples: int,
    shards: int = 1,
    seed: int = 0,
    *,
    tokenized: bool = False,
    vocab_size: int = DEFAULT_VOCAB,
    pattern: str = "random",
    min_len: int | None = None,
    max_len: int | None = None,
    row_group_size: int | None = None,
    overwrite: bool = False,
    quiet: bool = True,
    sources: int = 0,
) -> SynthResult:
    """Write a synthetic dataset into the directory ``output`` (atomically).

    Metadata (``sample_id`` int64, ``seq_len`` int32) by default; with ``tokenized`` a dataset
    with ``sample_id`` and ``input_ids`` whose lengths are exactly the metadata's, their ids
    drawn by ``pattern`` (:mod:`varpack.metadata.synth_tokens`).
    ``sources`` > 0 adds a ``source`` string column (:mod:`varpack.metadata.sources`).
    """
    resolve_bounds(dist, min_len, max_len)
    if sources:
        source_names(sources)  # checks the count
    if num_samples < 1:
        raise ConfigError(f"--num-samples {num_samples}: need at least one sample")
    if seed < 0:
        raise ConfigError(f"--seed {seed}: seeds are >= 0")
    if tokenized and vocab_size < 1:
        raise ConfigError(f"--vocab-size {vocab_size}: need at least one token id")
    if pattern not in PATTERNS or (pattern != "random" and not tokenized):
        raise ConfigError(f"--pattern {pattern}: a token pattern ({', '.join(PATTERNS)}) of "
                          "--tokenized data; add --tokenized, or drop --pattern")  # fmt: skip
    sizes = shard_sizes(num_samples, shards, seed)
    with (
        atomic_dir(output, overwrite, marker="synth") as tmp,
        progress("synth", num_samples, quiet) as bar,
    ):
        if tokenized:
            files, tokens = _write_tokenized(
                tmp,
                sizes,
                dist,
                num_samples,
                seed,
                (vocab_size, pattern),
                min_len,
                max_len,
                row_group_size,
                bar,
                sources,
            )
        else:
            files, tokens = _write_metadata(
                tmp, sizes, dist, num_samples, seed, min_len, max_len, row_group_size, bar, sources
            )
    return SynthResult([Path(output) / f.name for f in files], num_samples, tokens)


def _write_metadata(
    tmp: Path,
    sizes: np.ndarray,
    dist: str,
    num_samples: int,
    seed: int,
    min_len: int | None,
    max_len: int | None,
    row_group_size: int | None,
    bar: Progress,
    sources: int = 0,
) -> tuple[list[Path], int]:
    group = row_group_size or ROW_GROUP_ROWS
    tokens = 0
    schema, options = WRITE_SCHEMA, dict(WRITE_OPTIONS)
    if sources:
        schema = schema.append(pa.field(SOURCE, pa.string()))
        options["use_dictionary"] = [LEN, SOURCE]
    with ShardedWriter(tmp, sizes.tolist(), schema, group, options) as writer:
        for ids, lens in iter_blocks(dist, num_samples, seed, max(group, CHUNK), min_len, max_len):
            cols = {ID: ids, LEN: lens.astype(np.int32)}
            if sources:
                cols[SOURCE] = source_column(ids, sources)
            writer.write(pa.table(cols))
            tokens += int(lens.sum())
            bar.advance(TASK, len(ids))
    return writer.files, tokens


def _write_tokenized(
    tmp: Path,
    sizes: np.ndarray,
    dist: str,
    num_samples: int,
    seed: int,
    tokens_of: tuple[int, str],
    min_len: int | None,
    max_len: int | None,
    row_group_size: int | None,
    bar: Progress,
    sources: int = 0,
) -> tuple[list[Path], int]:
    rows = row_group_size or TOKENIZED_GROUP_ROWS
    rng = np.random.default_rng([seed, 1, 1])
    schema = pa.schema([("sample_id", pa.int64()), ("input_ids", pa.list_(pa.int32()))])
    if sources:
        schema = schema.append(pa.field(SOURCE, pa.string()))
    files, tokens, start = [], 0, 0
    for k, size in enumerate(int(s) for s in sizes if s > 0):
        path = tmp / shard_name(k)
        with pq.ParquetWriter(path, schema, compression="zstd") as writer:
            for ids, lens in iter_blocks(
                dist, num_samples, seed, 1 << 18, min_len, max_len, start, start + size
            ):
                cuts = group_cuts(lens, rows)
                for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                    table = token_table(ids[a:b], lens[a:b], rng, *tokens_of)
                    if sources:
                        table = table.append_column(SOURCE, source_column(ids[a:b], sources))
                    writer.write_table(table.cast(schema), row_group_size=b - a)
                tokens += int(lens.sum())
                bar.advance(TASK, len(ids))
        files.append(path)
        start += size
    return files, tokens


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
