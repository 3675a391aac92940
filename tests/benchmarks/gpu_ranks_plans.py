"""The plans ``bench_gpu_ranks.py`` runs, as one schedule type, and its scorer of a schedule.

Length shapes (scaled to the budget; at 16 K they are the shapes named below):

* **long-SFT tail**: ``plan_balance.sft_tail`` (99.89 % log-normal chat samples, median 450
  tokens, sigma 0.9; 0.11 % in 75-100 % of the budget);
* **RL rollouts**: prompt + response, prompts log-normal (median 400, sigma 0.6, at most 2 K),
  responses log-normal (sigma 1) with a median that puts 25 % of them at the 8 K generation cap.

Plans (dp 8 and the budget of the run; packed, pad multiple 64):

* varpack (``PlanConfig`` + ``plan_arrays``, ``--cost flops`` of the reference model): shuffled at
  grad-accum 1 and 4, under each ``--sync`` model where ``PlanConfig`` has that field (otherwise
  one row each, today's step balance), and curriculum at grad-accum 4;
* **KK by tokens, as verl does** (built here): the shuffled stream cut into global batches of a
  fixed sample count (per rank about 0.9 x grad-accum x budget tokens, a multiple of dp); each
  batch split over the ranks by Karmarkar-Karp on tokens with equal sample counts; each rank's
  share split by Karmarkar-Karp into ``ceil(tokens / budget)`` micro-batches (the largest count of
  any rank, so every rank runs as many; a micro-batch may pass the budget), heaviest first;
* **sorted greedy packing** (DeepSpeed PR 7104's ``batch_by_seqlens``, built here): the samples
  sorted by length, packed greedily up to the budget, micro-batches dealt to the ranks in turn,
  grad-accum of them per rank and step.

:func:`sync_times` scores a schedule from the seconds of its micro-batches (measured or
predicted) under both synchronisation models: ``step`` (DDP with ``no_sync``: a step costs its
slowest rank's sum) and ``micro`` (FSDP / ZeRO-3: a step costs the sum over its micro-batch slots
of the slowest rank in each slot). It is the bench's own, independent of the planner's figures.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from plan_balance import sft_tail

from varpack.plan import PlanConfig, plan_arrays
from varpack.plan.models import ModelDims

PAD = 64  # pad multiple of every plan


@dataclass
class Schedule:
    """Micro-batch ``i`` holds ``lens[offsets[i]:offsets[i+1]]`` in a row of ``pad_to[i]``; it
    runs on ``rank[i]`` in ``step[i]`` as that rank's micro-batch number ``slot[i]``."""

    lens: np.ndarray
    offsets: np.ndarray
    pad_to: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    slot: np.ndarray

    def micro(self, i: int) -> np.ndarray:
        return self.lens[self.offsets[i] : self.offsets[i + 1]]

    @property
    def steps(self) -> int:
        return int(self.step.max()) + 1 if len(self.step) else 0

    def take(self, count: int) -> Schedule:
        """``count`` steps spread evenly over the schedule (renumbered 0..), in run order:
        rank by rank, each rank's micro-batches in slot order."""
        keep_steps = np.unique(np.linspace(0, self.steps - 1, min(count, self.steps)).round())
        where = np.flatnonzero(np.isin(self.step, keep_steps))
        where = where[np.lexsort((self.slot[where], self.rank[where], self.step[where]))]
        sizes = np.diff(self.offsets)[where]
        parts = [self.micro(int(i)) for i in where]
        return Schedule(np.concatenate(parts), np.concatenate(([0], np.cumsum(sizes))),
                        self.pad_to[where], np.searchsorted(keep_steps, self.step[where]),
                        self.rank[where], self.slot[where])  # fmt: skip


def sync_times(seconds: np.ndarray, s: Schedule, dp: int) -> dict[str, float]:
    """Time of the schedule under each synchronisation model, and its ideal (no rank waits):

    >>> s = Schedule(np.ones(4, int), np.arange(5), np.ones(4, int), np.zeros(4, int),
    ...              np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]))
    >>> sync_times(np.array([3.0, 1, 1, 3]), s, 2)
    {'step': 4.0, 'micro': 6.0, 'ideal': 4.0}
    """
    k = int(s.slot.max()) + 1
    per = np.zeros((s.steps, dp, k))
    np.add.at(per, (s.step, s.rank, s.slot), seconds)
    return {"step": float(per.sum(axis=2).max(axis=1).sum()),
            "micro": float(per.max(axis=1).sum()), "ideal": float(seconds.sum()) / dp}  # fmt: skip


# ------------------------------------------------------------------ shapes ---------------------


def long_sft(n: int, budget: int, seed: int) -> np.ndarray:
    """The long-SFT tail at 16 K, scaled to ``budget``."""
    x = sft_tail(n, np.random.default_rng(seed))
    return np.clip(np.rint(x * budget / 16384), 1, budget).astype(np.int64)


def rollouts(n: int, budget: int, seed: int) -> np.ndarray:
    """RL rollouts at 16 K (prompt + response, 25 % of responses at the 8 K cap), scaled."""
    rng = np.random.default_rng(seed)
    cap = 8192
    median = cap / np.exp(0.6745)  # P(response > cap) = 25 % with sigma 1
    prompt = np.minimum(rng.lognormal(np.log(400), 0.6, n), 2048)
    response = np.minimum(rng.lognormal(np.log(median), 1.0, n), cap)
    x = (prompt + response) * budget / 16384
    return np.clip(np.rint(x), 1, budget).astype(np.int64)


SHAPES = {"long-SFT tail": long_sft, "RL rollouts": rollouts}


# ------------------------------------------------------------------ plans ----------------------


