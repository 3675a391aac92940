"""Benchmark ``varpack check``'s reading, duplicate check and statistics against polars (one process).

    python tests/benchmarks/bench_stats.py [--quick] [--rows 20M] [--shards 64] [--repeat 5]

Data: ``varpack synth`` long-tail metadata (sparse shuffled ids, unequal shards) in a temporary
directory, removed afterwards. Every candidate below is first checked to give exactly varpack's
:class:`~varpack.metadata.summary.Summary` (count, tokens, min, mean, max, percentiles with
``inverted_cdf``, the log2 histogram) and to find no duplicate id; then each is timed ``--repeat``
times, alternating, and the medians are printed with the ratio ``varpack / candidate`` (> 1: the
candidate is faster).

Whole ``check`` (read and validate every shard, find duplicate ids, summarise):

- varpack: what ``varpack check`` runs, :func:`read_metadata` (pyarrow, per row group) and
  :func:`summarize` (NumPy);
- polars query: one lazy plan over the file list (``scan_parquet`` with projection of
  ``sample_id``/``seq_len``): the contract's range checks, ``n_unique`` for duplicates, count, sum,
  min/max/mean, the log2 histogram as a ``group_by`` and the percentiles as a sorted ``gather``;
- polars reader: ``scan_parquet`` replaces only the reader; the duplicate check (``np.sort``) and
  the statistics stay NumPy.

Parts: reading with the range checks (varpack's per row group pyarrow reader vs ``scan_parquet``);
then on arrays in memory, the statistics (NumPy ``summarize`` vs the polars expressions), the
duplicate check (``np.sort`` + neighbour compare vs ``n_unique``) and group-wise figures, samples
and tokens per (step, rank) (``np.bincount`` as ``varpack validate`` sums them vs ``group_by``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from varpack.metadata.contract import (
    ID,
    LEN,
    MAX_LEN,
    first_duplicate,
    list_pieces,
    read_metadata,
    read_piece,
    resolve_files,
)
from varpack.metadata.summary import PERCENTILES, Bin, Summary, summarize
from varpack.metadata.synth import write_synth

SIZES = {"full": (20_000_000, 64), "quick": (1_000_000, 16)}
#: timed rounds per comparison (``--repeat``)
REPEAT = [5]


# ---------------------------------------------------------------- varpack (production) -----------


def varpack_check(files: list[Path]) -> Summary:
    """What ``varpack check`` computes: pyarrow reading with the contract, NumPy statistics."""
    table = read_metadata([str(f) for f in files])
    return summarize(table.column(LEN).to_numpy(), len(files))


# ---------------------------------------------------------------- polars candidates --------------


def percentile_rows(n: int) -> list[int]:
    """Sorted positions NumPy's ``percentile(..., method="inverted_cdf")`` reports, for ``n`` rows."""
    index = n * (np.asarray(PERCENTILES) / 100) - 1
    below = np.floor(index)
    rows = np.where(index - below == 0, below, below + 1).astype(np.int64)
    return [max(int(r), 0) for r in rows]


def _length() -> pl.Expr:
    return pl.col(LEN).cast(pl.Int64)


def _log2_bin() -> pl.Expr:
    """floor(log2 seq_len) for seq_len > 0, exact on integers."""
    return (63 - _length().bitwise_leading_zeros().cast(pl.Int64)).alias("bin")


def _figures(frame: pl.LazyFrame, n: int) -> list[pl.LazyFrame]:
    """Scalar figures, the log2 histogram and the percentile rows, as three lazy queries."""
    length = _length()
    scalars = frame.select(
        pl.len().alias("count"),
        length.sum().alias("tokens"),
        length.min().alias("min"),
        length.max().alias("max"),
        length.mean().alias("mean"),
    )
    hist = frame.group_by(_log2_bin()).agg(pl.len().alias("count"), length.sum().alias("tokens"))
    pct = frame.select(length.sort().gather(percentile_rows(n)).alias("value"))
    return [scalars, hist.sort("bin"), pct]


def _contract(frame: pl.LazyFrame) -> pl.LazyFrame:
    """The contract's figures the lengths' do not cover: nulls, smallest id, distinct ids."""
    return frame.select(
        pl.col(ID).min().alias("id_min"),
        (pl.col(ID).null_count() + pl.col(LEN).null_count()).alias("nulls"),
        pl.col(ID).n_unique().alias("distinct"),
    )


