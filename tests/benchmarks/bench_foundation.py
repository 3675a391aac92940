"""Benchmark the foundation commands as a user runs them (the CLI, in a subprocess).

- ``varpack synth``: 100 M long-tail samples into 64 shards (``--quick``: 1 M).
- ``varpack lengths``: on a tokenized dataset of ~1 GB on disk (``--quick``: ~50 MB), made first
  with ``varpack synth --tokenized``.

Prints the median wall time of ``--repeat`` runs (interpreter start-up included) and rows/s.
Heavy: run the full size under ``flock /tmp/varpack-heavy.lock``.

    python tests/benchmarks/bench_foundation.py [--quick] [--repeat 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARPACK = [sys.executable, "-m", "varpack"]
# tokenized long-tail: ~930 tokens per sample, ~1.9 bytes per token on disk (zstd)
SIZES = {
    "full": {"synth": 100_000_000, "tokenized": 560_000},
    "quick": {"synth": 1_000_000, "tokenized": 28_000},
}


def run(args: list[str]) -> float:
    """Wall seconds of one CLI run; fail loudly if it fails."""
    start = time.perf_counter()
    proc = subprocess.run([*VARPACK, *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"varpack {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (< 1 min)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch space (default: /tmp)")
    opts = parser.parse_args()
    sizes = SIZES["quick" if opts.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="varpack-bench-", dir=opts.workdir))
    rows: list[tuple[str, int, int, float, list[float]]] = []
    try:
        n = sizes["synth"]
        meta = work / "meta"
        cmd = [
            "synth",
            str(meta),
            "-n",
            str(n),
            "--shards",
            "64",
            "--seed",
            "0",
            "-q",
            "--overwrite",
        ]
        times = [run(cmd) for _ in range(opts.repeat)]
        rows.append(("synth long-tail", n, du(meta), statistics.median(times), times))
        shutil.rmtree(meta)

        n = sizes["tokenized"]
        tok, out = work / "tok", work / "lengths"
        gen = run(["synth", str(tok), "-n", str(n), "--shards", "16", "--tokenized", "-q"])
        rows.append(("synth --tokenized", n, du(tok), gen, [gen]))
        cmd = ["lengths", str(tok), str(out), "-q", "--overwrite"]
        times = [run(cmd) for _ in range(opts.repeat)]
        rows.append(("lengths", n, du(tok), statistics.median(times), times))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"varpack foundation benchmark ({'quick' if opts.quick else 'full'}), CLI wall time")
    print(
        f"{'command':<18} {'rows':>12} {'input/output':>13} {'median s':>9} {'rows/s':>12} {'MB/s':>8}  runs"
    )
    for name, n, size, med, times in rows:
        runs = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"{name:<18} {n:>12,} {size / 1e6:>10,.0f} MB {med:>9.2f} {n / med:>12,.0f} "
            f"{size / 1e6 / med:>8,.0f}  {runs}"
        )


if __name__ == "__main__":
    main()
