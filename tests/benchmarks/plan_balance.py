"""Shuffled balance across grad-accum, layouts and synchronisation models: section (b2) of
bench_plan.py (`--only balance`).

Budget 16K (bimodal: 128K; documents: 8K, split; heavy tail: 32K), dp 8 (heavy tail: 32, RL
rollouts: 16), flops cost of Qwen2.5-0.5B (hidden 896, kv 128, 24 layers), shuffled order (window
8), grad-accum 1, 2, 4, 16 (dp 16 and 32: 1, 2, 4, 8), in the packed layout, the padded layout
and with ``--pp 4`` (packed, ``--sync step``; grad-accum 4 and 16, which ``--pp 4`` needs), each
plan made for ``--sync step`` and for ``--sync micro`` (at grad-accum 1 they are one plan). Sets:

* **long-SFT tail** (:func:`sft_tail`, our own generator of the Llama 3 SFT statistic): 99.89 %
  chat-like samples (log-normal, median 450 tokens, sigma 0.9: mean about 690, 82 % under 1K)
  and 0.11 % near the budget (uniform in 75–100 % of it); 400K samples, and 30K, where a window
  holds fewer long samples;
* bimodal (synth), heavy-bodied 10K and 30K (log-normal, median 450, sigma 1.45, capped);
* **real documents** (``data/doc_lengths.csv``: 11.6K files of four sources tokenized by a
  byte-level BPE, ``make_doc_lengths.py``), 8K budget, ``--oversize split``;
* **heavy tail** (:func:`heavy_tail`): chat-like samples with 0.5 % at 20–32K, budget 32K, dp 32;
* **RL rollouts** (:func:`rollouts`): prompt + response, 25 % of responses cut at an 8K
  generation cap, budget 16K, dp 16.

Every row is a real plan (``make_plan``) scored by plan.json's own stats under the plan's model:
time vs ideal, the per-plan lower bound (``time_vs_ideal_bound``: no composition of the plan's
windows does better), the fill given up (mean and max over steps, below the median step), mixing,
padding; *other* is its time under the other model, and *check* recomputes both times with the
independent scorer of :mod:`rl_peers`. Section (b2') compares RL rollout batches planned by peers
(Karmarkar-Karp by tokens, ROLL) and by varpack (:func:`rl_peers.rollout_table`).

The full run takes long on a few cores; to run a part of it, set (comma-separated)
``VARPACK_BALANCE_SETS`` (words the set's name starts with, e.g. ``bimodal,heavy-bodied 30K``),
``VARPACK_BALANCE_K`` (grad-accums, e.g. ``1``) and ``VARPACK_BALANCE_LAYOUTS`` (``packed,padded``);
with any of them set the peers' table (b2') is skipped.
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


def checked(arrays: object, stats: dict, dp: int) -> str:  # type: ignore[type-arg]
    """The plan's times scored again by the independent scorer of ``rl_peers``: ``ok`` when
    both models agree with plan.json's figures (to 1e-6)."""
    from rl_peers import Micro, independent_times

    p = arrays
    sl = p.lens[p.stream] if p.stream_lens is None else p.stream_lens  # type: ignore[attr-defined]
    m = Micro(np.split(sl, p.offsets[1:-1]), p.micro.pad_to, p.cfg.layout == "padded",  # type: ignore[attr-defined]
              p.step, p.rank, p.micro_index)  # type: ignore[attr-defined]  # fmt: skip
    got = independent_times(m, dp)
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


def balance(n: int) -> None:
    quick = n < 400_000
    sets, ks_only, layouts = (_only(f"VARPACK_BALANCE_{v}") for v in ("SETS", "K", "LAYOUTS"))
    print(
        f"\n(b2) shuffled balance: flops cost of {MODEL}, window 8; each plan balanced for --sync "
        "step (ranks meet once a step: DDP, Megatron) or micro (at every micro-batch: FSDP, "
        "ZeRO-3), scored under its own model: time / ideal, bound (no composition of the plan's "
        "windows does better under that model), gap; 'other' = its time under the other model; "
        "fill given up = mean / max below the median step; floor = packed: the mixing of the same "
        "steps refilled by a plain random shuffle (the sampling floor of steps that size), "
        "padded: the best mixing of steps of sorted padded micro-batches taken stratified "
        "(band_floor_mixing: one length range a micro-batch; under micro, one a slot); "
        "check = both "
        "times recomputed by an independent scorer (rl_peers.independent_times)"
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
                if layout == "pp 4" and k % 4 or layouts is not None and layout not in layouts:
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
                        f"{100 * s['padding_ratio']:>7.2f}% {checked(arrays, s, dp):>6}"
                    )
    if sets is not None or ks_only is not None or layouts is not None:
        return
    from rl_peers import rollout_table

    rollout_table(2 if quick else 8, quick)
