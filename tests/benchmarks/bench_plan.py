"""Benchmark of `varpack plan`: throughput (1M/10M/100M samples) and plan quality vs peers.

    python tests/benchmarks/bench_plan.py [--quick] [--only throughput|quality|balance|shapes|mix|where|scale]

(a) Throughput: synthetic long-tail lengths (pre-sorted, as `varpack sort` delivers them), planned
    and written (dp 8, grad-accum 4, 16K budget, flops cost of Qwen2.5-0.5B). Each size runs in its
    own subprocess so its peak RSS is its own. Compared with a reimplementation of DeepSpeed
    PR 7104's greedy `batch_by_seqlens` at sizes it can finish.
(b) Quality on synthetic long-tail (budget 16K), bimodal (128K) and video (16K frames) data, dp 8,
    flops cost of Qwen2.5-0.5B, all strategies scored by the same functions
    (varpack.plan.kernels.micro.summarize / stats): padding ratio, estimated time / ideal,
    imbalance, mixing.
(b2) Shuffled balance at grad-accum 1, 2, 4, 16 on long-tail, bimodal and heavy-bodied data, with
    the yardstick (shuffle + LPT on cost) and a lower bound (plan_balance.py).
(c) Shapes, all through the real planner (make_plan) with its own stats: padding vs --max-shapes K
    on synth long-tail data (padded layout, and packed for contrast; "floor" = the DP optimum
    sum(bucket - len), a lower bound for any padded plan with K lengths); the cost of --pp 4;
    --batching blocks on Action Genome-shaped video data against the BLoad paper's 3,695 frames.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from varpack.manifest.tables import plan_tables
from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, plan_arrays
from varpack.plan.cost import sample_cost
from varpack.plan.figures.stats import mixing
from varpack.plan.kernels.micro import summarize
from varpack.plan.sync import step_loads

DP = 8
MODEL = "qwen2.5-0.5b"


# ---------------------------------------------------------------- (a) throughput -----------------


def _throughput_child(n: int, order: str) -> None:
    from varpack.manifest.format import write_plan
    from varpack.plan import make_plan

    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0), max_len=16384))
    ids = np.arange(n, dtype=np.int64)
    cfg = PlanConfig(
        max_tokens=16384, dp=DP, grad_accum=4, cost="flops", model_preset=MODEL, order=order
    )
    make_plan(ids[:10_000], lens[:10_000], cfg)  # numba kernels loaded from cache / compiled
    t0 = time.perf_counter()
    arrays, meta, extra = make_plan(ids, lens, cfg)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_plan(f"{tmp}/plan", meta, plan_tables(arrays), rank_extra=extra)
    t2 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"plan_s": t1 - t0, "write_s": t2 - t1, "rss_gb": rss}))


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


def throughput(sizes: list[int], ds_sizes: list[int]) -> None:
    print("\n(a) throughput: long-tail lengths, dp 8, grad-accum 4, budget 16384, flops cost")
    print(
        f"{'samples':>12} {'order':>10} {'plan s':>8} {'write s':>8} {'total s':>8} {'peak RSS GB':>12} {'samples/s':>12}"
    )
    for n in sizes:
        for order in ("curriculum", "shuffle"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(n), order],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            total = r["plan_s"] + r["write_s"]
            print(
                f"{n:>12,} {order:>10} {r['plan_s']:>8.2f} {r['write_s']:>8.2f} {total:>8.2f} {r['rss_gb']:>12.2f} {n / total:>12,.0f}"
            )
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


# ---------------------------------------------------------------- (c) shapes ----------------------

SHAPE_BUDGET = 16384
BLOAD_FRAMES, AG_FRAMES = 3695, 166_785


def _stats(lens: np.ndarray, **kw: object) -> tuple[dict, float]:
    from varpack.plan import make_plan

    t0 = time.perf_counter()
    _, meta, _ = make_plan(np.arange(len(lens)), lens, PlanConfig(**kw))  # type: ignore[arg-type]
    return meta, time.perf_counter() - t0


def shapes_vs_k(n: int) -> None:
    from varpack.plan.kernels.shapes import choose_lengths, padding_of

    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0), max_len=SHAPE_BUDGET))
    real = int(lens.sum())
    base = dict(max_tokens=SHAPE_BUDGET, dp=DP, grad_accum=4, warmup="reorder")
    print(
        f"\n(c1) padding vs --max-shapes K: {n:,} long-tail samples, budget {SHAPE_BUDGET}, dp {DP}, "
        "grad-accum 4, curriculum, --warmup reorder (varpack plan's own stats)"
    )
    print(
        f"{'K':>9} | {'padded M=1':>10} {'floor':>7} {'warm-up':>7} | {'padded M=64':>11} | "
        f"{'packed M=1':>10} {'warm-up':>7} | {'plan s':>6}"
    )
    rows = []
    for k in (1, 2, 4, 8, 16, 32, None):
        extra = {} if k is None else {"max_shapes": k}
        p1, dt = _stats(lens, layout="padded", **base, **extra)
        p64, _ = _stats(lens, layout="padded", pad_multiple=64, **base, **extra)
        pk, _ = _stats(lens, **base, **extra)
        floor = (
            padding_of(lens, choose_lengths(lens, k))
            / (real + padding_of(lens, choose_lengths(lens, k)))
            if k
            else 0.0
        )
        r = (
            "unbounded" if k is None else str(k),
            p1["stats"]["padding_ratio"],
            floor,
            max(p1["stats"]["warmup_rows"]),
            p64["stats"]["padding_ratio"],
            pk["stats"]["padding_ratio"],
            max(pk["stats"]["warmup_rows"]),
            dt,
        )
        rows.append(r)
        print(
            f"{r[0]:>9} | {100 * r[1]:>9.2f}% {100 * r[2]:>6.2f}% {r[3]:>7} | {100 * r[4]:>10.2f}% | "
            f"{100 * r[5]:>9.2f}% {r[6]:>7} | {r[7]:>6.2f}"
        )
    unb = rows[-1]
    print("(warm-up = longest warm-up prefix of a rank, in micro-batches; floor = DP lower bound)")
    for label, col in (("padded M=1", 1), ("padded M=64", 4), ("packed M=1", 5)):
        ok = [r[0] for r in rows[:-1] if r[col] - unb[col] <= 0.02]
        print(
            f"K = 8 vs unbounded, {label}: +{100 * (rows[3][col] - unb[col]):.2f} points; "
            f"smallest K within 2 points: {ok[0] if ok else '> 32'}"
        )
    t0 = time.perf_counter()
    choose_lengths(lens, 8)
    print(f"choose_lengths(K=8) over {n:,} samples: {time.perf_counter() - t0:.3f} s")


def pipeline_cost(n: int) -> None:
    lens = np.sort(sample_lengths("long-tail", n, np.random.default_rng(0), max_len=SHAPE_BUDGET))
    print(
        f"\n(c2) pipeline parallel --pp 4: {n:,} long-tail samples, padded, pad multiple 64, "
        f"budget {SHAPE_BUDGET}, dp {DP}"
    )
    print(
        f"{'order':>10} {'K':>3} {'max-shapes':>10} | {'padding no pp':>13} {'padding pp 4':>12} "
        f"{'pp extra':>9} | {'time/ideal':>10} {'no pp':>7} | {'mixing':>6} {'no pp':>6}"
    )
    for order, k, ms in (
        ("curriculum", 4, None),
        ("curriculum", 8, None),
        ("curriculum", 8, 8),
        ("shuffle", 4, None),
        ("shuffle", 8, None),
    ):
        kw = dict(
            max_tokens=SHAPE_BUDGET,
            dp=DP,
            grad_accum=k,
            layout="padded",
            pad_multiple=64,
            order=order,
            max_shapes=ms,
        )
        a, _ = _stats(lens, **kw)
        b, _ = _stats(lens, pp=4, **kw)
        print(
            f"{order:>10} {k:>3} {str(ms):>10} | {100 * a['stats']['padding_ratio']:>12.2f}% "
            f"{100 * b['stats']['padding_ratio']:>11.2f}% {100 * b['stats']['pp_extra_padding_ratio']:>8.2f}% | "
            f"{b['stats']['time_vs_ideal']:>10.3f} {a['stats']['time_vs_ideal']:>7.3f} | "
            f"{b['stats']['mixing']:>6.3f} {a['stats']['mixing']:>6.3f}"
        )
    print("(pp extra = tokens beyond each micro-batch's own shape, share of processed tokens)")


def blocks_video(n_speed: int) -> None:
    from varpack.metadata.synth import action_genome_lengths

    a = np.sort(action_genome_lengths())
    print(
        f"\n(c3) --batching blocks on Action Genome-shaped data: {a.size:,} videos, "
        f"{int(a.sum()):,} frames (3-94); BLoad paper: {BLOAD_FRAMES:,} padded frames "
        f"({100 * BLOAD_FRAMES / (AG_FRAMES + BLOAD_FRAMES):.1f}%)"
    )
    print(
        f"{'block-len':>9} {'order':>10} {'window':>6} | {'blocks':>6} {'padded frames':>13} "
        f"{'padding':>8} {'vs BLoad':>8} {'bound':>6} | {'empty blocks':>12}"
    )
    for t in (94, 128, 188):
        for order, w in (("shuffle", 8192), ("shuffle", 512), ("curriculum", 8192)):
            meta, _ = _stats(
                a,
                batching="blocks",
                block_len=t,
                blocks_per_batch=8,
                max_tokens=8 * t,
                order=order,
                block_window=w,
                seed=0,
            )
            b = meta["stats"]["blocks"]
            bound = -(-int(a.sum()) // t) * t - int(a.sum())
            print(
                f"{t:>9} {order:>10} {w:>6} | {b['blocks']:>6} {b['block_padding']:>13,} "
                f"{100 * b['block_padding_ratio']:>7.2f}% {b['block_padding'] / BLOAD_FRAMES:>7.2f}x "
                f"{bound:>6} | {b['empty_blocks']:>12}"
            )
    print(
        "(bound = padding of ceil(frames / block-len) full blocks; empty blocks complete the last step)"
    )
    toks = np.sort(sample_lengths("long-tail", n_speed, np.random.default_rng(1), max_len=4096))
    _stats(toks[:10_000], batching="blocks", block_len=4096, max_tokens=16384, dp=DP, grad_accum=4)
    meta, dt = _stats(
        toks,
        batching="blocks",
        block_len=4096,
        max_tokens=16384,
        dp=DP,
        grad_accum=4,
        order="shuffle",
    )
    print(
        f"speed: {n_speed:,} long-tail samples into blocks of 4096 (dp {DP}, shuffle), planned in "
        f"{dt:.2f} s; padding inside blocks {100 * meta['stats']['blocks']['block_padding_ratio']:.2f}%"
    )


def _blend_bench(which: str, quick: bool) -> None:
    """``--only mix``: a 3-source blend of 30 M samples against the same plan without a mix
    (bench_mix.py); ``--only where``: ``--where`` over 64 shards of 30 M rows (bench_where.py);
    ``--only scale``: time and peak memory per rank under MPI (bench_plan_scale.py)."""
    script = Path(__file__).with_name(f"bench_{'plan_scale' if which == 'scale' else which}.py")
    subprocess.run([sys.executable, str(script), *(["--quick"] if quick else [])], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=2)
    ap.add_argument(
        "--only", choices=["throughput", "quality", "balance", "shapes", "mix", "where", "scale"]
    )
    args = ap.parse_args()
    if args.child:
        _throughput_child(int(args.child[0]), args.child[1])
        return
    if args.only in ("mix", "where", "scale"):  # bench_{mix,where,plan_scale}.py, also on their own
        _blend_bench(args.only, args.quick)
        return
    run = {args.only} if args.only else {"throughput", "quality", "balance", "shapes"}
    from plan_balance import balance

    if args.quick:
        "throughput" in run and throughput([1_000_000], [2_000, 4_000])
        "quality" in run and quality(50_000, [1, 8, 64])
        "balance" in run and balance(30_000)
        if "shapes" in run:
            shapes_vs_k(200_000)
            pipeline_cost(200_000)
            blocks_video(1_000_000)
    else:
        "throughput" in run and throughput(
            [1_000_000, 10_000_000, 100_000_000], [10_000, 20_000, 40_000]
        )
        "quality" in run and quality(400_000, [1, 2, 4, 8, 32, 128, 1024])
        "balance" in run and balance(400_000)
        if "shapes" in run:
            shapes_vs_k(2_000_000)
            pipeline_cost(2_000_000)
            blocks_video(10_000_000)


if __name__ == "__main__":
    main()
