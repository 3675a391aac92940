"""RL rollout batches planned by peers and by varpack, scored by one independent function.

Section (b2') of ``bench_plan.py --only balance`` (:func:`rollout_table`). A rollout batch of
8,192 samples (``plan_balance.rollouts``: prompt + response, 25 % of responses cut at an 8 K
generation cap) trains as 4 mini-batches (optimizer steps) on dp 8 ranks, 16 K tokens a
micro-batch at most, FLOPs cost of Qwen2.5-0.5B. Planned three ways:

* **KK by tokens** (verl's and slime's dynamic batching, written here from its description):
  each mini-batch (a random quarter of the batch) is split over the ranks by Karmarkar-Karp
  (largest differencing) on tokens, equal sample counts (verl balances the whole batch over the
  ranks and cuts each rank's share into mini-batches after; balancing each mini-batch is the
  stronger peer); each rank's share into ``ceil(tokens / budget)`` micro-batches (the most over
  the ranks, as they agree on it) by Karmarkar-Karp on tokens, run largest first. A micro-batch may exceed the budget there (the
  partition balances sums, it does not bound them): counted, not refused.
* **ROLL** (its dynamic batching document, ``/work/shared/seeds``): each mini-batch sorted by
  length and dealt round robin to the ranks, each rank's share cut in order into padded
  micro-batches of at most 16 K tokens, lengths rounded up to 128; ranks may hold different
  numbers of micro-batches.
* **varpack**: each batch planned alone (as an RL loop would, in memory), shuffled, one window of
  4 steps (``--shuffle-window 4``), grad-accum chosen so that the batch makes about 4 steps,
  ``--sync step`` and ``--sync micro``.

:func:`independent_times` scores every plan from its micro-batches alone (lengths, shape, step,
rank, place in the rank's step): time under ``step`` (each step's slowest rank's sum) and
``micro`` (each slot's slowest rank, summed) over the ideal (the samples' cost over dp), each
micro-batch priced by a cost written outside varpack: the table's, Qwen2.5-0.5B's own FLOPs
(:mod:`real_cost`, what ``--model-preset qwen2.5-0.5b`` balances); without a model (as
``bench_online.py`` calls it), Skrull's estimate of its dimensions (:func:`flops`).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np
from real_cost import RealModel

HIDDEN, KV_HIDDEN, LAYERS = 896, 128, 24  # Qwen2.5-0.5B
DP, BUDGET, BATCH, MINI = 8, 16384, 8192, 4


def flops(x: np.ndarray | float) -> np.ndarray:
    """Skrull's estimate of one sequence of ``x`` tokens, all layers (written here, not imported)."""
    x = np.asarray(x, dtype=np.float64)
    h, kv = float(HIDDEN), float(KV_HIDDEN)
    return LAYERS * (20 * h * h * x + 4 * h * kv * x + 4 * h * x * x)


@dataclass
class Micro:
    """A plan's micro-batches: each one's samples' lengths, its shape and where it runs."""

    lens: list[np.ndarray]
    pad_to: np.ndarray  # the padded length (padded: of every row; packed: the total)
    padded: bool
    step: np.ndarray
    rank: np.ndarray
    index: np.ndarray  # place among its rank's micro-batches of the step


def independent_times(m: Micro, dp: int, model: RealModel | None = None) -> dict[str, float]:
    """``{"step": .., "micro": ..}``: time over the ideal under each synchronisation model;
    ``model``: priced by that real model's FLOPs (``real_cost``), else by Skrull's estimate."""
    cost_of = flops if model is None else model.sample_cost
    real = np.array([cost_of(x).sum() for x in m.lens])
    if m.padded:
        cost = np.array([len(x) for x in m.lens]) * cost_of(m.pad_to)
    else:  # pad tokens of a packed row cost their linear part
        pad = m.pad_to - np.array([x.sum() for x in m.lens])
        linear = (
            LAYERS * (20 * HIDDEN**2 + 4 * HIDDEN * KV_HIDDEN) if model is None else model.pad_cost
        )
        cost = real + linear * pad
    ideal = real.sum() / dp
    steps, slots = int(m.step.max()) + 1, int(m.index.max()) + 1
    by_rank = np.zeros((steps, dp))
    np.add.at(by_rank, (m.step, m.rank), cost)
    by_slot = np.zeros((steps, slots, dp))
    np.add.at(by_slot, (m.step, m.index, m.rank), cost)
    return {
        "step": float(by_rank.max(axis=1).sum()) / ideal,
        "micro": float(by_slot.max(axis=2).sum()) / ideal,
    }


