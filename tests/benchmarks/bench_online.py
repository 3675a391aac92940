"""Benchmark of ``varpack.online.plan_batch``: latency, and balance on rollout batches vs peers.

    python tests/benchmarks/bench_online.py [--quick] [--only latency|quality]

(a) Latency: ``plan_batch`` on rollout batches of 1 K, 8 K and 64 K samples (dp 8, budget 16 K,
    4 mini-batches, FLOPs cost of Qwen2.5-0.5B), the plan's ``steps`` built too: the median of 20
    calls after the first, wall clock and process CPU time (the machine is shared: CPU time is
    what the call itself costs), against the targets 5 / 30 / 250 ms; and the first call in a
    fresh process (numba's cached kernels loaded), apart from the import, against 1 s.
(b) Quality: rollout batches of 8,192 samples (prompt + response, a quarter of the responses cut
    at the generation cap), dp 8, budget 16 K, 4 mini-batches: ``rl`` (cap 4 K), ``grpo`` (512
    prompts x 16 responses, each group kept in one mini-batch), ``cap8k`` (cap 8 K) and
    ``short`` (cap 1 K, 64 samples a micro-batch). Two peers built here from their
    descriptions: ``kk`` (verl: each mini-batch's ranks by Karmarkar-Karp on tokens with equal
    counts, then each rank's micro-batches by KK into ceil(tokens / budget) parts, the count the
    most any rank needs, ordered heaviest in the middle) and ``roll`` (ROLL: each mini-batch
    sorted, dealt round robin to the ranks, cut under the budget with lengths rounded to 128,
    micro-batch counts evened by splitting the largest). All scored by one function of this file
    (not varpack's): a micro-batch costs its samples' FLOPs (packed, varlen attention); time vs
    ideal under ``step`` sync (a step waits for its slowest rank's sum) and ``micro`` sync (each
    micro-batch slot waits for its slowest rank); micro-batches over the budget; micro-batches
    per rank per step. varpack is planned with the matching ``sync``.
"""

from __future__ import annotations

import argparse
import heapq
import os
import subprocess
import sys
import time
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from varpack.online import plan_batch

DP, BUDGET, STEPS = 8, 16384, 4
H, KV, LAYERS = 896, 128, 24  # Qwen2.5-0.5B-like
DIMS = {"cost": "flops", "hidden": H, "kv_hidden": KV, "layers": LAYERS}
TARGET_MS = {1024: 5.0, 8192: 30.0, 65536: 250.0}
FIRST_TARGET_S = 1.0

Plan = list[list[list[np.ndarray]]]  # steps[k][r] -> micro-batches (indices into the lengths)


# ------------------------------------------------------------------ rollout batches, scoring ----


def rollout(
    n: int, seed: int = 0, group: int = 1, cap: int = 4096, capped: float = 0.25
) -> np.ndarray:
    """``n`` samples: a prompt (log-normal, median 300) + a response (log-normal, ``capped`` of
    them cut at ``cap``); ``group`` consecutive samples share their prompt."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(300), 0.6, -(-n // group)), 16, 2048).astype(np.int64)
    sigma = 0.9
    mu = np.log(cap) - NormalDist().inv_cdf(1 - capped) * sigma
    resp = np.clip(rng.lognormal(mu, sigma, n), 1, cap).astype(np.int64)
    return np.repeat(prompts, group)[:n] + resp


def flops(lens: np.ndarray) -> np.ndarray:
    s = np.asarray(lens, dtype=np.float64)
    return LAYERS * ((20.0 * H * H + 4.0 * H * KV) * s + 4.0 * H * s * s)


def score(plan: Plan, lens: np.ndarray, dp: int) -> dict[str, float]:
    """Time vs ideal under both sync models, micro-batches over the budget, per rank and step."""
    c = flops(lens)
    ideal = c.sum() / dp
    t_step = t_micro = 0.0
    over = 0
    counts = []
    for ranks in plan:
        loads = [[float(c[mb].sum()) for mb in ranks[r]] for r in range(dp)]
        k = len(loads[0])
        assert all(len(x) == k for x in loads), "ranks with unequal micro-batch counts"
        counts.append(k)
        t_step += max(sum(x) for x in loads)
        t_micro += sum(max(loads[r][j] for r in range(dp)) for j in range(k))
        over += sum(int(len(mb) > 1 and lens[mb].sum() > BUDGET) for mbs in ranks for mb in mbs)
    seen = np.sort(np.concatenate([mb for ranks in plan for mbs in ranks for mb in mbs]))
    assert np.array_equal(seen, np.arange(len(lens))), "a sample missing or twice"
    return {
        "step": t_step / ideal,
        "micro": t_micro / ideal,
        "over": over,
        "k": float(np.mean(counts)),
    }


# --------------------------------------------------------------------------------- the peers ----


def karmarkar_karp(weights: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing into ``k`` parts (Karmarkar-Karp): partial partitions merged two at a
    time from a heap, the pair with the largest spread first, largest set against smallest."""
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []

    def push(sets: list[tuple[int, list[int]]]) -> None:
        sets.sort(key=lambda s: (-s[0], -len(s[1])))
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), len(heap) + len(order), sets))

    if equal_size:
        for off in range(0, len(order), k):
            push([(weights[i], [i]) for i in order[off : off + k]])
    else:
        for i in order:
            push([(weights[i], [i])] + [(0, []) for _ in range(k - 1)])
    serial = 0
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        serial += 1
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda s: (-s[0], -len(s[1])))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), -serial, merged))
    return [sorted(s[1]) for s in heap[0][2]]


