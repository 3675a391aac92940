"""Benchmark of ``--where`` (SQL selection over metadata): polars SQL against a pyarrow filter.

Writes metadata of ``--rows`` rows in ``--shards`` shards (``sample_id``, ``seq_len``, a float
``score``, a string ``lang``, an int ``quality``) to a temporary directory, then times, in this
process, each candidate giving the sorted ids a condition keeps, for a few conditions:

- *polars SQL* (what varpack runs, :func:`varpack.metadata.where.where_ids`): ``scan_parquet``
  of the shards and one ``SQLContext`` query, projection and predicate pushed into the scan;
- *pyarrow dataset*: the same condition written by hand as a ``pyarrow.compute`` expression,
  ``dataset.to_table(columns=["sample_id"], filter=...)``, then ``np.sort``.

Both must return the same ids (checked). Prints the median of ``--repeat`` runs, rows read and
kept, and polars' speed-up (pyarrow's seconds / polars'). Rows read: every row of the
condition's columns (uniform random values give the row groups' statistics nothing to skip).

    PYTHONPATH=$PWD python tests/benchmarks/bench_where.py [--rows 30M] [--shards 64] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

CONDITIONS = [
    ("score > 0.5 AND lang = 'en'", (pc.field("score") > 0.5) & (pc.field("lang") == "en")),
    ("quality >= 3", pc.field("quality") >= 3),
    ("seq_len > 4096 OR score > 0.99", (pc.field("seq_len") > 4096) | (pc.field("score") > 0.99)),
]


def write(root: Path, rows: int, shards: int) -> list[str]:
    rng = np.random.default_rng(0)
    sizes = np.diff(np.linspace(0, rows, shards + 1).astype(np.int64))
    files, start = [], 0
    for k, n in enumerate(sizes):
        t = pa.table({
            "sample_id": np.arange(start, start + n, dtype=np.int64),
            "seq_len": rng.lognormal(6, 1.2, n).astype(np.int64) + 1,
            "score": rng.random(n),
            "lang": pa.array(rng.choice(["en", "de", "fr", "zh"], n)).dictionary_encode(),
            "quality": rng.integers(0, 5, n).astype(np.int32),
        })  # fmt: skip
        f = root / f"shard-{k:03d}.parquet"
        pq.write_table(t, f)
        files.append(str(f))
        start += n
    return files


def _time(fn, repeat: int) -> tuple[float, np.ndarray]:  # type: ignore[no-untyped-def]
    times, got = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
    assert got is not None
    return statistics.median(times), got


def main() -> None:
    from benchkit import count

    from varpack.metadata.where import where_ids

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="30M")
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 M rows in 16 shards")
    a = ap.parse_args()
    rows, shards = (1_000_000, 16) if a.quick else (count(a.rows), a.shards)
    with tempfile.TemporaryDirectory() as tmp:
        files = write(Path(tmp), rows, shards)
        dataset = ds.dataset(files, format="parquet")
        print(f"{rows:,} rows in {shards} shards")
        print(
            f"{'condition':<34} {'rows read':>12} {'kept':>12} {'polars SQL':>11} {'pyarrow':>9} {'speed-up':>9}"
        )
        for sql, expr in CONDITIONS:
            t_pl, got = _time(lambda sql=sql: where_ids(files, sql), a.repeat)

            def by_hand(expr=expr):  # type: ignore[no-untyped-def]
                t = dataset.to_table(columns=["sample_id"], filter=expr)
                return np.sort(t.column("sample_id").to_numpy())

            t_pa, want = _time(by_hand, a.repeat)
            assert np.array_equal(got, want), sql
            print(
                f"{sql:<34} {rows:>12,} {len(got):>12,} {t_pl:>10.2f}s {t_pa:>8.2f}s {t_pa / t_pl:>8.2f}x"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
