"""Shuffled balance across grad-accum: section (b2) of bench_plan.py (`--only balance`).

dp 8, budget 16K (bimodal: 128K), flops cost of Qwen2.5-0.5B, shuffled order (window 8), grad-accum
1, 2, 4, 16, on synth long-tail, synth bimodal and a heavy-bodied set (log-normal lengths, median
~450, p90 ~2.9K, p99 ~13K, capped at the budget so ~0.6 % sit at the cap; 10K and 30K samples).
Rows, all scored by the same functions (bench_plan.score):

* yardstick: shuffled samples packed in stream order to the budget, each step's dp x K
  micro-batches given to ranks by LPT on cost (the simple strategy many trainers use);
* varpack `--compose tokens` (micro-batches filled to the budget, snake-dealt windows);
* varpack `--compose cost` (the default for shuffled plans);
* varpack curriculum, for reference.

`bound` is a lower bound for the cost-composed plan's steps: per step, the larger of its heaviest
sample's cost and its per-rank mean cost, summed, over the ideal; no assignment of those steps'
samples to ranks can do better.
"""

from __future__ import annotations

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig
from varpack.plan.cost import sample_cost

DP = 8
MODEL = "qwen2.5-0.5b"
GRAD_ACCUM = (1, 2, 4, 16)


def heavy_bodied(n: int, rng: np.random.Generator, cap: int = 16384) -> np.ndarray:
    """Log-normal lengths, median 450, sigma 1.45, capped at ``cap`` (~0.6 % at the cap)."""
    return np.clip(np.rint(rng.lognormal(np.log(450), 1.45, n)), 1, cap).astype(np.int64)


def datasets(n: int) -> dict[str, tuple[np.ndarray, int]]:
    return {
        f"long-tail {n // 1000}K": (
            sample_lengths("long-tail", n, np.random.default_rng(0), max_len=16384),
            16384,
        ),
        "bimodal": (
            sample_lengths("bimodal", max(n // 20, 2000), np.random.default_rng(0)),
            131072,
        ),
        "heavy-bodied 10K": (heavy_bodied(10_000, np.random.default_rng(0)), 16384),
        "heavy-bodied 30K": (heavy_bodied(30_000, np.random.default_rng(0)), 16384),
    }


def _lpt(costs: np.ndarray, k: int) -> np.ndarray:
    """Ranks of one step's micro-batches: longest processing time first, ``k`` per rank."""
    rank = np.empty(len(costs), dtype=np.int64)
    load = np.zeros(DP)
    fill = np.zeros(DP, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        open_ = np.flatnonzero(fill < k)
        r = open_[np.argmin(load[open_])]
        rank[i] = r
        load[r] += costs[i]
        fill[r] += 1
    return rank


def yardstick(lens: np.ndarray, budget: int, k: int, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """Shuffled samples packed in stream order; each step's micro-batches by LPT on cost."""
    from bench_plan import Layout, _greedy_sorted  # the same packing kernel, in stream order

    x = lens[rng.permutation(len(lens))]
    off = _greedy_sorted(x, budget)
    m = ((len(off) - 1) // (DP * k)) * DP * k
    off = off[: m + 1]
    cfg = PlanConfig(max_tokens=2**31 - 1, cost="flops", model_preset=MODEL).resolved()
    per_sample = sample_cost(x[: off[-1]], cfg.cost_model())
    cost = np.add.reduceat(per_sample, off[:-1])
    step = np.arange(m) // (DP * k)
    rank = np.concatenate([_lpt(cost[a : a + DP * k], k) for a in range(0, m, DP * k)])
    return Layout(x[: off[-1]], off, step, rank, "packed")


def step_bound(lay, ideal_lens: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    """Sum over steps of max(heaviest sample, per-rank mean), over the ideal."""
    cfg = PlanConfig(max_tokens=2**31 - 1, cost="flops", model_preset=MODEL).resolved()
    c = sample_cost(lay.lens, cfg.cost_model())
    sstep = np.repeat(lay.step, np.diff(lay.offsets))
    steps = int(lay.step.max()) + 1
    top = np.zeros(steps)
    np.maximum.at(top, sstep, c)
    mean = np.bincount(sstep, weights=c, minlength=steps) / DP
    return float(np.maximum(top, mean).sum()) / (float(c.sum()) / DP)


def balance(n: int) -> None:
    from bench_plan import score, varpack_layout

    print(
        f"\n(b2) shuffled balance: dp {DP}, flops cost of {MODEL}, window 8; "
        "time = sum of slowest rank per step / ideal"
    )
    for name, (lens, budget) in datasets(n).items():
        q50, q90, q99 = np.percentile(lens, [50, 90, 99])
        print(
            f"\n{name}: {len(lens):,} samples, p50 {q50:.0f}, p90 {q90:.0f}, p99 {q99:.0f}, "
            f"{100 * (lens >= budget).mean():.2f}% at the budget {budget}"
        )
        print(
            f"{'strategy':<28} {'K':>3} {'padding':>8} {'time/ideal':>10} {'imb max':>8} "
            f"{'mixing':>7} {'bound':>6}"
        )
        for k in GRAD_ACCUM:
            rows = [
                ("yardstick (shuffle + LPT)", yardstick(lens, budget, k, np.random.default_rng(1))),
                (
                    "varpack --compose tokens",
                    varpack_layout(
                        lens, max_tokens=budget, grad_accum=k, order="shuffle", compose="tokens"
                    ),
                ),
                (
                    "varpack --compose cost",
                    varpack_layout(lens, max_tokens=budget, grad_accum=k, order="shuffle"),
                ),
                ("varpack curriculum", varpack_layout(lens, max_tokens=budget, grad_accum=k)),
            ]
            for label, lay in rows:
                s = score(lay, lens)
                bound = f"{step_bound(lay, lens):>6.3f}" if "cost" in label else f"{'':>6}"
                print(
                    f"{label:<28} {k:>3} {100 * s['padding']:>7.2f}% {s['time']:>10.3f} "
                    f"{s['imb_max']:>8.3f} {s['mixing']:>7.3f} {bound}"
                )
