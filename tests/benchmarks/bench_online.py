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
    ``short`` (cap 1 K, 64 samples a micro-batch). Planned and scored in Qwen2.5-0.5B's own
    FLOPs (``real_cost.py``). A plain baseline, ``lpt`` (costliest first into the least loaded
    of the fewest micro-batches that hold the step, cut into slots by cost), and two peers built
    here from their descriptions: ``kk`` (verl: each mini-batch's ranks by Karmarkar-Karp on tokens with equal
    counts, then each rank's micro-batches by KK into ceil(tokens / budget) parts, the count the
    most any rank needs, ordered heaviest in the middle) and ``roll`` (ROLL: each mini-batch
    sorted, dealt round robin to the ranks, cut under the budget with lengths rounded to 128,
    micro-batch counts evened by splitting the largest; scored packed, as varlen kernels run it,
    and ``roll-padded``, as its document pads a micro-batch: B rows of its longest sample rounded
    up to 128). The Karmarkar-Karp partition and the scorer are the benchmarks' own
    (``rl_peers.py``, shared with ``bench_plan.py``'s RL section, not varpack's code): a packed
    micro-batch costs its samples' FLOPs; time vs ideal under ``step`` sync (a step waits for its
    slowest rank's sum) and ``micro`` sync (each micro-batch slot waits for its slowest rank);
    micro-batches over the budget; micro-batches per rank per step. varpack is planned with the
    matching ``sync``, by the composer (``varpack-*``) and by the balance engine
    (``engine-*``, ``compose="engine"``); a peer is scored under both.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from statistics import NormalDist

import numpy as np
from real_cost import RealModel
from rl_peers import Micro, independent_times, karmarkar_karp, lpt_steps

from varpack.online import plan_batch

DP, BUDGET, STEPS = 8, 16384, 4
MODEL = "qwen2.5-0.5b"
DIMS = {"cost": "flops", "model": MODEL}  # planned in the model's own FLOPs ...
REAL = RealModel.of(MODEL)  # ... and scored by an independent count of them
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