def _summary(
    files: int, scalars: dict[str, int | float], hist: pl.DataFrame, pct: pl.DataFrame
) -> Summary:
    cells = zip(hist["count"], hist["tokens"], strict=True)
    bins = dict(zip(hist["bin"].to_list(), cells, strict=True))
    first, last = min(bins), max(bins)
    return Summary(
        files=files,
        count=int(scalars["count"]),
        tokens=int(scalars["tokens"]),
        min=int(scalars["min"]),
        mean=float(scalars["mean"]),
        max=int(scalars["max"]),
        percentiles={f"p{q:g}": int(v) for q, v in zip(PERCENTILES, pct["value"], strict=True)},
        histogram=[
            Bin(1 << k, 1 << (k + 1), *(int(x) for x in bins.get(k, (0, 0))))
            for k in range(first, last + 1)
        ],
    )


def polars_query(files: list[Path]) -> Summary:
    """The whole check as one lazy polars plan over the shards (row counts from the footers)."""
    n = sum(p.num_rows for p in list_pieces(files))
    frame = pl.scan_parquet([str(f) for f in files]).select(ID, LEN)
    scalars_df, hist, pct, contract_df = pl.collect_all([*_figures(frame, n), _contract(frame)])
    scalars, contract = scalars_df.row(0, named=True), contract_df.row(0, named=True)
    if contract["nulls"] or contract["id_min"] < 0 or scalars["min"] <= 0:
        raise ValueError("contract violation")
    if scalars["max"] > MAX_LEN or contract["distinct"] != scalars["count"]:
        raise ValueError("contract violation")
    return _summary(len(files), scalars, hist, pct)


def polars_reader(files: list[Path]) -> Summary:
    """polars reads the shards; the range checks, duplicates and statistics are NumPy's."""
    list_pieces(files)  # schema check from the footers, as varpack does
    frame = pl.scan_parquet([str(f) for f in files]).select(ID, LEN).collect()
    if frame.null_count().sum_horizontal().item():
        raise ValueError("contract violation")
    ids = frame[ID].to_numpy()
    lens = frame[LEN].to_numpy().astype(np.int64)
    if ids.min() < 0 or lens.min() <= 0 or lens.max() > MAX_LEN:
        raise ValueError("contract violation")
    if first_duplicate(np.sort(ids)) is not None:
        raise ValueError("contract violation")
    return summarize(lens, len(files))


def varpack_read(files: list[Path]) -> int:
    """varpack's reader alone: every row group read and validated (pyarrow), then concatenated."""
    pieces = list_pieces(files)
    return pa.concat_tables([read_piece(p) for p in pieces if p.num_rows]).num_rows


def polars_read(files: list[Path]) -> int:
    """polars' reader alone: the two columns of every shard, with the contract's range checks."""
    frame = pl.scan_parquet([str(f) for f in files]).select(ID, LEN).collect()
    bad = frame.select((pl.col(ID) < 0).any() | (pl.col(LEN) <= 0).any()).item()
    if bad or frame.null_count().sum_horizontal().item():
        raise ValueError("contract violation")
    return frame.height


def polars_stats(lens: np.ndarray, files: int) -> Summary:
    """The statistics alone, as polars expressions over an in-memory length array."""
    frame = pl.DataFrame({LEN: lens}).lazy()
    scalars_df, hist, pct = pl.collect_all(_figures(frame, len(lens)))
    return _summary(files, scalars_df.row(0, named=True), hist, pct)


def numpy_step_rank(step: np.ndarray, rank: np.ndarray, lens: np.ndarray, dp: int) -> np.ndarray:
    """Samples and tokens per (step, rank), as ``varpack validate`` sums them (``bincount``)."""
    cell = step * dp + rank
    samples = np.bincount(cell)
    tokens = np.bincount(cell, weights=lens).astype(np.int64)
    return np.stack([samples, tokens])


def polars_step_rank(step: np.ndarray, rank: np.ndarray, lens: np.ndarray, dp: int) -> np.ndarray:
    """The same sums as a polars ``group_by`` over (step, rank)."""
    frame = pl.DataFrame({"step": step, "rank": rank, LEN: lens})
    out = (
        frame.group_by("step", "rank")
        .agg(pl.len().alias("samples"), pl.col(LEN).sum().alias("tokens"))
        .sort("step", "rank")
    )
    return np.stack([out["samples"].to_numpy(), out["tokens"].to_numpy()]).astype(np.int64)


