"""Shuffled balance, section (b2) of bench_plan.py (``--only balance``), in the real models' cost.

**(b2)** :func:`balance`: plans made with ``--cost flops`` for real models (:data:`MODELS`, or
``--model NAME_OR_CONFIG``: a preset's name or a Hugging Face config.json), ``--order shuffle``
(window 8), packed, at grad-accum 1, 2, 4, 16 (dp 16 and 32: 1, 2, 4, 8), each made for
``--sync step`` and for ``--sync micro`` (at grad-accum 1 they are one plan), on three sets
(:func:`real_sets`):

* **long-SFT tail** (:func:`sft_tail`, our own generator of the Llama 3 SFT statistic): 99.89 %
  chat-like samples (log-normal, median 450 tokens, sigma 0.9: mean about 690, 82 % under 1K)
  and 0.11 % near the budget (uniform in 75–100 % of it); 400K samples, budget 16K, dp 8;
* **heavy tail** (:func:`heavy_tail`): chat-like samples with 0.5 % at 20–32K, budget 32K,
  dp 32, 200K samples;
* **RL rollouts** (:func:`rollouts`): prompt + response, 25 % of responses cut at an 8K
  generation cap, budget 16K, dp 16, 60K samples.

Every plan is scored by :mod:`real_cost` (each sample's training FLOPs counted from the model's
config fields, not by varpack's cost code; pad tokens cost their matmuls) under the plan's own
synchronisation model and the other one, checked against plan.json's own figures, and set
beside the same data balanced by the old formula (Skrull's, ``--hidden --kv-hidden --layers``
of the same model), scored by the formula and by the model. *mb* is the plan's micro-batches per
rank and step against the fewest that hold each step under the budget. The targets: grad-accum
>= 4 at most 1.01x; grad-accum 1 at most 1.05x and no slower than the old formula's plan.
``--quick``: 30K, 50K and 20K samples.

**(b2')** RL rollout batches planned by peers (Karmarkar-Karp by tokens, ROLL) and by varpack
(:func:`rl_peers.rollout_table`), scored by Qwen2.5-0.5B's FLOPs.

**(b2'')** :func:`layouts`, run before (b2') and not with ``--model``: the flops cost of
Qwen2.5-0.5B on more sets, in the packed layout, the padded layout and with ``--pp 4``
(packed, ``--sync step``; grad-accum 4 and 16, which ``--pp 4`` needs), budget 16K (bimodal: 128K; documents: 8K, split; heavy tail:
32K), dp 8 (heavy tail: 32, RL rollouts: 16). Sets beside the three above: the long-SFT tail at
30K (a window holds fewer long samples); bimodal (synth), heavy-bodied 10K and 30K (log-normal,
median 450, sigma 1.45, capped); **real documents** (``data/doc_lengths.csv``: 11.6K files of
four sources tokenized by a byte-level BPE, ``make_doc_lengths.py``), 8K budget, ``--oversize
split``. Every row is a real plan (``make_plan``) scored by plan.json's own stats under the
plan's model: time vs ideal, the per-plan lower bound (``time_vs_ideal_bound``: no composition
of the plan's windows does better), the fill given up (mean and max over steps, below the
median step), mixing, padding; *other* is its time under the other model, and *check*
recomputes both times with :mod:`real_cost`.

To run a part, set (comma-separated) ``VARPACK_BALANCE_SETS`` (words the set's name starts
with, e.g. ``heavy tail,bimodal``), ``VARPACK_BALANCE_K`` (grad-accums, e.g. ``1``) and, for
(b2''), ``VARPACK_BALANCE_LAYOUTS`` (``packed,padded``); with the first two set (b2') is skipped.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, make_plan

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


Set = tuple[np.ndarray, int, int, dict[str, object], tuple[int, ...]]


def datasets(quick: bool) -> dict[str, Set]:
    """name -> (lengths, budget, dp, extra options, grad-accums)."""
    big = 30_000 if quick else 400_000
    dp8 = GRAD_ACCUM
    return {
        f"long-SFT tail {big // 1000}K": (sft_tail(big, np.random.default_rng(0)), 16384, DP, {},
                                          dp8),
        "long-SFT tail 30K": (sft_tail(30_000, np.random.default_rng(1)), 16384, DP, {}, dp8),
        "bimodal 20K": (sample_lengths("bimodal", 20_000, np.random.default_rng(0)), 131072, DP,
                        {}, dp8),
        "heavy-bodied 10K": (heavy_bodied(10_000, np.random.default_rng(0)), 16384, DP, {}, dp8),
        "heavy-bodied 30K": (heavy_bodied(30_000, np.random.default_rng(0)), 16384, DP, {}, dp8),
        "documents 11.6K (split)": (doc_lengths(), 8192, DP, {"oversize": "split"}, dp8),
        "heavy tail 200K, dp 32": (heavy_tail(200_000, np.random.default_rng(0)), 32768, 32, {},
                                   (1, 2, 4, 8)),
        "RL rollouts 60K, dp 16": (rollouts(60_000, np.random.default_rng(0)), 16384, 16, {},
                                   (1, 2, 4, 8)),
    }  # fmt: skip


def make(lens: np.ndarray, budget: int, dp: int, **kw: object) -> tuple:  # type: ignore[type-arg]
    srt = np.sort(lens, kind="stable")
    cfg = PlanConfig(max_tokens=budget, dp=dp, cost="flops", model_preset=MODEL, order="shuffle",
                     **kw)  # type: ignore[arg-type]  # fmt: skip
    arrays, meta, _ = make_plan(np.arange(len(srt)), srt, cfg)
    return arrays, meta["stats"]


def checked(arrays: object, stats: dict, model: str = MODEL) -> str:  # type: ignore[type-arg]
    """The plan's times scored again by the independent scorer of :mod:`real_cost` (the
    model's FLOPs from its config fields): ``ok`` when both synchronisation models agree with
    plan.json's figures (to 1e-6)."""
    from real_cost import RealModel, times

    got = times(arrays, RealModel.of(model))
    want = stats["time_vs_ideal_by_sync"]
    return "ok" if all(abs(got[k] - want[k]) < 1e-6 * want[k] for k in got) else f"{got}"


