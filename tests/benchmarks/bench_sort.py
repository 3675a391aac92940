"""Benchmark ``varpack sort`` (mpiexec -n 2) against polars and against the blog's reference sort.

    python tests/benchmarks/bench_sort.py [--quick] [--ranks 2] [--repeat 3]

On the same synthetic metadata (``varpack.metadata.synth``, long-tail lengths, 16 shards):

- varpack: ``mpiexec -n 2 python -m mpi4py`` running the same driver as ``varpack sort``;
- polars: one process, ``scan_parquet -> sort(seq_len, sample_id) -> sink_parquet``;
- reference (small size only): a reimplementation of the blog's ``sample_sort`` with mpi4py —
  Python-list sorts before and after the exchange, 100 samples per rank whose splitters never
  split a key, and a ``file_write_ordered`` that funnels every rank's rows through rank 0 in turn.

Each run is a fresh subprocess. ``wall`` is end to end (interpreter start, imports, MPI start);
``core`` is the time inside the process from just before reading to the output being complete.
Figures are medians of ``--repeat`` runs. Peak RSS per rank (``ru_maxrss``, gathered over MPI)
is compared with that rank's share of the data (its rows x 16 bytes: an int64 id and length).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ROW_BYTES = 16


# ---------------------------------------------------------------- workers (run under mpiexec)
def _peaks(comm) -> list[int]:
    return comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, root=0)


def varpack_worker(src: str, out: str) -> None:
    from mpi4py import MPI

    from varpack.sort import sort_metadata

    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    index = sort_metadata(src, out, quiet=True)
    comm.Barrier()
    core = time.perf_counter() - t0
    peaks = _peaks(comm)
    if comm.rank == 0:
        assert index is not None
        rows = [p["rows"] for p in index["parts"]]
        print(json.dumps({"core": core, "peak": peaks, "rows": rows}))


def reference_worker(src: str, out: str) -> None:
    """The blog's sample sort, rows as Python lists [seq_len, sample_id], with file_write_ordered."""
    import numpy as np
    import pyarrow.parquet as pq
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    comm.Barrier()
    t0 = time.perf_counter()
    files = sorted(str(p) for p in Path(src).glob("*.parquet"))[rank::size]
    cols = [pq.read_table(f, columns=["seq_len", "sample_id"]) for f in files]
    rows = [
        list(r)
        for t in cols
        for r in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)
    ]
    # 1 - sort rows lexicographically (Python list sort)
    rows = sorted(rows)
    # 2/3 - 100 evenly spaced samples of the first column, all-gathered
    idx = np.round(np.linspace(0, len(rows) - 1, 100)).astype(int)
    samples = np.array([rows[i][0] for i in idx], dtype=np.int64)
    all_samples = np.empty(100 * size, dtype=np.int64)
    comm.Allgather(samples, all_samples)
    # 4 - ranges on the first column only: a key is never split across ranks
    all_samples.sort()
    ranges = all_samples[np.round(np.linspace(0, len(all_samples) - 1, size + 1)).astype(int)]
    ranges[-1] += 1
    ranges[0] = min(ranges[0], 0)
    tensor = np.array(rows, dtype=np.int64).reshape(-1, 2)
    # 5 - bucket local rows by key range (masks)
    send = [
        tensor[(tensor[:, 0] >= ranges[r]) & (tensor[:, 0] < ranges[r + 1])] for r in range(size)
    ]
    # 6/7 - counts, then the payload (all_to_all_single)
    send_count = np.array([s.size for s in send], dtype=np.int64)
    recv_count = np.empty(size, dtype=np.int64)
    comm.Alltoall(send_count, recv_count)
    sendbuf = np.concatenate(send).ravel()
    recv = np.empty(int(recv_count.sum()), dtype=np.int64)
    comm.Alltoallv([sendbuf, send_count], [recv, recv_count])
    # 8 - sort locally again (Python list sort)
    mine = sorted(recv.reshape(-1, 2).tolist())
    # file_write_ordered: every rank's rows pass through rank 0, one rank at a time
    if rank == 0:
        with open(out, "wb") as fh:
            fh.write(np.array(mine, dtype=np.int64).tobytes())
            for r in range(1, size):
                data = comm.recv(source=r)
                fh.write(np.array(data, dtype=np.int64).tobytes())
    else:
        comm.send(mine, dest=0)
    comm.Barrier()
    core = time.perf_counter() - t0
    peaks = _peaks(comm)
    counts = comm.gather(len(mine), root=0)
    if rank == 0:
        print(json.dumps({"core": core, "peak": peaks, "rows": counts}))


