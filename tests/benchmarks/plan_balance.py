"""Shuffled balance across grad-accum and layouts: section (b2) of bench_plan.py (`--only balance`).

dp 8, budget 16K (bimodal: 128K; documents: 8K, split), flops cost of Qwen2.5-0.5B (hidden 896,
kv 128, 24 layers), shuffled order (window 8), grad-accum 1, 2, 4, 16, in the packed layout,
the padded layout and with ``--pp 4`` (packed; grad-accum 4 and 16, which ``--pp 4`` needs).
Sets:

* **long-SFT tail** (:func:`sft_tail`, our own generator of the Llama 3 SFT statistic): 99.89 %
  chat-like samples (log-normal, median 450 tokens, sigma 0.9: mean about 690, 82 % under 1K)
  and 0.11 % near the budget (uniform in 75–100 % of it); 400K samples, and 30K, where a window
  holds fewer long samples;
* bimodal (synth), heavy-bodied 10K and 30K (log-normal, median 450, sigma 1.45, capped);
* **real documents** (``data/doc_lengths.csv``: 11.6K files of four sources tokenized by a
  byte-level BPE, ``make_doc_lengths.py``), 8K budget, ``--oversize split``.

Every row is a real plan (``make_plan``) scored by plan.json's own stats: time vs ideal, the
per-plan lower bound (``time_vs_ideal_bound``: no composition of the plan's windows does
better), the fill given up (mean and max over steps, below the median step), mixing, padding.
The yardstick is a window + LPT strategy a trainer might write: each window of the shuffled
stream packed in stream order to the budget, its micro-batches dealt to its steps in a snake by
cost, and each step's micro-batches to ranks by LPT (same scoring).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, make_plan
from varpack.plan.kernels.order import snake

DP = 8
MODEL = "qwen2.5-0.5b"
GRAD_ACCUM = (1, 2, 4, 16)
DOCS = Path(__file__).parent / "data" / "doc_lengths.csv"


def sft_tail(n: int, rng: np.random.Generator, cap: int = 16384) -> np.ndarray:
    """The long-SFT tail: 99.89 % log-normal chat samples, 0.11 % in 75–100 % of ``cap``."""
    x = np.exp(rng.normal(np.log(450), 0.9, n))
    long = rng.random(n) < 0.0011
    x[long] = cap * (1 - 0.25 * rng.random(int(long.sum())))
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def heavy_bodied(n: int, rng: np.random.Generator, cap: int = 16384) -> np.ndarray:
    """Log-normal lengths, median 450, sigma 1.45, capped at ``cap`` (~0.6 % at the cap)."""
    return np.clip(np.rint(rng.lognormal(np.log(450), 1.45, n)), 1, cap).astype(np.int64)


def heavy_tail(n: int, rng: np.random.Generator, cap: int = 32768) -> np.ndarray:
    """Chat-like samples (log-normal, median 450, sigma 0.9) with 0.5 % at 20-32 K tokens."""
    x = np.exp(rng.normal(np.log(450), 0.9, n))
    long = rng.random(n) < 0.005
    x[long] = rng.uniform(20_000, 32_000, int(long.sum()))
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def rollouts(n: int, rng: np.random.Generator, cap: int = 8192) -> np.ndarray:
    """RL rollouts: a prompt (log-normal, median 350, sigma 0.7, 16-4096 tokens) and a response
    (log-normal, median 4200, sigma 1.0) cut at a ``cap``-token generation limit (25 % reach it)."""
    prompt = np.clip(np.rint(np.exp(rng.normal(np.log(350), 0.7, n))), 16, 4096)
    response = np.clip(np.rint(np.exp(rng.normal(np.log(4200), 1.0, n))), 1, cap)
    return (prompt + response).astype(np.int64)


def doc_lengths() -> np.ndarray:
    with DOCS.open() as f:
        return np.array([int(row["tokens"]) for row in csv.DictReader(f)], dtype=np.int64)


def datasets(quick: bool) -> dict[str, tuple[np.ndarray, int, dict[str, object]]]:
    big = 30_000 if quick else 400_000
    return {
        f"long-SFT tail {big // 1000}K": (sft_tail(big, np.random.default_rng(0)), 16384, {}),
        "long-SFT tail 30K": (sft_tail(30_000, np.random.default_rng(1)), 16384, {}),
        "bimodal 20K": (sample_lengths("bimodal", 20_000, np.random.default_rng(0)), 131072, {}),
        "heavy-bodied 10K": (heavy_bodied(10_000, np.random.default_rng(0)), 16384, {}),
        "heavy-bodied 30K": (heavy_bodied(30_000, np.random.default_rng(0)), 16384, {}),
        "documents 11.6K (split)": (doc_lengths(), 8192, {"oversize": "split"}),
    }


def plan_stats(lens: np.ndarray, budget: int, **kw: object) -> dict:  # type: ignore[type-arg]
    srt = np.sort(lens, kind="stable")
    cfg = PlanConfig(max_tokens=budget, dp=DP, cost="flops", model_preset=MODEL, order="shuffle",
                     **kw)  # type: ignore[arg-type]  # fmt: skip
    return make_plan(np.arange(len(srt)), srt, cfg)[1]["stats"]


def yardstick(lens: np.ndarray, budget: int, k: int, rng: np.random.Generator) -> float:
    """Window + LPT (see module doc): time vs ideal."""
    from bench_plan import Layout, _greedy_sorted, score

    x = lens[rng.permutation(len(lens))]
    x = x[x <= budget]
    off = _greedy_sorted(x, budget)
    cfg = PlanConfig(max_tokens=2**31 - 1, cost="flops", model_preset=MODEL).resolved()
    from varpack.plan.cost import sample_cost

    cost = np.add.reduceat(sample_cost(x, cfg.cost_model()), off[:-1])
    per_step, window = DP * k, 8 * DP * k
    m = (len(cost) // per_step) * per_step
    order, step = [], []
    for a in range(0, m, window):  # a window's micro-batches dealt to its steps by cost
        b = min(a + window, m)
        idx = a + np.argsort(-cost[a:b], kind="stable")
        steps = (b - a) // per_step
        order.append(idx)
        step.append(a // per_step + snake(np.arange(b - a), np.full(b - a, steps)))
    order_a, step_a = np.concatenate(order), np.concatenate(step)
    rank = np.empty(m, dtype=np.int64)
    for s in np.unique(step_a):  # each step's micro-batches to ranks by LPT
        mine = order_a[step_a == s]
        load = np.zeros(DP)
        fill = np.zeros(DP, dtype=np.int64)
        for i in mine[np.argsort(-cost[mine], kind="stable")]:
            open_ = np.flatnonzero(fill < k)
            r = open_[np.argmin(load[open_])]
            rank[i], load[r], fill[r] = r, load[r] + cost[i], fill[r] + 1
    pos = np.concatenate([np.arange(off[i], off[i + 1]) for i in order_a])
    new_off = np.concatenate(([0], np.cumsum(np.diff(off)[order_a])))
    lay = Layout(x[pos], new_off, step_a, rank[order_a], "packed")
    return score(lay, x)["time"]


def balance(n: int) -> None:
    quick = n < 400_000
    print(
        f"\n(b2) shuffled balance: dp {DP}, flops cost of {MODEL}, window 8; time = sum of the "
        "slowest rank per step / ideal; bound = no composition of the plan's windows does better; "
        "fill given up = mean / max below the median step"
    )
    head = (f"{'layout':<8} {'K':>3} {'time':>6} {'bound':>6} {'gap':>6} {'fill up':>12} "
            f"{'mixing':>7} {'padding':>8} {'yardstick':>10}")  # fmt: skip
    for name, (lens, budget, extra) in datasets(quick).items():
        q50, q99 = np.percentile(lens, [50, 99])
        print(f"\n{name}: {len(lens):,} samples, p50 {q50:.0f}, p99 {q99:.0f}, budget {budget:,}")
        print(head)
        for k in GRAD_ACCUM:
            yard = yardstick(lens, budget, k, np.random.default_rng(1))
            for layout, kw in (("packed", {}), ("padded", {"layout": "padded"}),
                               ("pp 4", {"pp": 4})):  # fmt: skip
                if layout == "pp 4" and k % 4:
                    continue
                s = plan_stats(lens, budget, grad_accum=k, **extra, **kw)
                f = s["fill_given_up"]
                print(
                    f"{layout:<8} {k:>3} {s['time_vs_ideal']:>6.3f} {s['time_vs_ideal_bound']:>6.3f} "
                    f"{s['time_vs_ideal'] - s['time_vs_ideal_bound']:>+6.3f} "
                    f"{100 * f['mean']:>5.1f}/{100 * f['max']:>5.1f}% {s['mixing']:>7.3f} "
                    f"{100 * s['padding_ratio']:>7.2f}% {yard:>10.3f}"
                )
