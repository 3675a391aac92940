"""Benchmark of ``varpack plan`` under MPI: wall time and peak memory per rank against one process.

For each size N a ``varpack sort --single-file`` output is written directly (no sort run):
long-SFT-like lengths (a lognormal body, median 300 tokens, sigma 1, clipped to [1, 16384];
0.1 % of the samples in the top 10 % of the budget), unique sparse ids (a keyed random
permutation of [0, 2N), its first N values), records in (seq_len, sample_id) order, generated
in chunks of whole length groups so the generator holds a few million rows at a time.

Each input is planned with the same options (budget 16384, dp 8, grad-accum 4), in each order
asked for (curriculum; ``--order shuffle`` with its default ``--compose cost``), in one process (``python -m varpack plan``) and by ``mpiexec -n P python -m mpi4py -m varpack plan``
for each P, every process through a wrapper whose ``atexit`` handler writes its peak RSS
(``ru_maxrss``) to a file named after its MPI rank. Each MPI plan must be the one-process plan
byte for byte (every file's sha256). A first round at 100 K samples warms the numba cache and
measures each run's fixed cost (interpreter, imports, MPI).

Prints per size: wall time, its ratio to one process and to P=1, peak RSS of rank 0 and the
largest of the other ranks, the largest rank's peak over the one-process peak, whether the plan
is identical; then per-sample costs for projections (bytes of peak per sample, one process and
per rank of its N/P share, also above the fixed cost; seconds per million samples).

    python tests/benchmarks/bench_plan_scale.py [--sizes 20M,100M] [--ranks 1,2,4] [--quick]
        [--orders curriculum,shuffle]
    python tests/benchmarks/bench_plan.py --only scale [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from varpack.fingerprint import Fingerprint, fingerprint, sha256_file
from varpack.sort.output import HEADER_BYTES, bin_header, read_header, record_dtype

BUDGET, MEDIAN, SIGMA, NEAR = 16384, 300.0, 1.0, 0.001
CHUNK = 2_000_000  # rows the generator holds at a time (whole length groups)
WARM = 100_000
PLAN_ARGS = ["--max-tokens", str(BUDGET), "--dp", "8", "--grad-accum", "4", "-q"]
GIB = 2**30
#: runs ``module`` with the given argv; at exit writes this process's peak RSS (KiB) to OUT/RANK
WRAPPER = """
import atexit, os, resource, runpy, sys
out, module = sys.argv[1], sys.argv[2]
rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
def peak():
    with open(os.path.join(out, rank), "w") as fh:
        fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
atexit.register(peak)
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


# ---------------------------------------------------------------- the sorted input ---------------


def length_counts(n: int, rng: np.random.Generator) -> np.ndarray:
    """How many samples have each length (index = length, 0 .. BUDGET), drawn multinomially."""
    edges = np.log(np.arange(1, BUDGET) + 0.5)  # rint: length k covers [k - 0.5, k + 0.5)
    z = (edges - math.log(MEDIAN)) / (SIGMA * math.sqrt(2))
    cdf = 0.5 * (1 + np.array([math.erf(v) for v in z]))
    body = np.diff(np.concatenate(([0.0], cdf, [1.0])))  # lengths 1 .. BUDGET, both ends clipped
    near = (np.arange(1, BUDGET + 1) > 0.9 * BUDGET).astype(float)
    pmf = (1 - NEAR) * body + NEAR * near / near.sum()
    return np.concatenate(([0], rng.multinomial(n, pmf / pmf.sum())))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sparse_ids(pos: np.ndarray, domain: int, keys: np.ndarray) -> np.ndarray:
    """A keyed permutation of [0, domain) at ``pos``: a Feistel network, cycle-walked into range."""
    half = max(1, ((domain - 1).bit_length() + 1) // 2)
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << shift) | right

    out = encrypt(pos.astype(np.uint64))
    while (out_of_range := out >= np.uint64(domain)).any():
        out[out_of_range] = encrypt(out[out_of_range])
    return out.astype(np.int64)