POLARS = """
import json, resource, sys, time
t0 = time.perf_counter()
import polars as pl
src, out = sys.argv[1], sys.argv[2]
(pl.scan_parquet(src + "/*.parquet").select("sample_id", "seq_len")
   .sort(["seq_len", "sample_id"]).sink_parquet(out))
print(json.dumps({"core": time.perf_counter() - t0,
                  "peak": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]}))
"""


# ---------------------------------------------------------------- driver
def _run(cmd: list[str]) -> tuple[float, dict]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def _mpi(ranks: int, *args: str) -> list[str]:
    return [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, __file__, *args]


def measure(kind: str, src: Path, work: Path, ranks: int, repeat: int) -> dict:
    walls, cores, last = [], [], {}
    for _ in range(repeat):
        out = work / f"out-{kind}"
        shutil.rmtree(out, ignore_errors=True)
        if out.exists():
            out.unlink()
        if kind == "varpack":
            cmd = _mpi(ranks, "--worker", "varpack", str(src), str(out))
        elif kind == "reference":
            cmd = _mpi(ranks, "--worker", "reference", str(src), str(out))
        else:
            cmd = [sys.executable, "-c", POLARS, str(src), str(out) + ".parquet"]
        wall, last = _run(cmd)
        walls.append(wall)
        cores.append(last["core"])
        for p in work.glob("out-*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    return {"wall": statistics.median(walls), "core": statistics.median(cores), **last}


def generate(n: int, root: Path) -> Path:
    from varpack.metadata.synth import write_synth

    out = root / f"meta-{n}"
    if not out.exists():
        write_synth(out, "long-tail", n, shards=16, seed=1)
    return out


def _mb(x: float) -> str:
    return f"{x / 2**20:,.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--worker", choices=["varpack", "reference"], help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        (varpack_worker if args.worker == "varpack" else reference_worker)(*args.paths)
        return
    sizes = [1_000_000, 2_000_000] if args.quick else [10_000_000, 50_000_000]
    ref_size = 200_000 if args.quick else 2_000_000
    repeat = args.repeat or (1 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="varpack-bench-sort-"))
    print(
        f"varpack sort benchmark: mpiexec -n {args.ranks} vs polars (1 process) vs reference; "
        f"median of {repeat}; {os.cpu_count()} cores"
    )
    print(
        f"{'rows':>12} {'method':<10} {'wall s':>8} {'core s':>8} {'M rows/s':>9} {'x polars':>9} "
        f"{'x ref':>7} {'peak RSS per rank (x share)':<40}"
    )
    try:
        ref_rate = None
        for n in [ref_size, *sizes]:
            src = generate(n, work)
            kinds = ["reference", "varpack"] if n == ref_size else ["polars", "varpack"]
            res = {
                k: measure(k, src, work, args.ranks, 1 if k == "reference" else repeat)
                for k in kinds
            }
            for k in kinds:
                r = res[k]
                ratio_pl = res["polars"]["wall"] / r["wall"] if "polars" in res else None
                rate = n / r["wall"] / 1e6
                if k == "reference":
                    ref_rate = rate
                ratio_ref = rate / ref_rate if ref_rate and k != "reference" else None
                shares = r.get("rows") or [n]
                peaks = ", ".join(
                    f"{_mb(p)} ({p / max(s * ROW_BYTES, 1):.1f}x)"
                    for p, s in zip(r["peak"], shares, strict=False)
                )
                print(
                    f"{n:>12,} {k:<10} {r['wall']:>8.2f} {r['core']:>8.2f} {rate:>9.2f} "
                    f"{(f'{ratio_pl:.2f}' if ratio_pl else '-'):>9} {(f'{ratio_ref:.0f}' if ratio_ref else '-'):>7} {peaks}"
                )
            if n == ref_size:
                core_ratio = res["reference"]["core"] / res["varpack"]["core"]
                print(
                    f"{'':>12} at {n:,} rows: varpack is {res['reference']['wall'] / res['varpack']['wall']:.1f}x "
                    f"the reference end to end, {core_ratio:.0f}x in-process (core)"
                )
            shutil.rmtree(src, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        "x ref = varpack rows/s (wall) at this size / reference rows/s (wall) at the reference size"
    )


if __name__ == "__main__":
    main()