def score(plan: Plan, lens: np.ndarray, dp: int, round_to: int = 0) -> dict[str, float]:
    """Time vs ideal under both sync models by the benchmarks' one independent scorer
    (``rl_peers.independent_times`` in Qwen2.5-0.5B's FLOPs, ``real_cost``; ``round_to``: scored as padded
    micro-batches of ``B x T`` rows, ``T`` the longest rounded up to it), micro-batches over the
    budget, micro-batches per rank per step; every sample checked to run exactly once."""
    mlens, pad_to, step, rank, index = [], [], [], [], []
    over, counts = 0, []
    for k, ranks in enumerate(plan):
        counts += [len(mbs) for mbs in ranks]
        for r, mbs in enumerate(ranks):
            for j, mb in enumerate(mbs):
                x = lens[mb]
                mlens.append(x)
                top = -(-int(x.max()) // round_to) * round_to if round_to else 0
                pad_to.append(top if round_to else int(x.sum()))
                step.append(k), rank.append(r), index.append(j)
                over += int(len(mb) > 1 and (len(mb) * top if round_to else x.sum()) > BUDGET)
    seen = np.sort(np.concatenate([mb for ranks in plan for mbs in ranks for mb in mbs]))
    assert np.array_equal(seen, np.arange(len(lens))), "a sample missing or twice"
    m = Micro(mlens, np.array(pad_to), bool(round_to), np.array(step), np.array(rank),
              np.array(index))  # fmt: skip
    return {**independent_times(m, dp, REAL), "over": over, "k": float(np.mean(counts)),
            "even": float(len(set(counts)) == 1)}  # fmt: skip


# --------------------------------------------------------------------------------- the peers ----


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
        parts = karmarkar_karp(lens[mb], dp, equal_size=len(mb) % dp == 0)
        shards = [mb[p] for p in parts]
        count = max(-(-int(lens[s].sum()) // budget) for s in shards)  # all-reduced: the max
        ranks = []
        for s in shards:
            mbs = [s[np.sort(p)] for p in karmarkar_karp(lens[s], count, False)]
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


def lpt_plan(lens: np.ndarray, dp: int, budget: int, steps: int, group: int = 1,
             seed: int = 0) -> Plan:  # fmt: skip
    """The plain baseline (:func:`rl_peers.lpt_steps`) on the bench's mini-batches."""
    return lpt_steps(lens, REAL.sample_cost(lens), mini_batches(len(lens), steps, group, seed),
                     dp, budget)  # fmt: skip


def varpack_plan(lens: np.ndarray, dp: int, budget: int, steps: int, group: int = 1,
                 seed: int = 0, sync: str = "micro", compose: str = "cost") -> Plan:  # fmt: skip
    plan = plan_batch(lens, dp=dp, max_tokens=budget, mini_batches=steps, sync=sync, seed=seed,
                      groups=group if group > 1 else None, compose=compose, **DIMS)  # fmt: skip
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
plan = plan_batch(lens, dp=8, max_tokens=16384, mini_batches=4, cost="flops",
                  model="qwen2.5-0.5b")
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

        for compose in ("cost", "engine"):

            def call(lens: np.ndarray = lens, compose: str = compose) -> None:
                plan = plan_batch(lens, dp=DP, max_tokens=BUDGET, mini_batches=STEPS,
                                  compose=compose, **DIMS)  # fmt: skip
                assert len(plan.steps) == STEPS  # the nested lists a rank reads, built too

            call()  # the first call: kernels loaded
            wall, cpu = _timed(call, repeat)
            k = plan_batch(lens, dp=DP, max_tokens=BUDGET, mini_batches=STEPS, compose=compose,
                           **DIMS).micro_per_step  # fmt: skip
            ok = "ok" if cpu <= TARGET_MS[n] else "OVER"
            print(f"{n:>8} {wall:>9.1f} {cpu:>8.1f} {TARGET_MS[n]:>8.0f}  {k:>4}  {ok} (cpu), "
                  f"{'ok' if wall <= TARGET_MS[n] else 'over'} (wall)  --compose {compose}")  # fmt: skip
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
          "of Qwen2.5-0.5B, planned by varpack and scored here (real_cost.py); time vs ideal "
          "under each sync model; K = micro-batches per rank and step, least = the fewest that "
          "hold a step, ceil(tokens / (dp x budget)), mean over steps")  # fmt: skip
    head = (
        f"{'shape':>6} {'method':>12} {'step':>10} {'micro':>10} {'over':>5} {'K':>6} {'least':>6} "
        f"{'cpu ms':>8}"
    )
    print(head)
    for shape, kw in SHAPES.items():
        group = kw.get("group", 1)
        lens = rollout(n, seed=1, group=group, cap=kw["cap"])
        rows = {}
        for name, fn in (("kk", kk_plan), ("roll", roll_plan), ("lpt", lpt_plan)):  # CPU, 1 call
            t = time.process_time()
            plan = fn(lens, DP, BUDGET, STEPS, group)
            took = time.process_time() - t
            rows[name] = (score(plan, lens, DP), took)
            if name == "roll":  # as its document pads them: B rows of the longest, rounded
                rows["roll-padded"] = (score(plan, lens, DP, round_to=128), took)
        for compose, label in (("cost", "varpack"), ("engine", "engine")):
            for sync in ("step", "micro"):
                plan = varpack_plan(lens, DP, BUDGET, STEPS, group, sync=sync, compose=compose)
                again = partial(varpack_plan, lens, DP, BUDGET, STEPS, group, sync=sync,
                                compose=compose)  # fmt: skip
                _, took = _timed(again, 3)
                rows[f"{label}-{sync}"] = (score(plan, lens, DP), took / 1e3)  # CPU, median of 3
        least = np.mean([-(-int(lens[m].sum()) // (DP * BUDGET))
                         for m in mini_batches(n, STEPS, group, 0)])  # fmt: skip
        for name, (s, took) in rows.items():
            print(f"{shape:>6} {name:>12} {s['step']:>10.6f} {s['micro']:>10.6f} {s['over']:>5} "
                  f"{s['k']:>6.1f} {least:>6.2f} {1e3 * took:>8.1f}")  # fmt: skip
        for label in ("varpack", "engine"):
            for model in ("step", "micro"):
                ours = rows[f"{label}-{model}"][0][model]
                best = min(v[0][model] for k, v in rows.items()
                           if not k.startswith(("varpack", "engine")))  # fmt: skip
                verdict = "ahead" if ours < best else "BEHIND"
                print(f"{'':>6} {model}: {label} {ours:.7f} vs best peer {best:.7f}: {verdict} "
                      f"(idle {100 * (ours - 1):.5f} % vs {100 * (best - 1):.5f} %)")  # fmt: skip


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
