"""Benchmark of ``--oversize split``: plan throughput when about 1 % of the documents are split.

    python tests/benchmarks/bench_split.py [--samples 10M] [--repeat 3]

Synthetic long-tail lengths (pre-sorted, as ``varpack sort`` delivers them), dp 8, grad-accum 4,
a budget chosen as the 99th length percentile, so that about 1 % of the documents do not fit
alone. Plans the same input with ``--oversize drop`` (those documents skipped) and ``split``
(those documents in pieces), both orders, and prints the median seconds of ``make_plan`` and the
ratio split / drop, with the documents split and their pieces. Each run is a fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, make_plan


def _data(n: int) -> tuple[np.ndarray, np.ndarray, int]:
    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0)))
    budget = int(np.percentile(lens, 99))
    return np.arange(n, dtype=np.int64), lens, budget


def _child(n: int, order: str, oversize: str) -> None:
    ids, lens, budget = _data(n)
    cfg = PlanConfig(max_tokens=budget, dp=8, grad_accum=4, order=order, oversize=oversize)
    make_plan(ids[-20_000:], lens[-20_000:], cfg)  # numba kernels loaded from cache / compiled
    t0 = time.perf_counter()
    _, meta, _ = make_plan(ids, lens, cfg)
    t = time.perf_counter() - t0
    print(json.dumps({"s": t, "budget": budget, "tokens": meta["stats"]["tokens"]}))


def _run(n: int, order: str, oversize: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(n), order, oversize],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="10M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        _child(int(args.child[0]), args.child[1], args.child[2])
        return
    n = count(args.samples)
    print(f"make_plan, {n:,} long-tail samples, budget = p99 length: split vs drop")
    print(f"{'order':>10} {'drop s':>8} {'split s':>8} {'split/drop':>10}  documents split, pieces")
    for order in ("curriculum", "shuffle"):
        times: dict[str, list[float]] = {"drop": [], "split": []}
        last: dict = {}
        for _ in range(args.repeat):
            for oversize in ("drop", "split"):  # alternated: machine noise falls on both
                r = _run(n, order, oversize)
                times[oversize].append(r["s"])
                last[oversize] = r
        d, s = statistics.median(times["drop"]), statistics.median(times["split"])
        t = last["split"]["tokens"]
        print(
            f"{order:>10} {d:>8.2f} {s:>8.2f} {s / d:>10.3f}  {t['documents_split']:,} "
            f"({t['documents_split'] / n:.2%}), {t['pieces']:,} pieces, "
            f"budget {last['split']['budget']:,}"
        )


if __name__ == "__main__":
    main()