def varpack_plans(lens: np.ndarray, budget: int, dp: int, dims: ModelDims) -> dict[str, Schedule]:
    """varpack's rows: shuffled grad-accum 1 and 4 (each ``--sync`` model where the config has
    one), curriculum grad-accum 4."""
    has_sync = "sync" in PlanConfig.__dataclass_fields__
    syncs: list[dict[str, object]] = [{"sync": "step"}, {"sync": "micro"}] if has_sync else [{}]
    specs: dict[str, dict[str, object]] = {}
    for k in (1, 4):
        for extra in syncs:
            tag = f", --sync {extra['sync']}" if extra else ""
            specs[f"varpack shuffled, ga {k}{tag}"] = {"grad_accum": k, "order": "shuffle", **extra}
    specs["varpack curriculum, ga 4"] = {"grad_accum": 4, "order": "curriculum"}
    return {name: varpack_plan(lens, budget, dp, dims, **kw) for name, kw in specs.items()}


def varpack_plan(lens: np.ndarray, budget: int, dp: int, dims: ModelDims, **kw: object) -> Schedule:
    """One varpack plan of ``lens`` (``PlanConfig`` options in ``kw``) as a schedule."""
    order = np.argsort(lens, kind="stable")
    cfg = PlanConfig(max_tokens=budget, dp=dp, cost="flops", hidden=dims.hidden,
                     kv_hidden=dims.kv_hidden, layers=dims.layers, pad_multiple=PAD,
                     **kw)  # type: ignore[arg-type]  # fmt: skip
    p = plan_arrays(np.arange(len(lens))[order], lens[order], cfg)
    return Schedule(p.lens[p.stream], p.offsets, p.micro.pad_to, p.step, p.rank, p.micro_index)


def _padded(tokens: np.ndarray) -> np.ndarray:
    return -(-np.asarray(tokens) // PAD) * PAD


def _assemble(micro: list[tuple[np.ndarray, int, int, int]]) -> Schedule:
    """A schedule from ``(lens, step, rank, slot)`` per micro-batch."""
    lens = [m[0] for m in micro]
    sizes = np.array([len(x) for x in lens])
    tokens = np.array([int(x.sum()) for x in lens])
    cols = np.array([m[1:] for m in micro]).T
    return Schedule(np.concatenate(lens), np.concatenate(([0], np.cumsum(sizes))),
                    _padded(tokens), cols[0], cols[1], cols[2])  # fmt: skip


def karmarkar_karp(values: np.ndarray, k: int, equal_size: bool) -> list[list[int]]:
    """k-way largest differencing (Karmarkar-Karp) of ``values``: index lists, heaviest first.

    With ``equal_size`` every part gets ``len(values) / k`` items (it must divide).

    >>> karmarkar_karp(np.array([8, 7, 6, 5, 4]), 2, False)
    [[1, 3, 4], [0, 2]]
    """
    order = np.argsort(values, kind="stable")
    start = [order[a : a + k] for a in range(0, len(order), k)] if equal_size else order[:, None]
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for n, group in enumerate(start):
        parts = [(float(values[i]), [int(i)]) for i in group] + [(0.0, [])] * (k - len(group))
        parts.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), n, parts))
    n = len(start)
    while len(heap) > 1:  # merge the two states of largest spread, heavy sets with light ones
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(a[i][0] + b[k - 1 - i][0], a[i][1] + b[k - 1 - i][1]) for i in range(k)]
        merged.sort(key=lambda p: -p[0])
        n += 1
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), n, merged))
    return [sorted(p[1]) for p in heap[0][2]]


def peer_kk(lens: np.ndarray, budget: int, dp: int, k: int, seed: int = 0) -> Schedule:
    """KK by tokens, as verl does (see the module doc)."""
    x = lens[np.random.default_rng(seed).permutation(len(lens))]
    per_batch = max(1, round(0.9 * k * budget / x.mean())) * dp
    micro: list[tuple[np.ndarray, int, int, int]] = []
    for step, a in enumerate(range(0, len(x) - per_batch + 1, per_batch)):
        batch = x[a : a + per_batch]
        shares = [batch[p] for p in karmarkar_karp(batch, dp, equal_size=True)]
        count = max(-(-int(s.sum()) // budget) for s in shares)
        for rank, share in enumerate(shares):
            parts = karmarkar_karp(share, min(count, len(share)), equal_size=False)
            for slot, p in enumerate(parts):
                micro.append((share[p], step, rank, slot))
    return _assemble(micro)


def peer_sorted_greedy(lens: np.ndarray, budget: int, dp: int, k: int) -> Schedule:
    """Sorted greedy packing (DeepSpeed PR 7104): see the module doc."""
    x = np.sort(lens)
    ends = []
    total = 0
    for i, v in enumerate(x.tolist()):  # next fit over the sorted lengths
        if total + v > budget and total:
            ends.append(i)
            total = 0
        total += v
    ends.append(len(x))
    bounds = np.array([0, *ends])
    m = ((len(bounds) - 1) // (dp * k)) * dp * k  # trailing micro-batches that fill no step
    micro = []
    for i in range(m):
        per_step, j = divmod(i, dp * k)
        micro.append((x[bounds[i] : bounds[i + 1]], per_step, j % dp, j // dp))
    return _assemble(micro)


def all_plans(lens: np.ndarray, budget: int, dp: int, dims: ModelDims) -> dict[str, Schedule]:
    """Every row's schedule for one length shape, in the table's order."""
    out = varpack_plans(lens, budget, dp, dims)
    out["peer: KK by tokens (verl), ga 4"] = peer_kk(lens, budget, dp, 4)
    out["peer: sorted greedy packing, ga 4"] = peer_sorted_greedy(lens, budget, dp, 4)
    return out