def mini_batches(n: int, steps: int, group: int, seed: int) -> list[np.ndarray]:
    """The PPO mini-batches: the batch shuffled (whole groups), split into equal parts."""
    groups = np.random.default_rng(seed).permutation(-(-n // group))
    parts = np.array_split(groups, steps)
    return [
        np.concatenate([np.arange(g * group, min((g + 1) * group, n)) for g in p]) for p in parts
    ]


def kk_plan(
    lens: np.ndarray, dp: int, budget: int, steps: int, group: int = 1, seed: int = 0
) -> Plan:
    """verl's dynamic batching with balanced ranks, by tokens."""
    plan = []
    for mb in mini_batches(len(lens), steps, group, seed):
        parts = karmarkar_karp(lens[mb].tolist(), dp, equal_size=len(mb) % dp == 0)
        shards = [mb[p] for p in parts]
        count = max(-(-int(lens[s].sum()) // budget) for s in shards)  # all-reduced: the max
        ranks = []
        for s in shards:
            mbs = [s[p] for p in karmarkar_karp(lens[s].tolist(), count, False)]
            mbs.sort(key=lambda x: (-int(lens[x].sum()), int(x[0])))
            ranks.append(mbs[::2][::-1] + mbs[1::2])  # light ones at both ends
        plan.append(ranks)
    return plan


def roll_plan(lens: np.ndarray, dp: int, budget: int, steps: int, group: int = 1, seed: int = 0,
              round_to: int = 128, pp: int = 1) -> Plan:  # fmt: skip
    """ROLL's dynamic batching: sorted, round robin to the ranks, budget cuts on rounded
    lengths, counts evened (to a multiple of pp) by splitting the micro-batch of most tokens."""
    plan = []
    for mb in mini_batches(len(lens), steps, group, seed):
        o = mb[np.argsort(lens[mb], kind="stable")]
        ranks = []
        for shard in (o[r::dp] for r in range(dp)):
            cuts: list[list[int]] = [[]]
            for i in shard:
                t = -(-int(lens[i]) // round_to) * round_to
                if cuts[-1] and (len(cuts[-1]) + 1) * t > budget:
                    cuts.append([])
                cuts[-1].append(int(i))
            ranks.append([np.array(c) for c in cuts])
        target = -(-max(len(x) for x in ranks) // pp) * pp
        for cuts in ranks:
            while len(cuts) < target:
                j = max((j for j in range(len(cuts)) if len(cuts[j]) > 1),
                        key=lambda j: int(lens[cuts[j]].sum()))  # fmt: skip
                a = cuts.pop(j)
                cuts[j:j] = [a[: len(a) // 2], a[len(a) // 2 :]]
        plan.append(ranks)
    return plan


def varpack_plan(lens: np.ndarray, dp: int, budget: int, steps: int, group: int = 1,
                 seed: int = 0, sync: str = "micro") -> Plan:  # fmt: skip
    plan = plan_batch(lens, dp=dp, max_tokens=budget, mini_batches=steps, sync=sync, seed=seed,
                      groups=group if group > 1 else None, **DIMS)  # fmt: skip
    return plan.steps


# ------------------------------------------------------------------------------------ runs ----


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``repeat`` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return 1e3 * float(np.median(wall)), 1e3 * float(np.median(cpu))


_FIRST = """
import time, sys
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
from varpack.online import plan_batch
t1, c1 = time.perf_counter(), time.process_time()
lens = np.load(sys.argv[1])
plan = plan_batch(lens, dp=8, max_tokens=16384, mini_batches=4, cost="flops", hidden=896,
                  kv_hidden=128, layers=24)
plan.steps
t2, c2 = time.perf_counter(), time.process_time()
print(t1 - t0, c1 - c0, t2 - t1, c2 - c1)
"""


def first_call(lens: np.ndarray, tmp: str) -> list[float]:
    path = os.path.join(tmp, "lens.npy")
    np.save(path, lens)
    out = subprocess.run([sys.executable, "-c", _FIRST, path], check=True, capture_output=True,
                         text=True)  # fmt: skip
    return [float(x) for x in out.stdout.split()]


def latency(quick: bool) -> None:
    import tempfile

    print(f"(a) latency: dp {DP}, budget {BUDGET}, {STEPS} mini-batches, flops cost, sync micro; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"{'samples':>8} {'wall ms':>9} {'cpu ms':>8} {'target':>8}  {'K':>4}")
    repeat = 5 if quick else 20
    for n in TARGET_MS:
        lens = rollout(n, seed=n)

        def call() -> None:
            plan_batch(lens, dp=DP, max_tokens=BUDGET, mini_batches=STEPS, **DIMS).steps

        call()  # the first call: kernels loaded
        wall, cpu = _timed(call, repeat)
        k = plan_batch(lens, dp=DP, max_tokens=BUDGET, mini_batches=STEPS, **DIMS).micro_per_step
        ok = "ok" if cpu <= TARGET_MS[n] else "OVER"
        print(f"{n:>8} {wall:>9.1f} {cpu:>8.1f} {TARGET_MS[n]:>8.0f}  {k:>4}  {ok} (cpu), "
              f"{'ok' if wall <= TARGET_MS[n] else 'over'} (wall)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        imp_w, imp_c, first_w, first_c = first_call(rollout(8192), tmp)
    print(f"fresh process, 8 K samples: import {imp_w:.2f} s (cpu {imp_c:.2f}), first call "
          f"{first_w:.2f} s (cpu {first_c:.2f}); target {FIRST_TARGET_S:.0f} s for the call")  # fmt: skip


SHAPES = {
    "rl": {"cap": 4096},
    "grpo": {"cap": 4096, "group": 16},
    "cap8k": {"cap": 8192},
    "short": {"cap": 1024},
}


def quality(quick: bool) -> None:
    n = 2048 if quick else 8192
    print(f"\n(b) balance: {n} samples, dp {DP}, budget {BUDGET}, {STEPS} mini-batches, FLOPs "
          "scored here (Qwen2.5-0.5B dims); time vs ideal under each sync model")  # fmt: skip
    head = f"{'shape':>6} {'method':>12} {'step':>10} {'micro':>10} {'over':>5} {'K':>6} {'ms':>8}"
    print(head)
    for shape, kw in SHAPES.items():
        group = kw.get("group", 1)
        lens = rollout(n, seed=1, group=group, cap=kw["cap"])
        rows = {}
        for name, fn in (("kk", kk_plan), ("roll", roll_plan)):
            t = time.perf_counter()
            rows[name] = (
                score(fn(lens, DP, BUDGET, STEPS, group), lens, DP),
                time.perf_counter() - t,
            )
        for sync in ("step", "micro"):
            t = time.perf_counter()
            plan = varpack_plan(lens, DP, BUDGET, STEPS, group, sync=sync)
            rows[f"varpack-{sync}"] = (score(plan, lens, DP), time.perf_counter() - t)
        for name, (s, took) in rows.items():
            print(f"{shape:>6} {name:>12} {s['step']:>10.6f} {s['micro']:>10.6f} {s['over']:>5} "
                  f"{s['k']:>6.1f} {1e3 * took:>8.1f}")  # fmt: skip
        for model in ("step", "micro"):
            ours = rows[f"varpack-{model}"][0][model]
            best = min(rows["kk"][0][model], rows["roll"][0][model])
            verdict = "ahead" if ours < best else "BEHIND"
            print(f"{'':>6} {model}: varpack {ours:.6f} vs best peer {best:.6f}: {verdict} "
                  f"(idle {100 * (ours - 1):.4f} % vs {100 * (best - 1):.4f} %)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("latency", "quality"))
    args = ap.parse_args()
    if args.only in (None, "latency"):
        latency(args.quick)
    if args.only in (None, "quality"):
        quality(args.quick)


if __name__ == "__main__":
    main()
