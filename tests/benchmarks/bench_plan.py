"""Benchmark of `varpack plan`: throughput (1M/10M/100M samples) and plan quality vs peers.

    python tests/benchmarks/bench_plan.py [--quick] [--only throughput|quality|balance|shapes|mix|where|scale]
        [--model NAME_OR_CONFIG ...]

(a) Throughput: synthetic long-tail lengths (pre-sorted, as `varpack sort` delivers them), planned
    and written (dp 8, grad-accum 4, 16K budget, flops cost of Qwen2.5-0.5B). Each size runs in its
    own subprocess so its peak RSS is its own. Compared with a reimplementation of DeepSpeed
    PR 7104's greedy `batch_by_seqlens` at sizes it can finish (plan_peers.py).
(b) Quality on synthetic long-tail (budget 16K), bimodal (128K) and video (16K frames) data, dp 8,
    flops cost of Qwen2.5-0.5B, all strategies scored by the same functions
    (varpack.plan.kernels.micro.summarize / stats): padding ratio, estimated time / ideal,
    imbalance, mixing; the peers and the scorer are in plan_peers.py.
(b2) Shuffled balance at grad-accum 1, 2, 4, 16 (dp 16 and 32: 8) on the long-SFT tail, a heavy
    tail at 32 K and RL rollouts, planned with ``--cost flops`` for real models (``--model``: a
    preset's name or a config.json, repeatable; default plan_balance.MODELS) and scored by an
    independent count of each model's FLOPs (real_cost.py), beside the same data balanced by the
    old formula; then (b2'') the padded layout, ``--pp 4``, bounds and mixing on more sets for
    Qwen2.5-0.5B (plan_balance.layouts) and RL rollout batches against peers (rl_peers.py), both
    left out when ``--model`` names the models.
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
from pathlib import Path

import numpy as np
from plan_peers import ds7104_speed, quality

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig
from varpack.planfile.tables import plan_tables

DP = 8
MODEL = "qwen2.5-0.5b"


# ---------------------------------------------------------------- (a) throughput -----------------


def _throughput_child(n: int, order: str) -> None:
    from varpack.plan import make_plan
    from varpack.planfile.format import write_plan

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
    ds7104_speed(ds_sizes)


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
    ap.add_argument("--model", action="append", help="balance: a preset's name or a config.json")
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
        "balance" in run and balance(30_000, args.model)
        if "shapes" in run:
            shapes_vs_k(200_000)
            pipeline_cost(200_000)
            blocks_video(1_000_000)
    else:
        "throughput" in run and throughput(
            [1_000_000, 10_000_000, 100_000_000], [10_000, 20_000, 40_000]
        )
        "quality" in run and quality(400_000, [1, 2, 4, 8, 32, 128, 1024])
        "balance" in run and balance(400_000, args.model)
        if "shapes" in run:
            shapes_vs_k(2_000_000)
            pipeline_cost(2_000_000)
            blocks_video(10_000_000)


if __name__ == "__main__":
    main()
