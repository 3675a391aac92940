"""Is mixing <= 0.20 reachable at grad-accum 1 on RL rollouts without losing balance? A probe.

At grad-accum 1 a step is one slot of ``dp`` micro-batches, so balance wants micro-batches of
equal cost in a step, and the planner's cut sorts each window's micro-batches by cost: where
cost follows composition, a step then holds alike samples. On the RL-rollout set of
``plan_balance.py`` (dp 16, 16 K, a quarter of the samples at the generation cap) the planner's
plan mixes 0.27. This probe composes each window of the same shuffled stream differently, as a
reference (not a plan: no budget fill, windows or heavy-sample rules beyond the token budget):
longest-processing-time first over all of the window's micro-batches at once (as many as the
planner makes, each sample to the least loaded one with room), so that every micro-batch lands
near the window's mean cost whatever it holds; then its micro-batches are grouped into steps
three ways: sorted by cost (the planner's cut), sorted within buckets of ``delta`` of the mean
cost (random order inside a bucket), and at random. It prints time vs ideal and mixing of each
next to the planner's own plan::

    python tests/benchmarks/rollout_mixing_probe.py

Measured 2026-11-27 (this machine): planner 1.017 / 0.267; window LPT sorted 1.008 / 0.215,
buckets of 0.01 1.011 / 0.197, 0.02 1.014 / 0.179, 0.03 1.018 / 0.162, random 1.033 / 0.101.
So a composer that levels a whole window's micro-batches at once would meet both targets here;
on the other sets of ``plan_balance.py`` (no split) the same reference, cut sorted, runs
1.090-1.218, 0.06-0.11 slower than the planner. The planner now deals each window so too (with
its budget and window rules, :mod:`varpack.plan.kernels.lpt`) and keeps that deal where its
slots wait less, and cuts those windows' blocks in buckets of 4 % in a seeded order: planner
1.019 / 0.193 (the reference rows unchanged).
"""

from __future__ import annotations

import numpy as np
from plan_balance import MODEL, datasets, make

from varpack.plan import PlanConfig
from varpack.plan.cost import cost_coefficients
from varpack.plan.figures.stats import mixing

WINDOW = 8  # steps a window (the planner's default --shuffle-window)


def window_lpt(x: np.ndarray, nbins: int, budget: int, c: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each sample (costliest first) to the least loaded of ``nbins`` micro-batches with room."""
    load, tok, where = np.zeros(nbins), np.zeros(nbins), np.empty(len(x), dtype=np.int64)
    for i in np.argsort(-c, kind="stable"):
        room = np.flatnonzero(tok + x[i] <= budget)
        b = room[np.argmin(load[room])] if len(room) else int(np.argmin(tok))
        load[b] += c[i]
        tok[b] += x[i]
        where[i] = b
    return load, where


def probe(grouping: float | str, lens: np.ndarray, budget: int, dp: int, micro: int) -> str:
    cfg = PlanConfig(max_tokens=budget, dp=dp, cost="flops", model_preset=MODEL, order="shuffle")
    lin, quad = cost_coefficients(cfg.resolved().cost_model())
    cost = lin * lens + quad * lens.astype(float) ** 2
    per_win = len(lens) * WINDOW * dp // micro  # samples a window, as the planner's count
    rng = np.random.default_rng(1)
    perm = rng.permutation(len(lens))
    step_of, times, step = np.empty(len(lens), dtype=np.int64), [], 0
    for a in range(0, len(lens), per_win):
        idx = perm[a : a + per_win]
        nbins = max(dp, round(cost[idx].sum() / (cost.sum() / micro) / dp) * dp)
        load, where = window_lpt(lens[idx], nbins, budget, cost[idx])
        if grouping == "sorted":
            order = np.argsort(-load, kind="stable")
        elif grouping == "random":
            order = rng.permutation(nbins)
        else:
            key = np.floor(load / (float(grouping) * load.mean()))
            order = np.lexsort((rng.random(nbins), -key))
        new_step = np.empty(nbins, dtype=np.int64)
        new_step[order] = step + np.arange(nbins) // dp
        times.extend(load[order].reshape(-1, dp).max(axis=1))
        step_of[idx] = new_step[where]
        step += nbins // dp
    time = sum(times) * dp / cost.sum()
    return f"{time:.3f} / {mixing(step_of, lens, step):.3f}"


def main() -> None:
    lens, budget, dp, _, _ = datasets(False)["RL rollouts 60K, dp 16"]
    arrays, s = make(lens, budget, dp, grad_accum=1, sync="step")
    micro = len(arrays.offsets) - 1
    print(f"RL rollouts 60K, dp {dp}, grad-accum 1: time vs ideal / mixing")
    print(f"  planner                       {s['time_vs_ideal']:.3f} / {s['mixing']:.3f}")
    for g in ("sorted", 0.01, 0.02, 0.03, "random"):
        name = g if isinstance(g, str) else f"buckets of {g}"
        print(f"  window LPT, {name:<18} {probe(g, lens, budget, dp, micro)}")


if __name__ == "__main__":
    main()
