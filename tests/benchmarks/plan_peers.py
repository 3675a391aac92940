"""Plan quality against peers: section (b) of bench_plan.py (`--only quality`), and the
DeepSpeed PR 7104 comparison of its throughput section (a).

Each peer's batching rule is reimplemented as a :class:`Layout` (stream lengths,
micro-batch offsets, each micro-batch's step and rank), and every strategy, varpack's included,
is scored by the same functions (varpack.plan.kernels.micro.summarize / stats): padding ratio,
estimated time / ideal, imbalance, mixing. Peers: DDP's random fixed batches, LongAlign's sorted
batching, DeepSpeed 7104's sorted greedy packing, VeOmni's buffer first-fit, ROLL's dynamic
batching.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, plan_arrays
from varpack.plan.cost import sample_cost
from varpack.plan.figures.stats import mixing
from varpack.plan.kernels.micro import summarize
from varpack.plan.sync import step_loads

DP = 8
MODEL = "qwen2.5-0.5b"


# ---------------------------------------------------------------- (a) DeepSpeed 7104 speed --------


def ds7104_batch_by_seqlens(seqlens: list[int], max_tokens: int) -> list[list[int]]:
    """Reimplementation of DeepSpeed PR 7104's greedy packing (pure Python, as in the PR).

    Samples sorted by length; each one goes to the first micro-batch it fits in, scanning every
    micro-batch built so far (sum of lengths <= max_tokens); otherwise a new one is opened.
    The scan over all micro-batches per sample makes it super-linear.
    """
    order = sorted(range(len(seqlens)), key=lambda i: seqlens[i])
    batches: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        s = seqlens[i]
        for b in range(len(batches)):
            if loads[b] + s <= max_tokens:
                batches[b].append(i)
                loads[b] += s
                break
        else:
            batches.append([i])
            loads.append(s)
    return batches


def ds7104_speed(ds_sizes: list[int]) -> None:
    """The pure-Python greedy of DeepSpeed 7104 against varpack's packing alone, same lengths."""
    print(
        "\nDeepSpeed 7104 greedy batch_by_seqlens (reimplemented, pure Python) vs varpack packing only:"
    )
    print(f"{'samples':>12} {'DS 7104 s':>10} {'varpack s':>10} {'ratio':>8}")
    prev = None
    for n in ds_sizes:
        lens = sample_lengths("long-tail", n, np.random.default_rng(1), max_len=16384)
        t = time.perf_counter()
        ds7104_batch_by_seqlens(lens.tolist(), 16384)
        ds = time.perf_counter() - t
        cfg = PlanConfig(max_tokens=16384, dp=1, grad_accum=1)
        srt = np.sort(lens)
        plan_arrays(np.arange(n), srt, cfg)
        t = time.perf_counter()
        plan_arrays(np.arange(n), srt, cfg)
        vp = time.perf_counter() - t
        grow = f"  (x{ds / prev[1]:.1f} for x{n / prev[0]:.0f} samples)" if prev else ""
        print(f"{n:>12,} {ds:>10.2f} {vp:>10.4f} {ds / vp:>8.0f}{grow}")
        prev = (n, ds)


# ---------------------------------------------------------------- (b) quality ---------------------


@dataclass
class Layout:
    """A plan as arrays: stream lengths, micro-batch offsets, and each micro-batch's step and rank."""

    lens: np.ndarray
    offsets: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    layout: str
    pad_multiple: int = 1


def score(p: Layout, all_lens: np.ndarray) -> dict[str, float]:
    """Padding, time / ideal, imbalance, mixing with varpack's own cost and stats functions."""
    cfg = PlanConfig(
        max_tokens=2**31 - 1,
        layout=p.layout,
        pad_multiple=p.pad_multiple,
        cost="flops",
        model_preset=MODEL,
    ).resolved()
    m = summarize(p.offsets, p.lens, cfg.micro_rule())
    vol = m.pad_to * (m.samples if p.layout == "padded" else 1)
    steps = int(p.step.max()) + 1
    loads = step_loads(p.step, p.rank, m.cost, steps, DP)
    peak = loads.max(axis=1)
    ideal = (
        float(sample_cost(p.lens, cfg.cost_model()).sum()) / DP
    )  # of the samples the strategy trains
    imb = peak / np.maximum(loads.mean(axis=1), 1e-300)
    return {
        "padding": 1 - m.tokens.sum() / vol.sum(),
        "time": float(peak.sum()) / ideal,
        "imb_mean": float(imb.mean()),
        "imb_max": float(imb.max()),
        "mixing": mixing(np.repeat(p.step, m.samples), p.lens, steps),
        "lost": 1 - len(p.lens) / len(all_lens),
    }