def write_sorted(path: Path, n: int, seed: int = 0) -> None:
    """A ``varpack sort --single-file`` output of ``n`` samples ordered by (seq_len, sample_id)."""
    rng = np.random.default_rng(seed)
    counts = length_counts(n, rng)
    keys = rng.integers(0, 2**64, 4, dtype=np.uint64)
    meta: dict[str, Any] = {"keys": ["seq_len"], "descending": [],  # as `varpack sort` writes it
                            "order": ["seq_len", "sample_id"],
                            "columns": {"sample_id": "int64", "seq_len": "int64"}}  # fmt: skip
    dtype = record_dtype(meta["columns"])
    ends = np.cumsum(counts)  # ends[L]: samples of length <= L
    digest, fp = hashlib.sha256(), Fingerprint()
    with open(path, "wb") as fh:
        fh.write(b"\0" * HEADER_BYTES)
        lo, start = 1, 0
        while start < n:  # lengths lo .. hi: whole groups, about CHUNK rows (one group at least)
            hi = max(lo, int(np.searchsorted(ends, start + CHUNK, side="right")) - 1)
            stop = int(ends[hi])
            lens = np.repeat(np.arange(lo, hi + 1, dtype=np.int64), counts[lo : hi + 1])
            ids = sparse_ids(np.arange(start, stop), 2 * n, keys)
            order = np.lexsort((ids, lens))
            rec = np.empty(stop - start, dtype=dtype)
            rec["sample_id"], rec["seq_len"] = ids[order], lens[order]
            data = rec.tobytes()
            digest.update(data)
            fh.write(data)
            fp = fp + fingerprint(rec["sample_id"], rec["seq_len"])
            lo, start = hi + 1, stop
        meta.update(total_tokens=fp.tokens, fingerprint=fp.hex)
        fh.seek(0)
        fh.write(bin_header(meta, n, digest.hexdigest()))
    assert read_header(path)["num_rows"] == n


# ---------------------------------------------------------------- runs ---------------------------


@dataclass
class Run:
    """One plan: wall seconds and each rank's peak RSS in bytes."""

    wall: float
    peaks: dict[int, int]

    @property
    def top(self) -> int:
        """The largest rank's peak."""
        return max(self.peaks.values())


