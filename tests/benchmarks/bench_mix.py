"""Benchmark of ``plan --mix``: a 3-source blend against the same plan without a mix.

Three sources (long-tail chat, bimodal long documents, uniform code; natural proportions 70 /
10 / 20 % of the samples) are blended at weights far from them (chat 0.3, docs 0.5, code 0.2 of
the tokens) and planned shuffled (dp 8, grad-accum 4, budget 16 K, FLOPs cost; documents over
the budget dropped first). Each plan is ``varpack plan``'s own path end to end (the metadata
read and sorted, planned, written; the mix: the source column read, the blend drawn, the
source carried into the manifests), each in a process of its own. Prints, without a mix and
with it: time, peak memory, time vs ideal, padding, and with the mix each source's planned
share of the tokens and of the steps (mean, min, max, error against its target, steps within
the tolerance), with the time ratio. ``--split`` adds the same blend with ``--oversize split``
(the long documents in pieces instead of dropped): its time, the tokens it keeps, and its shares.

    PYTHONPATH=$PWD python tests/benchmarks/bench_mix.py [--samples 30M] [--quick] [--split]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

WEIGHTS = {"chat": 0.3, "docs": 0.5, "code": 0.2}


def _data(n: int, path: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from varpack.metadata.synth import sample_lengths

    rng = np.random.default_rng(0)
    src = rng.choice(np.array(["chat", "docs", "code"]), n, p=[0.7, 0.1, 0.2])
    lens = np.empty(n, dtype=np.int64)
    for name, dist in (("chat", "long-tail"), ("docs", "bimodal"), ("code", "uniform")):
        mine = src == name
        lens[mine] = sample_lengths(dist, int(mine.sum()), rng)
    table = pa.table({"sample_id": np.arange(n, dtype=np.int64), "seq_len": lens,
                      "source": pa.array(src).dictionary_encode()})  # fmt: skip
    pq.write_table(table, path)


def _run(path: str, mixed: bool, oversize: str, q: mp.Queue) -> None:  # type: ignore[type-arg]
    from varpack.make import plan
    from varpack.plan import PlanConfig
    from varpack.plan.mix import Mix

    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=4, cost="flops", oversize=oversize,
                     model_preset="qwen2.5-0.5b", order="shuffle")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:  # numba kernels compiled or loaded first
        plan(path, f"{tmp}/warm", cfg, mix=Mix(WEIGHTS, total=10**6) if mixed else None,
             source_column="source" if mixed else None)  # fmt: skip
        t0 = time.perf_counter()
        _, meta = plan(path, f"{tmp}/plan", cfg, mix=Mix(WEIGHTS) if mixed else None,
                       source_column="source" if mixed else None)  # fmt: skip
        took = time.perf_counter() - t0
    s = meta["stats"]
    q.put({"s": took, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "time": s["time_vs_ideal"], "pad": s["padding_ratio"], "mix": meta.get("mix"),
           "kept": s["tokens"]["kept_share"]})  # fmt: skip


def main() -> None:
    from benchkit import count, in_process

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="30M")
    ap.add_argument("--quick", action="store_true", help="1 M samples")
    ap.add_argument("--split", action="store_true", help="the blend with --oversize split too")
    a = ap.parse_args()
    n = 1_000_000 if a.quick else count(a.samples)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/meta.parquet"
        _data(n, path)
        runs = {"no mix": in_process(_run, path, False, "drop"),
                "mix": in_process(_run, path, True, "drop")}  # fmt: skip
        if a.split:
            runs["mix, split"] = in_process(_run, path, True, "split")
    base = runs["no mix"]
    print(f"{n:,} samples, 3 sources (natural 70/10/20 % of samples), weights {WEIGHTS} by tokens")
    print(f"{'plan':<11} {'time':>8} {'ratio':>6} {'peak GB':>8} {'vs ideal':>9} {'padding':>8} "
          f"{'kept':>7}")  # fmt: skip
    for name, r in runs.items():
        print(f"{name:<11} {r['s']:>7.1f}s {r['s'] / base['s']:>6.2f} {r['rss']:>8.2f} "
              f"{r['time']:>9.4f} {100 * r['pad']:>7.2f}% {100 * r['kept']:>6.2f}%")  # fmt: skip
    for name, r in runs.items():
        if r["mix"] is not None:
            _shares(name, r["mix"])


def _shares(name: str, m: dict) -> None:  # type: ignore[type-arg]
    """Each source's planned share and share of the steps, and the steps within the tolerance."""
    planned = sum(f["planned_tokens"] for f in m["sources"].values())
    print(f"{name}:")
    for src, f in m["sources"].items():
        sh = m["shares"][src]
        print(f"  {src:<5} weight {f['weight']:.2f}: planned {f['planned_tokens'] / planned:.4f} "
              f"of the tokens (x{f['repeat']:.2f}); share of the steps mean {sh['mean']:.4f}, "
              f"min {sh['min']:.4f}, max {sh['max']:.4f}; error vs target mean {sh['error']:.4f}, "
              f"max {sh['error_max']:.4f}; within {100 * m['tolerance']:.3g} points "
              f"{100 * sh['held']:.2f}% of the steps ({sh['outside']} outside)")  # fmt: skip
    if "steps" in m:
        s = m["steps"]
        print(f"  every source within {100 * m['tolerance']:.3g} points: {s['within']:,} of "
              f"{s['steps']:,} steps; 95% within {100 * s['p95']:.3g} points, the worst "
              f"{100 * s['max']:.3g}")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