def lpt_steps(lens: np.ndarray, cost: np.ndarray, steps: list[np.ndarray], dp: int,
              budget: int) -> list[list[list[np.ndarray]]]:  # fmt: skip
    """The plain baseline a new user writes (``bench_online.py``, and the engine's tests on its
    own steps): each step's samples (``steps``: indices into ``lens``), costliest first, each
    into the least loaded (by ``cost``) of the fewest micro-batches that hold its tokens,
    ``ceil(tokens / (dp x budget))`` per rank (one more a rank while some sample finds no room;
    a sample over the budget takes an empty one), then those micro-batches cut into slots of
    ``dp`` by cost and each slot's dealt to the ranks lightest first against their sums
    (longest-processing-time throughout). ``[step][rank]`` -> micro-batches."""
    plan = []
    for mb in steps:
        x, c = lens[mb], cost[mb]
        order = np.argsort(-c, kind="stable")
        k = max(1, -(-int(x.sum()) // (dp * budget)))
        while True:
            load, tok = np.zeros(dp * k), np.zeros(dp * k, dtype=np.int64)
            where = np.full(len(mb), -1)
            for i in order:
                room = np.flatnonzero((tok + x[i] <= budget) | (tok == 0))
                if not len(room):
                    break
                b = room[np.argmin(load[room])]
                where[i], load[b], tok[b] = b, load[b] + c[i], tok[b] + x[i]
            if (where >= 0).all() and (tok > 0).all():
                break
            k += 1
        bins = [mb[where == b] for b in range(dp * k)]
        ranks: list[list[np.ndarray]] = [[] for _ in range(dp)]
        sums = np.zeros(dp)
        for slot in np.argsort(-load, kind="stable").reshape(k, dp):
            for b, r in zip(slot, np.argsort(sums, kind="stable"), strict=True):
                ranks[r].append(bins[b])
                sums[r] += load[b]
        plan.append(ranks)
    return plan


def karmarkar_karp(values: np.ndarray, k: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing into ``k`` sets (sums balanced; ``equal_size``: as many items each),
    largest set first."""
    order = np.argsort(values, kind="stable")
    tie = itertools.count()
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []

    def push(sets: list[tuple[float, list[int]]]) -> None:
        sets.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), next(tie), sets))

    if equal_size:
        for a in range(0, len(order), k):
            push([(float(values[i]), [int(i)]) for i in order[a : a + k]])
    else:
        for i in order:
            push([(float(values[i]), [int(i)])] + [(0.0, []) for _ in range(k - 1)])
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)  # the largest set of one meets the smallest of the other
        push([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, b[::-1], strict=True)])
    return [items for _, items in heap[0][2]]


def kk_batch(x: np.ndarray, rng: np.random.Generator) -> Micro:
    """One rollout batch planned as verl does (see module doc)."""
    lens, pad_to, step, rank, index = [], [], [], [], []
    for mb, mini in enumerate(np.array_split(rng.permutation(len(x)), MINI)):
        parts = [mini[sorted(p)] for p in karmarkar_karp(x[mini], DP, equal_size=True)]
        count = max(-(-int(x[p].sum()) // BUDGET) for p in parts)
        for r, p in enumerate(parts):
            for j, part in enumerate(karmarkar_karp(x[p], count, equal_size=False)):
                sel = x[p][part]
                lens.append(sel)
                pad_to.append(int(sel.sum()))
                step.append(mb), rank.append(r), index.append(j)
    return Micro(lens, np.array(pad_to), False, np.array(step), np.array(rank), np.array(index))


def roll_batch(x: np.ndarray, rng: np.random.Generator) -> Micro:
    """One rollout batch planned as ROLL's dynamic batching does (see module doc)."""
    lens, pad_to, step, rank, index = [], [], [], [], []
    for mb, part in enumerate(np.array_split(x[rng.permutation(len(x))], MINI)):
        srt = np.sort(part)
        for r in range(DP):
            shard, j, a = srt[r::DP], 0, 0
            while a < len(shard):
                b = a + 1
                while b < len(shard) and (b - a + 1) * -(-int(shard[b]) // 128) * 128 <= BUDGET:
                    b += 1
                lens.append(shard[a:b])
                pad_to.append(-(-int(shard[b - 1]) // 128) * 128)
                step.append(mb), rank.append(r), index.append(j)
                a, j = b, j + 1
    return Micro(lens, np.array(pad_to), True, np.array(step), np.array(rank), np.array(index))


def varpack_batch(x: np.ndarray, sync: str, seed: int) -> Micro:
    """One rollout batch planned by varpack in memory (see module doc)."""
    from varpack.plan import PlanConfig, plan_arrays

    srt = np.sort(x, kind="stable")
    k = max(1, round(x.sum() / (MINI * DP * BUDGET * 0.95)))
    cfg = PlanConfig(max_tokens=BUDGET, dp=DP, grad_accum=k, cost="flops",
                     model_preset="qwen2.5-0.5b", order="shuffle", shuffle_window=MINI,
                     sync=sync, seed=seed)  # fmt: skip
    p = plan_arrays(np.arange(len(srt)), srt, cfg)
    sl = p.lens[p.stream] if p.stream_lens is None else p.stream_lens
    lens = np.split(sl, p.offsets[1:-1])
    return Micro(lens, p.micro.pad_to, False, p.step, p.rank, p.micro_index)


def rollout_table(batches: int, quick: bool) -> None:
    from plan_balance import rollouts

    print(
        f"\n(b2') RL rollouts: {batches} batches of {BATCH:,} samples, {MINI} mini-batches (steps) "
        f"each, dp {DP}, budget {BUDGET:,}, flops cost of Qwen2.5-0.5B; time / ideal by one "
        "independent scorer (real_cost.py: the model's own FLOPs)"
    )
    real = RealModel.of("qwen2.5-0.5b")
    print(f"{'plan':<28} {'step sync':>10} {'micro sync':>11} {'over budget':>12}")
    rng = np.random.default_rng(0)
    data = [rollouts(BATCH, np.random.default_rng(100 + b)) for b in range(batches)]
    del quick
    plans = {
        "KK by tokens (verl, slime)": lambda x, b: kk_batch(x, rng),
        "ROLL sort + round robin": lambda x, b: roll_batch(x, rng),
        "varpack --sync step": lambda x, b: varpack_batch(x, "step", b),
        "varpack --sync micro": lambda x, b: varpack_batch(x, "micro", b),
    }
    for name, make in plans.items():
        parts = [make(x, b) for b, x in enumerate(data)]
        first = np.cumsum([0] + [int(m.step.max()) + 1 for m in parts])
        m = Micro(
            [x for p in parts for x in p.lens],
            np.concatenate([p.pad_to for p in parts]),
            parts[0].padded,
            np.concatenate([p.step + f for p, f in zip(parts, first, strict=False)]),
            np.concatenate([p.rank for p in parts]),
            np.concatenate([p.index for p in parts]),
        )
        t = independent_times(m, DP, real)
        rows = np.array([len(v) for v in m.lens])
        over = int(((rows * m.pad_to if m.padded else m.pad_to) > BUDGET).sum())
        print(f"{name:<28} {t['step']:>10.3f} {t['micro']:>11.3f} {over:>12,}")
