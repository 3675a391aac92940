"""Benchmark ``varpack validate`` in one process and under ``mpiexec -n P``: time and peak memory.

    python tests/benchmarks/bench_validate.py [--quick] [--samples 10M] [--ranks 1,2,4]
                                              [--metadata] [--keep DIR]

Synthetic metadata (``varpack synth``, uniform lengths 64..8192) is planned once (dp 8 x
grad-accum 4, 64 K-token budget); then the plan is validated with P = 1 (a plain process, no
MPI) and under ``mpiexec -n P python -m mpi4py`` for each other P, each run a fresh subprocess.
``wall`` is end to end (interpreter start, imports, MPI start); ``peak`` is each rank's
``ru_maxrss``: rank 0 (which also runs the whole-plan checks) and the largest of the others.
Every run must print the same lines as P = 1. With ``--metadata`` the input is checked too
(rank 0 reads it and sends each rank the ids it owns).

On a machine with fewer cores than P the ranks share cores, so time ratios above the core
count measure oversubscription; the memory per rank is the figure that carries over.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import count

BIN = Path(sys.executable).parent

#: run in each rank: the CLI, then one JSON line with this rank's peak memory and time
WORKER = """
import atexit, json, os, resource, sys, time
t0 = time.perf_counter()
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
atexit.register(lambda: print("BENCH " + json.dumps({"rank": rank, "peak_kb":
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "core_s": time.perf_counter() - t0}),
    file=sys.stderr, flush=True))
from varpack.cli import main
main(sys.argv[1:], prog_name="varpack")
"""


def _run(ranks: int, args: list[str]) -> dict[str, object]:
    """One validation; its stdout, wall time and every rank's peak memory."""
    head = [sys.executable, "-c", WORKER] if ranks == 1 else [
        str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-c", WORKER]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run([*head, *args], capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"P={ranks} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    found = [
        json.loads(x) for x in re.findall(r"BENCH (\{[^}]*\})", proc.stderr)
    ]  # ranks interleave
    peaks = {f["rank"]: f["peak_kb"] / 2**20 for f in found}
    return {"out": proc.stdout, "wall": wall, "peaks": peaks}


def _prepare(root: Path, samples: int) -> Path:
    """Synthetic metadata and its plan under ``root``."""
    varpack = str(BIN / "varpack")
    meta, plan = root / "meta", root / "plan"
    if not (plan / "plan.json").exists():
        subprocess.run([varpack, "synth", meta, "-n", str(samples), "--dist", "uniform", "-q",
                        "--overwrite"], check=True)  # fmt: skip
        subprocess.run([varpack, "plan", meta, plan, "--max-tokens", "65536", "--dp", "8",
                        "--grad-accum", "4", "-q", "--overwrite"], check=True,
                       stderr=subprocess.DEVNULL)  # fmt: skip
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500K samples")
    ap.add_argument("--samples", default="10M")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--metadata", action="store_true", help="validate with --metadata too")
    ap.add_argument("--keep", type=Path, default=None, help="build (or reuse) the data here")
    a = ap.parse_args()
    samples = count("500K" if a.quick else a.samples)
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-validate-"))
    try:
        plan = _prepare(root, samples)
        args = ["validate", str(plan)] + (["--metadata", str(root / "meta")] if a.metadata else [])
        runs = {p: _run(p, args) for p in (int(x) for x in a.ranks.split(","))}
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    _table(samples, a.metadata, runs)


def _table(samples: int, metadata: bool, runs: dict[int, dict[str, object]]) -> None:
    """One row per P: wall time and peak memory per rank, with ratios against P = 1."""
    first = min(runs)
    base = runs[first]
    print(f"varpack validate, {samples:,} samples, dp 8 x grad-accum 4"
          f"{', --metadata' if metadata else ''}")  # fmt: skip
    print(f"{'P':>3} {'wall s':>8} {'vs P=1':>7} {'rank 0 GiB':>11} {'vs P=1':>7} "
          f"{'others GiB':>11} {'vs P=1':>7}  same output")  # fmt: skip
    p0 = base["peaks"][0]  # type: ignore[index]
    for p, r in sorted(runs.items()):
        peaks: dict[int, float] = r["peaks"]  # type: ignore[assignment]
        others = max((v for k, v in peaks.items() if k), default=float("nan"))
        wall: float = r["wall"]  # type: ignore[assignment]
        print(f"{p:>3} {wall:>8.2f} {wall / base['wall']:>7.2f} {peaks[0]:>11.2f} "  # type: ignore[operator]
              f"{peaks[0] / p0:>7.2f} {others:>11.2f} {others / p0:>7.2f}  "
              f"{r['out'] == base['out']}")  # fmt: skip


if __name__ == "__main__":
    main()