def _steps_round_robin(n_micro: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """DistributedSampler-style: micro-batch i to rank i % dp, K per rank per step."""
    i = np.arange(n_micro)
    return (i // DP) // k, i % DP


def peer_ddp(lens: np.ndarray, b: int, k: int, rng: np.random.Generator) -> Layout:
    """DDP default: random order, fixed B samples, padded to the longest in the micro-batch."""
    x = lens[rng.permutation(len(lens))]
    m = (len(x) // b // (DP * k)) * DP * k
    x = x[: m * b]
    step, rank = _steps_round_robin(m, k)
    return Layout(x, np.arange(0, m * b + 1, b), step, rank, "padded")


def peer_sorted(lens: np.ndarray, b: int, k: int, rng: np.random.Generator) -> Layout:
    """LongAlign sorted batching: sort, fixed B consecutive samples, batches in random order."""
    x = np.sort(lens)
    m = (len(x) // b // (DP * k)) * DP * k
    batches = x[: m * b].reshape(m, b)[rng.permutation(m)]
    step, rank = _steps_round_robin(m, k)
    return Layout(batches.reshape(-1), np.arange(0, m * b + 1, b), step, rank, "padded")


def _greedy_sorted(x: np.ndarray, budget: int) -> np.ndarray:
    cfg = PlanConfig(max_tokens=budget).resolved()
    from varpack.plan.kernels.pack import pack

    return pack(x, np.array([0, len(x)]), np.zeros(len(x), bool), cfg.pack_rule())[1]


def peer_ds7104(lens: np.ndarray, budget: int, k: int, rng: np.random.Generator) -> Layout:
    """DeepSpeed 7104: sorted greedy packing (sum <= budget), micro-batches interleaved over ranks,
    trailing micro-batches that do not fill a step dropped."""
    x = np.sort(lens)
    off = _greedy_sorted(x, budget)
    m = ((len(off) - 1) // (DP * k)) * DP * k
    off = off[: m + 1]
    step, rank = _steps_round_robin(m, k)
    return Layout(x[: off[-1]], off, step, rank, "packed")


def peer_veomni(
    lens: np.ndarray, budget: int, k: int, rng: np.random.Generator, buffer: int = 500
) -> Layout:
    """VeOmni dyn_bsz: each rank reads its random shard, keeps a buffer and fills a micro-batch by
    first fit from the buffer; ranks stop at the shortest rank's step count (packed layout)."""
    x = lens[rng.permutation(len(lens))]
    per_rank: list[list[np.ndarray]] = []
    for r in range(DP):
        shard = list(x[r::DP])
        buf: list[int] = []
        mbs: list[np.ndarray] = []
        pos = 0
        while pos < len(shard) or buf:
            while len(buf) < buffer and pos < len(shard):
                buf.append(int(shard[pos]))
                pos += 1
            cur, total, rest = [], 0, []
            for s in buf:
                if total + s <= budget:
                    cur.append(s)
                    total += s
                else:
                    rest.append(s)
            buf = rest
            mbs.append(np.array(cur))
        per_rank.append(mbs)
    steps = min(len(m) for m in per_rank) // k
    parts, counts, step, rank = [], [], [], []
    for s in range(steps):
        for r in range(DP):
            for j in range(k):
                mb = per_rank[r][s * k + j]
                parts.append(mb)
                counts.append(len(mb))
                step.append(s)
                rank.append(r)
    off = np.concatenate(([0], np.cumsum(counts)))
    return Layout(np.concatenate(parts), off, np.array(step), np.array(rank), "packed")


def peer_roll(
    lens: np.ndarray, budget: int, k: int, rng: np.random.Generator, round_to: int = 64
) -> Layout:
    """ROLL dynamic batching: random global batches; each sorted and dealt over dp shards
    (balanced tokens), each shard packed greedily into B x T micro-batches (T rounded to 64)
    within the budget; padded layout."""
    x = lens[rng.permutation(len(lens))]
    per_step = max(DP, int(DP * k * budget / x.mean() * 0.9))
    parts, counts, step, rank = [], [], [], []
    cfg = PlanConfig(max_tokens=budget, layout="padded", pad_multiple=round_to).resolved()
    from varpack.plan.kernels.pack import pack

    for s, a in enumerate(range(0, len(x) - per_step + 1, per_step)):
        g = np.sort(x[a : a + per_step])
        for r in range(DP):
            shard = np.concatenate(
                (g[r :: 2 * DP], g[2 * DP - 1 - r :: 2 * DP])
            )  # snake: even tokens
            shard.sort()
            _, off = pack(
                shard, np.array([0, len(shard)]), np.zeros(len(shard), bool), cfg.pack_rule()
            )
            for i in range(len(off) - 1):
                parts.append(shard[off[i] : off[i + 1]])
                counts.append(off[i + 1] - off[i])
                step.append(s)
                rank.append(r)
    off = np.concatenate(([0], np.cumsum(counts)))
    return Layout(np.concatenate(parts), off, np.array(step), np.array(rank), "padded", round_to)


def varpack_layout(lens: np.ndarray, **kw: object) -> Layout:
    ids = np.arange(len(lens))
    order = np.argsort(lens, kind="stable")
    p = plan_arrays(
        ids[order], lens[order], PlanConfig(dp=DP, cost="flops", model_preset=MODEL, **kw)
    )  # type: ignore[arg-type]
    return Layout(p.lens[p.stream], p.offsets, p.step, p.rank, p.cfg.layout, p.cfg.pad_multiple)


def quality(n: int, windows: list[int]) -> None:
    rng = np.random.default_rng(0)
    data = {
        "long-tail": (sample_lengths("long-tail", n, rng, max_len=16384), 16384),
        "bimodal": (sample_lengths("bimodal", max(n // 20, 2000), rng), 131072),
        "video": (sample_lengths("video", n, rng), 16384),
    }
    k = 4
    print(
        f"\n(b) quality: dp {DP}, grad-accum {k}, flops cost of {MODEL}; time = sum of slowest rank per step / ideal"
    )
    for name, (lens, budget) in data.items():
        b = max(
            1, int(budget / lens.mean())
        )  # fixed batch with the same mean tokens per micro-batch
        rows = [
            ("DDP random fixed B, pad-to-longest", peer_ddp(lens, b, k, np.random.default_rng(1))),
            ("sorted batching (LongAlign)", peer_sorted(lens, b, k, np.random.default_rng(1))),
            ("DeepSpeed 7104 greedy", peer_ds7104(lens, budget, k, np.random.default_rng(1))),
            ("VeOmni buffer first-fit", peer_veomni(lens, budget, k, np.random.default_rng(1))),
            (
                "ROLL dynamic batching (pad 64)",
                peer_roll(lens, budget, k, np.random.default_rng(1)),
            ),
            ("varpack curriculum packed", varpack_layout(lens, max_tokens=budget, grad_accum=k)),
            (
                "varpack shuffle packed (W=8)",
                varpack_layout(lens, max_tokens=budget, grad_accum=k, order="shuffle"),
            ),
            (
                "varpack curriculum padded pad 64",
                varpack_layout(
                    lens, max_tokens=budget, grad_accum=k, layout="padded", pad_multiple=64
                ),
            ),
            (
                "varpack shuffle padded pad 64",
                varpack_layout(
                    lens,
                    max_tokens=budget,
                    grad_accum=k,
                    layout="padded",
                    pad_multiple=64,
                    order="shuffle",
                ),
            ),
        ]
        print(
            f"\n{name}: {len(lens):,} samples, {int(lens.sum()):,} tokens, budget {budget}, fixed B = {b}"
        )
        print(
            f"{'strategy':<36} {'padding':>8} {'time/ideal':>10} {'imb mean':>9} {'imb max':>8} {'mixing':>7} {'dropped':>8}"
        )
        for label, lay in rows:
            s = score(lay, lens)
            print(
                f"{label:<36} {100 * s['padding']:>7.2f}% {s['time']:>10.3f} {s['imb_mean']:>9.3f} {s['imb_max']:>8.3f} {s['mixing']:>7.3f} {100 * s['lost']:>7.2f}%"
            )
    lens, budget = data["long-tail"]
    for kk in (1, 4, 8):
        print(
            f"\nshuffle trade-off on long-tail (packed, grad-accum {kk}): --shuffle-window vs time and mixing"
        )
        print(f"{'window':>7} {'time/ideal':>10} {'imb max':>8} {'mixing':>7}")
        for w in windows:
            s = score(
                varpack_layout(
                    lens, max_tokens=budget, grad_accum=kk, order="shuffle", shuffle_window=w
                ),
                lens,
            )
            print(f"{w:>7} {s['time']:>10.3f} {s['imb_max']:>8.3f} {s['mixing']:>7.3f}")
