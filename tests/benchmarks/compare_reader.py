"""The torch reader of this checkout against an earlier commit, in the same run.

    python tests/benchmarks/compare_reader.py REF [--quick] [--repeat 3]

Checks REF out into a temporary git worktree. The data is made once (by this checkout); each
side writes its own token copy and index with its own ``varpack lengths --arrow-copy`` and reads
it with its own code, in fresh processes, alternating the sides so that machine noise falls on
both alike. Printed, per side and as ratios (this checkout / REF):

- the index build: ``token_index.write_index`` alone on the copy (seconds), and
  ``varpack lengths --arrow-copy`` end to end; ``import varpack.torch`` (seconds, wall and CPU);
- start-up (``bench_startup.py``'s child, 10 M samples of 1..16 tokens; ``--quick`` 1 M): open
  ``PlanLoader`` + ``ParquetTokenDataset`` on rank 0 of a dp-64 plan and read the first
  micro-batch (seconds, RSS growth MB), then the next 200 micro-batches (seconds);
- steady reads (``bench_reader.py``'s data and packed plan, 200 K long-tail samples; ``--quick``
  20 K): M tokens/s of fetch + collate over the whole plan, by ``pread`` and through a map,
  median of 5 passes after a warm one; wall clock and CPU time (this process's, which other
  jobs on a shared machine disturb less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_startup import CHILD as START_CHILD  # noqa: E402
from bench_startup import tokenized  # noqa: E402

READ_CHILD = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[4])
from bench_reader import rate
from varpack.torch import ParquetTokenDataset, PlanLoader
items = PlanLoader(sys.argv[1], ParquetTokenDataset(sys.argv[2], read=sys.argv[3]), rank=0).dataset
rate(items, 1)  # warm: the page cache, numba's cache
walls, cpus = [], []
for _ in range(5):
    t, c = time.perf_counter(), time.process_time()
    tps, _ = rate(items, 1)
    walls.append(tps)
    cpus.append(tps * (time.perf_counter() - t) / (time.process_time() - c))
print(json.dumps({"wall": statistics.median(walls), "cpu": statistics.median(cpus)}))
"""

IMPORT_CHILD = """
import json, time
c, t = time.process_time(), time.perf_counter()
import varpack.torch
print(json.dumps({"s": time.perf_counter() - t, "cpu": time.process_time() - c}))
"""

BUILD_CHILD = """
import json, sys, time
from varpack.metadata import token_index
t = time.perf_counter()
token_index.write_index(sys.argv[1], sys.argv[2])
print(json.dumps({"s": time.perf_counter() - t}))
"""


def run(side: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(side))
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                         cwd=side)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"a child of {side} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def vp(side: Path, *args: object) -> float:
    """Seconds of ``varpack ARGS`` run by ``side``'s code."""
    env = dict(os.environ, PYTHONPATH=str(side))
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "varpack", *map(str, args), "-q"], check=True, env=env, cwd=side
    )  # fmt: skip (``-m`` puts the working directory first on the path)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", help="the commit to compare with")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n_start, n_read = (1_000_000, 20_000) if args.quick else (10_000_000, 200_000)
    with tempfile.TemporaryDirectory(prefix="compare-reader-") as tmp:
        work = Path(tmp)
        base = work / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.ref], check=True)  # fmt: skip
        try:
            sides = {"ref": base, "this": ROOT}
            results = compare(sides, work, n_start, n_read, args.repeat)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=True)  # fmt: skip
    print(f"reader: this checkout vs {args.ref}, medians of {args.repeat} alternating runs")
    print(f"{'figure':<40}{'ref':>12}{'this':>12}{'this / ref':>12}")
    for name, values in results.items():
        ref, this = (statistics.median(values[s]) for s in ("ref", "this"))
        print(f"{name:<40}{ref:>12.4g}{this:>12.4g}{this / ref:>12.3f}")


def compare(
    sides: dict[str, Path], work: Path, n_start: int, n_read: int, repeat: int
) -> dict[str, dict[str, list[float]]]:
    this = sides["this"]
    tokenized(work / "start.parquet", n_start)
    vp(this, "lengths", work / "start.parquet", work / "start-meta")
    vp(this, "plan", work / "start-meta", work / "start-plan", "--dp", 64, "--max-tokens", 4096)
    vp(this, "synth", work / "tok", "--tokenized", "-n", n_read, "--shards", 4, "--max-len", 8192,
       "--row-group-size", 1024, "--vocab-size", 256)  # fmt: skip
    vp(this, "lengths", work / "tok", work / "read-meta", "--id-column", "sample_id")
    vp(this, "plan", work / "read-meta", work / "read-plan", "--max-tokens", 16384,
       "--layout", "packed", "--pad-multiple", 64)  # fmt: skip
    out: dict[str, dict[str, list[float]]] = {}
    size = f"{n_start / 1e6:g} M"
    r = -1

    def note(name: str, side: str, value: float) -> None:
        if r >= 0:
            out.setdefault(name, {"ref": [], "this": []})[side].append(value)

    for r in range(-1, repeat):  # round -1 warms each side (numba's cache, the page cache)
        for side, code in sides.items() if r % 2 == 0 else reversed(sides.items()):
            d = work / side
            d.mkdir(exist_ok=True)
            copy, read = d / "start.arrow", d / "tok.arrow"
            for path in (copy, Path(f"{copy}.idx"), read, Path(f"{read}.idx")):
                path.unlink(missing_ok=True)
            took = vp(code, "lengths", work / "start.parquet", d / "meta", "--arrow-copy", copy,
                      "--overwrite")  # fmt: skip
            note(f"lengths --arrow-copy, {size} s", side, took)
            imported = run(code, "-c", IMPORT_CHILD)
            note("import varpack.torch s", side, imported["s"])
            note("import varpack.torch s (cpu)", side, imported["cpu"])
            built = run(code, "-c", BUILD_CHILD, str(copy), str(d / "again.idx"))
            note(f"index build (write_index), {size} s", side, built["s"])
            for mode in ("pread", "mmap"):
                got = run(code, "-c", START_CHILD, str(work / "start-plan"), str(copy), mode)
                note(f"open + first batch s ({mode})", side, got["s"])
                note(f"open + first batch RSS +MB ({mode})", side, got["mb"])
                note(f"next 200 micro-batches s ({mode})", side, got["next_s"])
            vp(code, "lengths", work / "tok", d / "read-meta", "--id-column", "sample_id",
               "--arrow-copy", read, "--overwrite")  # fmt: skip
            for mode in ("pread", "mmap"):
                got = run(code, "-c", READ_CHILD, str(work / "read-plan"), str(read), mode,
                          str(HERE))  # fmt: skip
                note(f"steady read M tokens/s wall ({mode})", side, got["wall"] / 1e6)
                note(f"steady read M tokens/s cpu ({mode})", side, got["cpu"] / 1e6)
    return out


if __name__ == "__main__":
    main()
