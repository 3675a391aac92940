"""Reader start-up benchmark: memory and time to open a plan and read a first batch, per process.

    python tests/benchmarks/bench_startup.py [--quick]

For 1 M and 10 M samples (``--quick``: 100 K and 1 M) of 1..16 tokens: ``varpack lengths
--arrow-copy`` writes the metadata, the token copy and its location index; ``varpack plan --dp 64``
plans it. A fresh process then opens ``PlanLoader(plan, ParquetTokenDataset(copy), rank=0)`` and
takes its first micro-batch: what a trainer process does before its first step, then 200 more
(the steady read rate). Rows: with the offline index, the copy read by ``pread`` (the default)
and through a map (``read="mmap"``); 16 copies, one per input shard (the rows split by id
range, each copied with its index by its own ``varpack lengths``, opened as one directory);
without the index (the index file moved away: positions built at open, the baseline). Printed: RSS growth (max RSS after - before, MB; with a map it
counts the pages of the copy this process touched, which the processes of a node share in the
page cache), anonymous memory growth (this process's own), open + first batch time, the next
200 micro-batches' time, and the ratios to the baseline.

Targets: RSS growth <= 100 MB and open time <= 0.5 s at 1 M and 10 M samples, with the index.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHILD = """
import json, sys, time
from varpack.torch import ParquetTokenDataset, PlanLoader

def status_mb(key):
    line = next(x for x in open("/proc/self/status") if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024

def anon_mb():  # this process's own memory; mapped file pages are the node's shared page cache
    fields = open("/proc/self/smaps_rollup").read().split()
    return int(fields[fields.index("Anonymous:") + 1]) / 1024

before, own = status_mb('VmRSS'), anon_mb()
t = time.perf_counter()
loader = PlanLoader(sys.argv[1], ParquetTokenDataset(sys.argv[2], read=sys.argv[3]), rank=0)
batch = next(iter(loader))
took = time.perf_counter() - t
grew = status_mb('VmHWM') - before  # peak RSS (reset at exec, unlike ru_maxrss)
own = anon_mb() - own
t = time.perf_counter()
for _, _ in zip(range(200), loader):
    pass
print(json.dumps({"mb": grew, "anon_mb": own, "s": took, "next_s": time.perf_counter() - t,
                  "tokens": int(batch.input_ids.numel())}))
"""


def tokenized(path: Path, n: int, seed: int = 0) -> None:
    """``n`` samples of 1..16 tokens under shuffled ids, written in row groups of 64 K."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 17, n)
    offsets = np.r_[0, np.cumsum(lens)].astype(np.int64)
    values = rng.integers(0, 30_000, int(offsets[-1])).astype(np.int32)
    ids = rng.permutation(n).astype(np.int64)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"sample_id": ids, "input_ids": tokens}), path, row_group_size=65_536)


#: token copies of the sharded row (one per input shard)
SHARDS = 16


def shard_copies(src: Path, out: Path, shards: int) -> None:
    """One token copy per input shard, as a corpus of many files is copied: the rows of
    ``src`` split by id range into ``shards`` Parquet files, each copied by its own ``varpack
    lengths --arrow-copy`` (its index beside it; its metadata is not needed here)."""
    table = pq.read_table(src)
    ids = table.column("sample_id").to_numpy()
    edges = np.linspace(0, int(ids.max()) + 1, shards + 1).astype(np.int64)
    out.mkdir()
    for k in range(shards):
        keep = np.flatnonzero((ids >= edges[k]) & (ids < edges[k + 1]))
        part = out.parent / f"shard-{k}.parquet"
        pq.write_table(table.take(keep), part, row_group_size=65_536)
        vp("lengths", part, out.parent / f"meta-{k}", "--arrow-copy", out / f"part-{k:03d}.arrow")


def vp(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "varpack", *map(str, args), "-q"], check=True)


def open_once(plan: Path, copy: Path, read: str = "pread") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(plan), str(copy), read],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    sizes = (100_000, 1_000_000) if ap.parse_args().quick else (1_000_000, 10_000_000)
    print(
        f"{'samples':>12}{'read':>11}{'RSS +MB':>10}{'anon +MB':>13}{'open s':>9}{'next 200 s':>12}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for n in sizes:
            root = Path(tmp) / str(n)
            root.mkdir()
            tokenized(root / "tok.parquet", n)
            copy = root / "tok.arrow"
            vp("lengths", root / "tok.parquet", root / "meta", "--arrow-copy", copy)
            vp("plan", root / "meta", root / "plan", "--dp", 64, "--max-tokens", 4096)
            rows = {"pread": open_once(root / "plan", copy)}
            rows["mmap"] = open_once(root / "plan", copy, "mmap")
            shard_copies(root / "tok.parquet", root / "copies", SHARDS)
            rows[f"{SHARDS} copies"] = open_once(root / "plan", root / "copies")
            Path(f"{copy}.idx").rename(root / "moved.idx")
            rows["built"] = built = open_once(root / "plan", copy)
            for name, r in rows.items():
                print(
                    f"{n:>12,}{name:>11}{r['mb']:>10.1f}{r['anon_mb']:>13.1f}{r['s']:>9.3f}"
                    f"{r['next_s']:>12.3f}"
                )
            for name in ("pread", "mmap"):
                r = rows[name]
                print(
                    f"{'':>12}{'ratio':>11}{r['mb'] / max(built['mb'], 1e-9):>10.3f}"
                    f"{'':>13}{r['s'] / built['s']:>9.3f}   ({name} / built)"
                )


if __name__ == "__main__":
    main()