def run_plan(src: Path, out: Path, ranks: int | None, work: Path, order: str) -> Run:
    """``varpack plan`` in one process (``ranks`` None) or under ``mpiexec -n ranks``."""
    res = work / "rss"
    shutil.rmtree(res, ignore_errors=True)
    res.mkdir()
    args = ["varpack", "plan", str(src), str(out), *PLAN_ARGS, "--order", order]
    wrap = [sys.executable, "-c", WRAPPER, str(res)]
    mpiexec = Path(sys.executable).with_name("mpiexec")  # the venv's, else the one on PATH
    mpiexec = mpiexec if mpiexec.exists() else Path(shutil.which("mpiexec") or "mpiexec")
    mpi = [] if ranks is None else [str(mpiexec), "-n", str(ranks)]
    cmd = [*wrap, *args] if ranks is None else [*mpi, *wrap, "mpi4py", "-m", *args]
    root = str(Path(__file__).resolve().parents[2])  # the checkout's varpack, from any cwd
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        shown = " ".join([*mpi, "python", "-m", *(["mpi4py", "-m"] if mpi else []), *args])
        sys.exit(f"failed ({proc.returncode}): {shown}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    peaks = {int(f.name): int(f.read_text()) * 1024 for f in res.iterdir()}
    assert len(peaks) == (ranks or 1), f"peak RSS of ranks {sorted(peaks)} only"
    return Run(wall, peaks)


def digests(plan: Path) -> dict[str, str]:
    """sha256 of every file of a plan directory, by relative path."""
    files = [f for f in sorted(plan.rglob("*")) if f.is_file()]
    assert files, f"{plan}: no plan written"
    return {str(f.relative_to(plan)): sha256_file(f) for f in files}


def differences(ref: dict[str, str], got: dict[str, str]) -> list[str]:
    """Files missing, extra or with other bytes than the one-process plan."""
    return sorted(f for f in ref.keys() | got.keys() if ref.get(f) != got.get(f))


def measure(
    n: int, ranks: list[int], work: Path, orders: list[str]
) -> dict[str, dict[str, tuple[Run, list[str]]]]:
    """Plan ``n`` samples in one process and for each P, in each order;
    ``{order: {label: (run, differing files)}}``."""
    src = work / f"sorted-{n}.bin"
    t0 = time.perf_counter()
    write_sorted(src, n)
    print(f"  [{n:,} samples: input written in {time.perf_counter() - t0:.1f} s, "
          f"{src.stat().st_size / GIB:.2f} GiB]", flush=True)  # fmt: skip
    every = {}
    for order in orders:
        ref_dir = work / "plan-1proc"
        got = {"1 proc": (run_plan(src, ref_dir, None, work, order), [])}
        ref = digests(ref_dir)
        for p in ranks:
            out = work / f"plan-p{p}"
            run = run_plan(src, out, p, work, order)
            got[f"P={p}"] = (run, differences(ref, digests(out)))
            shutil.rmtree(out)
        shutil.rmtree(ref_dir)
        every[order] = got
    src.unlink()
    return every


# ---------------------------------------------------------------- report -------------------------


def report(
    n: int, order: str, got: dict[str, tuple[Run, list[str]]], fixed: dict[str, Run]
) -> None:
    one = got["1 proc"][0]
    print(f"\n{order}:", end="")
    p1 = got.get("P=1", (None, []))[0]
    print(f"\n{'N':>12} {'run':>7} {'wall s':>8} {'vs 1proc':>8} {'vs P=1':>7} "
          f"{'rank0 GiB':>9} {'others GiB':>10} {'peak/1proc':>10} identical")  # fmt: skip
    for label, (run, diff) in got.items():
        rest = [v / GIB for r, v in run.peaks.items() if r != 0]
        others = f"{max(rest):>10.2f}" if rest else f"{'-':>10}"
        vs_p1 = f"{run.wall / p1.wall:>7.2f}" if p1 else f"{'-':>7}"
        same = "yes" if not diff else f"NO: {', '.join(diff)}"
        same = "-" if label == "1 proc" else same
        print(f"{n:>12,} {label:>7} {run.wall:>8.2f} {run.wall / one.wall:>8.2f} {vs_p1} "
              f"{run.peaks[0] / GIB:>9.2f} {others} {run.top / one.top:>10.2f} {same}")  # fmt: skip
    print(f"{'':>12} {'run':>7} {'B/sample':>9} {'above fixed':>11} {'s/M samples':>11}"
          "   (bytes: largest rank's peak over its N/P share)")  # fmt: skip
    for label, (run, _) in got.items():
        share = n / (int(label[2:]) if label.startswith("P=") else 1)
        base = fixed[label].top if label in fixed else 0
        print(f"{'':>12} {label:>7} {run.top / share:>9.1f} {(run.top - base) / share:>11.1f} "
              f"{run.wall / (n / 1e6):>11.3f}")  # fmt: skip
    checks = [(p, lim) for p, lim in ((2, 0.6), (4, 0.35)) if f"P={p}" in got]
    for p, lim in checks:
        ratio = got[f"P={p}"][0].top / one.top
        print(f"  P={p}: per-rank peak {ratio:.2f}x one process (target <= {lim}x): "
              f"{'met' if ratio <= lim else 'MISSED'}")  # fmt: skip
    if p1 and "P=2" in got:
        slower = got["P=2"][0].wall / p1.wall
        print(f"  P=2: time {slower:.2f}x P=1 (target <= 1): {'met' if slower <= 1 else 'MISSED'}")


def main() -> None:
    from benchkit import count

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20M,100M", help="sample counts, e.g. 20M,100M")
    ap.add_argument("--ranks", default="1,2,4", help="MPI rank counts, e.g. 1,2,4")
    ap.add_argument("--quick", action="store_true", help="sizes 2M")
    ap.add_argument("--workdir", default=None, help="where inputs and plans go [default: /tmp]")
    ap.add_argument(
        "--orders", default="curriculum,shuffle", help="orders to plan in, e.g. shuffle"
    )
    a = ap.parse_args()
    sizes = [2_000_000] if a.quick else [count(s) for s in a.sizes.split(",")]
    ranks = [int(p) for p in a.ranks.split(",")]
    orders = a.orders.split(",")
    print(f"varpack plan under MPI: budget {BUDGET}, dp 8, grad-accum 4, {', '.join(orders)}; "
          f"long-SFT lengths (median {MEDIAN:.0f}, {NEAR:.1%} near the budget); ranks {ranks}")  # fmt: skip
    print("targets: per-rank peak <= 0.6x at P=2, <= 0.35x at P=4; time at P=2 no worse than P=1")
    with tempfile.TemporaryDirectory(dir=a.workdir, prefix="bench-plan-scale-") as tmp:
        work = Path(tmp)
        warm = measure(WARM, ranks, work, orders)[orders[0]]  # every order's kernels compiled
        fixed = {k: run for k, (run, _) in warm.items()}
        runs = ", ".join(f"{k} {r.top / GIB:.2f} GiB {r.wall:.1f} s" + (f" NOT IDENTICAL: "
                         f"{', '.join(d)}" if d else "") for k, (r, d) in warm.items())  # fmt: skip
        print(f"  [fixed cost at {WARM:,} samples (numba cache now warm): {runs}]", flush=True)
        for n in sizes:
            for order, got in measure(n, ranks, work, orders).items():
                report(n, order, got, fixed)


if __name__ == "__main__":
    main()