def trained_lengths(p: object) -> np.ndarray:
    """The lengths of the samples a plan trains, in its order (split pieces as pieces)."""
    return p.lens[p.stream] if p.stream_lens is None else p.stream_lens  # type: ignore[attr-defined]


def shuffle_mixing(arrays: object) -> float:
    """Mixing of the plan's steps refilled by a plain random shuffle (each step keeps its
    number of samples): the floor of sampling noise a step of that many samples has, so a
    plan's mixing reads against it (documents at grad-accum 1: 17 samples a step, 0.21)."""
    from varpack.plan.figures.stats import mixing

    p = arrays
    sl = trained_lengths(p)
    per = np.diff(p.offsets)  # type: ignore[attr-defined]
    step = np.repeat(np.asarray(p.step), per)  # type: ignore[attr-defined]
    return mixing(step, np.random.default_rng(0).permutation(sl), int(step.max()) + 1)


def band_floor_mixing(lens: np.ndarray, budget: int, dp: int, k: int, slot: int = 1) -> float:
    """The best mixing a padded plan can have at its padding: every sample sorted, cut into
    micro-batches of at most ``budget`` padded tokens (the least padding: sorted packing's),
    in units of ``slot`` neighbours, and steps of ``k * dp / slot`` units taken stratified
    (step ``s`` gets units ``s``, ``s + P``, ``s + 2P`` ...: every step spans every band).

    A padded micro-batch holds samples of one length range, and a short range holds many more
    samples than a long one, so a step of few micro-batches cannot look like the dataset
    (long-SFT tail: 0.33 at grad-accum 1, 0.22 at 2, 0.14 at 4). Under ``--sync micro`` a slot
    balances when its ``dp`` micro-batches cost alike, i.e. hold one length range (``slot``
    ``dp``): a step then spans ``k`` ranges (long-SFT tail: 0.64 at grad-accum 2, 0.47 at 4;
    a plan's slots, of neighbouring bands of a window, can come a little under it)."""
    from varpack.plan.figures.stats import mixing

    x = np.sort(lens)
    ends, i = [], 0
    while i < len(x):  # the most samples from i whose padded size fits the budget
        j = int(np.searchsorted(x[i:] * np.arange(1, len(x) - i + 1), budget, side="right"))
        i += max(j, 1)
        ends.append(i)
    count = np.diff(np.array([0, *ends]))
    steps = len(count) // (k * dp)
    used = steps * k * dp
    step = np.repeat(np.arange(used) // slot % steps, count[:used])
    return mixing(step, x[: len(step)], steps)


def _only(var: str) -> list[str] | None:
    """The comma-separated values of environment variable ``var`` (None: unset)."""
    value = os.environ.get(var)
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def layouts(n: int) -> None:
    quick = n < 400_000
    sets, ks_only, only_layouts = (_only(f"VARPACK_BALANCE_{v}") for v in ("SETS", "K", "LAYOUTS"))
    print(
        f"\n(b2'') shuffled balance by layout: flops cost of {MODEL}, window 8; each plan balanced for --sync "
        "step (ranks meet once a step: DDP, Megatron) or micro (at every micro-batch: FSDP, "
        "ZeRO-3), scored under its own model: time / ideal, bound (no composition of the plan's "
        "windows does better under that model), gap; 'other' = its time under the other model; "
        "fill given up = mean / max below the median step; floor = packed: the mixing of the same "
        "steps refilled by a plain random shuffle (the sampling floor of steps that size), "
        "padded: the best mixing of steps of sorted padded micro-batches taken stratified "
        "(band_floor_mixing: one length range a micro-batch; under micro, one a slot); "
        "check = both "
        "times recomputed by an independent scorer (real_cost.times)"
    )
    head = (f"{'layout':<7} {'K':>3} {'sync':<5} {'time':>6} {'bound':>6} {'gap':>6} {'other':>6} "
            f"{'fill up':>12} {'mixing':>7} {'floor':>6} {'padding':>8} {'check':>6}")  # fmt: skip
    for name, (lens, budget, dp, extra, ks) in datasets(quick).items():
        if sets is not None and not any(name.startswith(w) for w in sets):
            continue
        q50, q99 = np.percentile(lens, [50, 99])
        print(f"\n{name}: {len(lens):,} samples, p50 {q50:.0f}, p99 {q99:.0f}, budget {budget:,}, "
              f"dp {dp}")  # fmt: skip
        print(head)
        for k in ks if ks_only is None else [k for k in ks if str(k) in ks_only]:
            for layout, kw in (
                ("packed", {}),
                ("padded", {"layout": "padded"}),
                ("pp 4", {"pp": 4}),
            ):
                if (
                    layout == "pp 4"
                    and k % 4
                    or only_layouts is not None
                    and layout not in only_layouts
                ):
                    continue
                syncs = ["step"] if layout == "pp 4" else ["step", "micro"] if k > 1 else ["step"]
                for sync in syncs:
                    arrays, s = make(lens, budget, dp, grad_accum=k, sync=sync, **extra, **kw)
                    f = s["fill_given_up"]
                    both = s["time_vs_ideal_by_sync"]
                    other = both["micro" if sync == "step" else "step"]
                    slot = dp if sync == "micro" and k > 1 else 1
                    floor = (band_floor_mixing(trained_lengths(arrays), budget, dp, k, slot) if layout == "padded"
                             else shuffle_mixing(arrays))  # fmt: skip
                    print(
                        f"{layout:<7} {k:>3} {sync if k > 1 else 'both':<5} "
                        f"{s['time_vs_ideal']:>6.3f} {s['time_vs_ideal_bound']:>6.3f} "
                        f"{s['time_vs_ideal'] - s['time_vs_ideal_bound']:>+6.3f} {other:>6.3f} "
                        f"{100 * f['mean']:>5.1f}/{100 * f['max']:>5.1f}% {s['mixing']:>7.3f} "
                        f"{floor:>6.3f} "
                        f"{100 * s['padding_ratio']:>7.2f}% {checked(arrays, s):>6}"
                    )


# ------------------------------------------------ (b2) the real models' cost ---------------------

#: the models ``--only balance`` plans for: a small one, two 7B-class ones (Mistral's 4 K window
#: on every layer) and Gemma-2 (a 4 K window on every other layer)
MODELS = ("qwen2.5-0.5b", "qwen2.5-7b", "mistral-7b-v0.1", "gemma-2-2b")


def real_sets(quick: bool) -> dict[str, Set]:
    """name -> (lengths, budget, dp, extra options, grad-accums) of the real-model table."""
    sft, heavy, rl = (30_000, 50_000, 20_000) if quick else (400_000, 200_000, 60_000)
    return {
        f"long-SFT tail {sft // 1000}K, 16K, dp 8": (
            sft_tail(sft, np.random.default_rng(0)), 16384, DP, {}, GRAD_ACCUM),
        f"heavy tail {heavy // 1000}K, 32K, dp 32": (
            heavy_tail(heavy, np.random.default_rng(0)), 32768, 32, {}, (1, 2, 4, 8)),
        f"RL rollouts {rl // 1000}K, 16K, dp 16": (
            rollouts(rl, np.random.default_rng(0)), 16384, 16, {}, (1, 2, 4, 8)),
    }  # fmt: skip


def model_options(name: str, real: object) -> tuple[dict[str, object], dict[str, object]]:
    """PlanConfig options of the model (a preset's name, or a config.json's fields) and of
    the old formula with the same model's dimensions (``--hidden --kv-hidden --layers``)."""
    from real_cost import load

    from varpack.plan.models.presets import PRESET_CONFIGS

    key, fields = load(name)
    model: dict[str, object] = {"model_preset": key} if key in PRESET_CONFIGS else {"model": fields}
    dims = {"hidden": real.hidden, "kv_hidden": real.kv_dim, "layers": real.layers}  # type: ignore[attr-defined]
    return model, dims


def fewest(arrays: object, budget: int) -> tuple[float, float]:
    """Micro-batches per rank and step (mean) and the fewest that hold each step's tokens
    under the budget, ``ceil(step tokens / (dp x budget))`` (mean over steps)."""
    p = arrays
    dp = p.cfg.dp  # type: ignore[attr-defined]
    per = len(p.offsets) - 1  # type: ignore[attr-defined]
    steps = p.num_steps  # type: ignore[attr-defined]
    least = -(-np.asarray(p.step_tokens, dtype=np.int64) // (dp * budget))  # type: ignore[attr-defined]
    return per / (steps * dp), float(least.mean())


def target(k: int, real: float, old: float) -> str:
    """The balance targets: grad-accum >= 4 at most 1.01x under the plan's sync; grad-accum 1
    at most 1.05x and no slower than the same data balanced by the old formula."""
    if k >= 4:
        return "ok" if real <= 1.01 else "MISS"
    if k == 1:
        return "ok" if real <= 1.05 and real <= old else "MISS"
    return "-"


def balance(n: int, models: list[str] | None = None) -> None:
    """Section (b2): plans made with ``--cost flops`` for each real model, scored by the
    model's own FLOPs (:mod:`real_cost`), beside the same data balanced by the old formula;
    then, unless ``models`` are named, (b2'') by layout and (b2') the RL peers."""
    from real_cost import RealModel, times

    quick = n < 400_000
    sets, ks_only = _only("VARPACK_BALANCE_SETS"), _only("VARPACK_BALANCE_K")
    chosen = [(m, RealModel.of(m)) for m in models or MODELS]  # a bad name stops here
    print(
        "\n(b2) shuffled balance in the real models' FLOPs: --cost flops --model M --order "
        "shuffle (window 8), packed; each plan scored by an independent per-sample cost of M "
        "(real_cost.py: causal attention with M's windows, its matmuls and LM head; pad tokens "
        "cost their matmuls) under the plan's --sync: step = sum over steps of the slowest "
        "rank's step (DDP, Megatron), micro = sum over micro-batch slots of the slowest rank "
        "(FSDP, ZeRO-3); time / ideal (samples' cost / dp). other = the same plan under the "
        "other sync; check = plan.json's own figures equal the scorer's; old: the same data "
        "balanced by Skrull's formula with M's --hidden/--kv-hidden/--layers, scored by the "
        "formula / by M; mb = micro-batches per rank and step / the fewest that hold the "
        "step, ceil(step tokens / (dp x budget)); lpt = a plain baseline (lpt_baseline: the "
        "data shuffled, cut into as many steps of equal tokens, each step longest-processing-"
        "time first into dp x K micro-batches, to ranks or slots by cost) in M's FLOPs under "
        "the plan's sync; bound = no composition of the plan's windows does better under its "
        "sync (plan.json's time_vs_ideal_bound); mixing beside its floor (the same steps "
        "refilled by a plain random shuffle); target: K >= 4 <= 1.01x, K = 1 <= 1.05x and <= old"
    )
    head = (f"{'K':>3} {'sync':<5} {'time':>6} {'bound':>6} {'other':>6} {'check':>5} | "
            f"{'old':>6} {'old M':>6} | {'lpt':>6} | {'mb':>5} {'fewest':>6} {'steps':>6} | "
            f"{'mixing':>6} {'floor':>6} | target")  # fmt: skip
    missed: list[str] = []
    for name, (lens, budget, dp, extra, ks) in real_sets(quick).items():
        if sets is not None and not any(name.startswith(w) for w in sets):
            continue
        q50, q99 = np.percentile(lens, [50, 99])
        for m, real in chosen:
            model, dims = model_options(m, real)
            print(f"\n{name}: {len(lens):,} samples, p50 {q50:.0f}, p99 {q99:.0f}; {real.name} "
                  f"({real.describe()})")  # fmt: skip
            print(head)
            for k in ks if ks_only is None else [k for k in ks if str(k) in ks_only]:
                for sync in ("step", "micro") if k > 1 else ("step",):
                    kw = dict(grad_accum=k, sync=sync, **extra)
                    arrays, s = make_for(lens, budget, dp, model, **kw)
                    got = times(arrays, real)
                    want = s["time_vs_ideal_by_sync"]
                    ok = all(abs(got[x] - want[x]) < 1e-6 * want[x] for x in got)
                    old_arrays, old_s = make_for(lens, budget, dp, dims, **kw)
                    old = times(old_arrays, real)[sync]
                    mb, least = fewest(arrays, budget)
                    lpt = lpt_baseline(lens, arrays.num_steps, dp, k, budget, real, sync)
                    verdict = target(k, got[sync], old)
                    if verdict == "MISS":
                        missed.append(f"{name}, {real.name}, K={k} {sync}: {got[sync]:.3f}")
                    print(
                        f"{k:>3} {sync if k > 1 else 'both':<5} {got[sync]:>6.3f} "
                        f"{s['time_vs_ideal_bound']:>6.3f} "
                        f"{got['micro' if sync == 'step' else 'step']:>6.3f} "
                        f"{'ok' if ok else 'DIFF':>5} | {old_s['time_vs_ideal']:>6.3f} "
                        f"{old:>6.3f} | {lpt:>6.3f} | {mb:>5.2f} {least:>6.2f} {arrays.num_steps:>6} "
                        f"| {s['mixing']:>6.3f} {shuffle_mixing(arrays):>6.3f} | {verdict}"
                    )
    print("\nmissed targets: " + ("; ".join(missed) if missed else "none"))
    if models:
        return
    layouts(n)
    if sets is not None or ks_only is not None:
        return
    from rl_peers import rollout_table

    rollout_table(2 if quick else 8, quick)


def lpt_baseline(lens: np.ndarray, steps: int, dp: int, k: int, budget: int, real: object,
                 sync: str, seed: int = 0) -> float:  # fmt: skip
    """The plain baseline a new user writes, scored in ``real``'s FLOPs under ``sync``: the
    data shuffled, cut into ``steps`` steps of equal tokens (the plan's own count); each step's
    samples, costliest first, to the least loaded of ``dp x k`` micro-batches with room (where
    none has room, the one of fewest tokens: counted over the budget); then under ``step`` the
    micro-batches, costliest first, to the least loaded rank still short of ``k`` of them, under
    ``micro`` cut into slots of ``dp`` by cost. Time over the ideal (samples' cost / dp)."""
    import heapq

    x = lens[np.random.default_rng(seed).permutation(len(lens))]
    c = real.sample_cost(x)  # type: ignore[attr-defined]
    cut = np.searchsorted(np.cumsum(x), np.arange(1, steps) * x.sum() / steps)
    total = 0.0
    for part in np.split(np.arange(len(x)), cut):
        nb = dp * k
        load, tok = np.zeros(nb), np.zeros(nb, dtype=np.int64)
        heap = [(0.0, j) for j in range(nb)]
        for i in part[np.argsort(-c[part], kind="stable")]:
            aside, j = [], -1
            while heap:
                lj, b = heapq.heappop(heap)
                if tok[b] + x[i] <= budget:
                    j = b
                    break
                aside.append((lj, b))
            for e in aside:
                heapq.heappush(heap, e)
            if j < 0:  # no room anywhere: over the budget, in the emptiest (still in the heap)
                j = int(np.argmin(tok))
                load[j] += c[i]
                tok[j] += x[i]
                heap = [(load[b], b) for _, b in heap]
                heapq.heapify(heap)
                continue
            load[j] += c[i]
            tok[j] += x[i]
            heapq.heappush(heap, (load[j], j))
        if sync == "micro":
            total += np.sort(load)[::-1][::dp].sum()
        else:
            ranks, count = np.zeros(dp), np.zeros(dp, dtype=np.int64)
            for b in np.argsort(-load, kind="stable"):
                r = min((r for r in range(dp) if count[r] < k), key=lambda r: (ranks[r], r))
                ranks[r] += load[b]
                count[r] += 1
            total += ranks.max()
    return total / (c.sum() / dp)


def make_for(lens: np.ndarray, budget: int, dp: int, model: dict[str, object],
             **kw: object) -> tuple:  # type: ignore[type-arg]  # fmt: skip
    """A shuffled plan with the flops cost of ``model`` (PlanConfig's model options)."""
    srt = np.sort(lens, kind="stable")
    cfg = PlanConfig(max_tokens=budget, dp=dp, cost="flops", order="shuffle", **model, **kw)  # type: ignore[arg-type]
    arrays, meta, _ = make_plan(np.arange(len(srt)), srt, cfg)
    return arrays, meta["stats"]
