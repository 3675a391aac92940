"""Benchmark of ``--oversize split``: plan throughput when about 1 % of the documents are split.

    python tests/benchmarks/bench_split.py [--samples 10M] [--repeat 3]

Synthetic long-tail lengths (pre-sorted, as ``varpack sort`` delivers them), dp 8, grad-accum 4,
a budget chosen as the 99th length percentile, so that about 1 % of the documents do not fit
alone. Plans the same input with ``--oversize drop`` (those documents skipped), ``split`` (those
documents in pieces) and ``presplit`` (the same pieces given as whole documents, ``--oversize
error``: the same planning work without the split stage), both orders, and prints the median
seconds of ``make_plan``, the ratios split / drop and split / presplit (the split stage's own
cost), with the documents split and their pieces. Each run is a fresh process.
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
from varpack.plan.kernels.split import split_units


def _data(n: int) -> tuple[np.ndarray, np.ndarray, int]:
    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0)))
    budget = int(np.percentile(lens, 99))
    return np.arange(n, dtype=np.int64), lens, budget


def _child(n: int, order: str, oversize: str) -> None:
    ids, lens, budget = _data(n)
    if oversize == "presplit":
        units = split_units(ids, lens, budget)
        assert units is not None
        ids, lens, oversize = np.arange(len(units.ids), dtype=np.int64), units.lens, "error"
    cfg = PlanConfig(max_tokens=budget, dp=8, grad_accum=4, order=order, oversize=oversize)
    step = max(1, n // 20_000)  # an even subset: numba kernels loaded from cache / compiled
    make_plan(ids[::step], lens[::step], cfg)
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
    print(
        f"{'order':>10} {'drop s':>8} {'presplit s':>10} {'split s':>8} {'split/drop':>10} "
        f"{'split/presplit':>14}  documents split, pieces"
    )
    for order in ("curriculum", "shuffle"):
        times: dict[str, list[float]] = {"drop": [], "presplit": [], "split": []}
        last: dict = {}
        for _ in range(args.repeat):
            for oversize in times:  # alternated: machine noise falls on all alike
                r = _run(n, order, oversize)
                times[oversize].append(r["s"])
                last[oversize] = r
        d, p, s = (statistics.median(times[k]) for k in ("drop", "presplit", "split"))
        t = last["split"]["tokens"]
        print(
            f"{order:>10} {d:>8.2f} {p:>10.2f} {s:>8.2f} {s / d:>10.3f} {s / p:>14.3f}  "
            f"{t['documents_split']:,} "
            f"({t['documents_split'] / n:.2%}), {t['pieces']:,} pieces, "
            f"budget {last['split']['budget']:,}"
        )


if __name__ == "__main__":
    main()
