"""Benchmark of `varpack replan` against planning the same samples, in the same process.

A shuffled plan of N long-tail samples (dp 8, grad-accum 4, budget 16 K, flops cost) is made and
written; then it is replanned from its middle step (a) keeping the global batch (dp 4 x
grad-accum 8: every step keeps its micro-batches) and (b) for another batch (dp 6 x grad-accum 4:
what is left planned again). Each is timed end to end (read the parent with every checksum,
plan, recompute the figures, write) and printed as a ratio to the plan + write time; peak memory
of each in a child process. The claim checked: a replan from the middle takes no longer than
planning did (ratio <= 1).

    PYTHONPATH=$PWD python tests/benchmarks/bench_replan.py [--samples 10M] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path


def _plan(n: int, out: str, q: mp.Queue) -> None:  # type: ignore[type-arg]
    import numpy as np

    from varpack.metadata.synth import sample_lengths
    from varpack.plan import PlanConfig, make_plan
    from varpack.planfile.format import write_plan
    from varpack.planfile.tables import plan_tables

    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0), max_len=16384))
    ids = np.arange(n, dtype=np.int64)
    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=4, cost="flops",
                     model_preset="qwen2.5-0.5b", order="shuffle")  # fmt: skip
    make_plan(ids[:10_000], lens[:10_000], cfg)  # numba kernels compiled or loaded first
    t0 = time.perf_counter()
    arrays, meta, extra = make_plan(ids, lens, cfg)
    write_plan(out, meta, plan_tables(arrays), rank_extra=extra)
    q.put({"s": time.perf_counter() - t0, "rss_gb": _rss(), "steps": int(meta["num_steps"])})


def _replan(parent: str, out: str, step: int, options: dict, q: mp.Queue) -> None:  # type: ignore[type-arg]
    from varpack.make.replan import replan

    t0 = time.perf_counter()
    meta, kept = replan(parent, out, step, options)
    q.put({"s": time.perf_counter() - t0, "rss_gb": _rss(), "kept": kept,
           "time_vs_ideal": meta["stats"]["time_vs_ideal"]})  # fmt: skip


def _rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    from benchkit import count, in_process

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="10M")
    ap.add_argument("--quick", action="store_true", help="1M samples")
    a = ap.parse_args()
    n = 1_000_000 if a.quick else count(a.samples)
    with tempfile.TemporaryDirectory() as tmp:
        base = in_process(_plan, n, f"{tmp}/plan")
        mid = base["steps"] // 2
        print(f"{n:,} samples, {base['steps']:,} steps; replanned from step {mid:,}")
        print(f"{'run':<44} {'time':>8} {'vs plan':>8} {'peak GB':>8}")
        print(
            f"{'plan + write (dp 8 x 4)':<44} {base['s']:>7.1f}s {1:>8.2f} {base['rss_gb']:>8.2f}"
        )
        for name, opts in [
            ("replan dp 4 x 8 (steps kept)", {"dp": 4}),
            ("replan dp 6 x 4 (what is left planned again)", {"dp": 6, "grad_accum": 4}),
        ]:
            got = in_process(_replan, f"{tmp}/plan", f"{tmp}/{opts['dp']}", mid, opts)
            ratio = got["s"] / base["s"]
            print(f"{name:<44} {got['s']:>7.1f}s {ratio:>8.2f} {got['rss_gb']:>8.2f}"
                  f"   time vs ideal {got['time_vs_ideal']:.3f}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