# ---------------------------------------------------------------- timing -------------------------


def median_times(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median wall seconds per case; the cases run in turn, ``repeat`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(title: str, medians: dict[str, float], rows: int) -> None:
    base_name = next(iter(medians))
    base = medians[base_name]
    print(f"\n{title} (speed-up: {base_name} s / this row's s)")
    print(f"  {'method':<24} {'median s':>9} {'M rows/s':>9} {'speed-up':>9}")
    for name, sec in medians.items():
        print(f"  {name:<24} {sec:>9.3f} {rows / sec / 1e6:>9.1f} {base / sec:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 M rows in 16 shards")
    parser.add_argument("--rows", type=float, default=None, help="rows (default 20 M)")
    parser.add_argument("--shards", type=int, default=None, help="files (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch space (default /tmp)")
    opts = parser.parse_args()
    rows, shards = SIZES["quick" if opts.quick else "full"]
    rows, shards = int(opts.rows or rows), opts.shards or shards
    work = Path(tempfile.mkdtemp(prefix="varpack-bench-stats-", dir=opts.workdir))
    try:
        write_synth(work / "meta", "long-tail", rows, shards, seed=0)
        REPEAT[0] = opts.repeat
        run(resolve_files(work / "meta"), rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(
    title: str, cases: dict[str, Callable[[], object]], same: Callable[[object], bool], n: int
) -> None:
    """Check every case's result with ``same``, then time the cases and print the table."""
    for name, fn in cases.items():
        assert same(fn()), f"{title}: {name} differs from the first case"
    report(title, median_times(cases, REPEAT[0]), n)


def run(files: list[Path], rows: int) -> None:
    """Every comparison on the shards ``files`` of ``rows`` rows."""
    print(
        f"varpack check statistics vs polars {pl.__version__}: {rows:,} rows in {len(files)} "
        f"shards, {os.cpu_count()} cores, polars threads {pl.thread_pool_size()}, "
        f"median of {REPEAT[0]}"
    )
    want = varpack_check(files)
    whole = {
        "varpack (pyarrow+NumPy)": lambda: varpack_check(files),
        "polars query": lambda: polars_query(files),
        "polars reader": lambda: polars_reader(files),
    }
    compare("whole check (read, validate, duplicates, statistics)", whole, want.__eq__, rows)
    readers = {
        "varpack (pyarrow)": lambda: varpack_read(files),
        "polars": lambda: polars_read(files),
    }
    compare("reading and range checks only", readers, rows.__eq__, rows)
    table = read_metadata([str(f) for f in files])
    run_in_memory(table.column(ID).to_numpy(), table.column(LEN).to_numpy(), want)


def run_in_memory(ids: np.ndarray, lens: np.ndarray, want: Summary) -> None:
    """The statistics, the duplicate check and the group-wise sums on arrays in memory."""
    stats = {
        "NumPy summarize": lambda: summarize(lens, want.files),
        "polars expressions": lambda: polars_stats(lens, want.files),
    }
    compare("statistics of the lengths in memory", stats, want.__eq__, len(lens))
    dups = {
        "np.sort + neighbours": lambda: first_duplicate(np.sort(ids)),
        "polars n_unique": lambda: pl.Series(ids).n_unique() != len(ids) or None,
    }
    compare("duplicate ids in memory", dups, lambda r: r is None, len(ids))
    # every sample on one of 8 ranks in one of len / 4096 steps (no (step, rank) cell empty)
    dp = 8
    step = np.sort(np.random.default_rng(0).integers(0, max(len(lens) // 4096, 1), len(lens)))
    rank = np.random.default_rng(1).integers(0, dp, len(lens))
    cells = numpy_step_rank(step, rank, lens, dp)
    groups = {
        "NumPy bincount": lambda: numpy_step_rank(step, rank, lens, dp),
        "polars group_by": lambda: polars_step_rank(step, rank, lens, dp),
    }
    compare(
        "samples and tokens per (step, rank)", groups, lambda r: np.array_equal(r, cells), len(lens)
    )


if __name__ == "__main__":
    main()
