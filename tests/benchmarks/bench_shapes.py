"""Shapes benchmark: padding vs --max-shapes, pipeline-parallel cost, BLoad blocks on video data.

    python tests/benchmarks/bench_shapes.py [--quick]

1. Padding vs K on synth long-tail data (lengths <= 16K), curriculum order, budget 16K: the padded
   layout (every micro-batch a full ``(16K // T, T)`` shape) and the packed layout (best fit
   within windows of 8,192 sorted samples, totals rounded to K lengths). "floor" is the DP optimum
   ``sum(bucket - len)``: no plan with K lengths pads less in the padded layout.
2. Pipeline parallel, P = 4: a curriculum padded plan (dp 8, budget 16K, M = 64) re-cut so that
   each (step, rank) has one shape and a multiple of 4 micro-batches.
3. Blocks on Action Genome-shaped video data (7,464 samples, 166,785 frames), vs the BLoad paper.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.blocks import DEFAULT_WINDOW, action_genome_lengths, pack_blocks
from varpack.plan.pipeline import pipeline_rebatch, pipeline_shapes, split_to_multiple
from varpack.plan.shapes import (
    choose_lengths,
    curriculum_padded_batches,
    padded_layout_padding,
    padding_of,
    round_up,
    round_up_to,
)
from varpack.synth import sample_lengths

BUDGET = 16_384
KS = (1, 2, 4, 8, 16, 32, 64, 128)
BLOAD_PADDING, AG_FRAMES = 3695, 166_785


def pct(x: float) -> str:
    return f"{100 * x:6.2f}%"


def long_tail(n: int) -> np.ndarray:
    return np.sort(sample_lengths("long-tail", n, np.random.default_rng(0), max_len=BUDGET))


def shapes_table(lens: np.ndarray) -> None:
    real = int(lens.sum())
    totals = pack_blocks(lens, BUDGET, window=8192).block_fill
    print(f"\n[1] padding vs --max-shapes K: {lens.size:,} long-tail samples, budget {BUDGET}")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        choose_lengths(lens, 8)
        times.append(time.perf_counter() - t0)
    print(
        f"    choose_lengths(K=8) on {lens.size:,} samples: {np.median(times):.3f} s (median of 3)"
    )
    print(
        f"    {'K':>9} | {'padded M=1':>10} {'floor':>8} | {'padded M=64':>11} | {'packed M=1':>10}"
    )
    rows: list[tuple[str, float, float, float, float]] = []
    for k in KS:
        p1, _ = padded_layout_padding(lens, BUDGET, 1, k)
        p64, _ = padded_layout_padding(lens, BUDGET, 64, k)
        floor = padding_of(lens, choose_lengths(lens, k))
        eff = round_up_to(totals, choose_lengths(totals, k))
        packed = 1 - totals.sum() / eff.sum()
        rows.append((str(k), p1, floor / (real + floor), p64, packed))
    u1, s1 = padded_layout_padding(lens, BUDGET, 1)
    u64, s64 = padded_layout_padding(lens, BUDGET, 64)
    rows.append(("unbounded", u1, 0.0, u64, 0.0))
    for name, a, b, c, d in rows:
        print(f"    {name:>9} | {pct(a):>10} {pct(b):>8} | {pct(c):>11} | {pct(d):>10}")
    print(f"    (unbounded shapes: {s1:,} at M=1, {s64:,} at M=64)")
    for label, unb, col in (("padded M=1", u1, 1), ("padded M=64", u64, 3), ("packed", 0.0, 4)):
        ok = [r[0] for r in rows[:-1] if r[col] - unb <= 0.02]
        print(f"    smallest K within 2 points of unbounded, {label}: {ok[0] if ok else '> 128'}")


def curriculum_groups(lens: np.ndarray, dp: int, grad_accum: int, m: int) -> tuple:
    """Curriculum padded plan: micro-batches of sorted samples, dealt to ranks step by step."""
    eff = round_up(lens, m)
    off = curriculum_padded_batches(eff, BUDGET)
    per_step = dp * grad_accum
    n_mb = (off.size - 1) // per_step * per_step  # whole steps only, for the comparison
    off = off[: n_mb + 1]
    mb = np.arange(n_mb)
    step, j = mb // per_step, mb % per_step
    rank = j % dp  # interleaved assignment, as in the blog's curriculum
    order = np.lexsort((mb, rank, step))  # group micro-batches by (step, rank)
    group = (step * dp + rank)[order]
    lens_mb = np.diff(off)[order]
    t = eff[off[1:] - 1][order]
    sample_order = np.concatenate([np.arange(off[i], off[i + 1]) for i in order])
    new_off = np.concatenate([[0], np.cumsum(lens_mb)])
    return lens[sample_order], new_off, group, lens_mb, t


def pipeline_table(lens: np.ndarray) -> None:
    dp, m = 8, 64
    print(
        f"\n[2] pipeline parallel, P = 4: curriculum padded plan, dp {dp}, budget {BUDGET}, M {m}"
    )
    print(
        f"    {'grad_accum':>10} {'method':>18} | {'padding':>8} {'extra':>8} {'mb/step':>8} {'over budget':>11}"
    )
    for g in (4, 3):
        s_lens, off, group, n, t = curriculum_groups(lens, dp, g, m)
        real = int(s_lens.sum())
        base = int((n * t).sum())
        print(
            f"    {g:>10} {'none (no pp)':>18} | {pct(1 - real / base):>8} {'':>8} {g:>8} {'':>11}"
        )
        # Blog's rule, recut: one (B, T) per (step, rank) within the budget.
        gstart = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        goff = np.r_[off[gstart], off[-1]]
        gstep = group[gstart] // dp
        for uniform in (False, True):
            o2, g2, t2, pr = pipeline_rebatch(s_lens, goff, gstep, BUDGET, 4, m, uniform)
            tot = int(((np.diff(o2) + pr) * t2).sum())
            per_step = np.bincount(gstep[g2]) // dp
            span = (
                f"{per_step.min()}-{per_step.max()}"
                if per_step.min() < per_step.max()
                else str(per_step.max())
            )
            name = "rebatch uniform" if uniform else "rebatch (blog)"
            print(
                f"    {g:>10} {name:>18} | {pct(1 - real / tot):>8} {pct(tot / base - 1):>8} {span:>8} {0:>11}"
            )
        # ROLL: split the largest to a multiple of P, then pad to the (step, rank) maximum.
        try:
            o3, g3 = split_to_multiple(off, group, s_lens, 4)
        except ConfigError as e:
            print(f"    {g:>10} {'split+pad (ROLL)':>18} | impossible: {str(e)[:60]}...")
            continue
        n3 = np.diff(o3)
        t3 = round_up(np.maximum.reduceat(s_lens, o3[:-1]), m)
        b, tt, extra = pipeline_shapes(g3, n3, t3)
        tot3 = int((n3 * t3).sum() + extra.sum())
        over = int(np.sum(b * tt > BUDGET))
        per3 = g3.size // gstep.size
        print(
            f"    {g:>10} {'split+pad (ROLL)':>18} | {pct(1 - real / tot3):>8} {pct(tot3 / base - 1):>8} {per3:>8} {over:>11}"
        )
    print(
        "    extra = padded tokens over the no-pp plan; over budget = (step, rank) shapes B x T > budget"
    )


def blocks_table(quick: bool) -> None:
    a = action_genome_lengths()
    shuffled = a[np.random.default_rng(0).permutation(a.size)]
    print(
        f"\n[3] blocks (BLoad) on Action Genome-shaped data: {a.size:,} videos, {int(a.sum()):,} frames"
    )
    print(f"    pad to longest (paper's '0 padding'): {a.size * a.max() - a.sum():,} frames")
    print(
        f"    BLoad paper, blocks of 94, random fill: {BLOAD_PADDING:,} frames ({pct(BLOAD_PADDING / (AG_FRAMES + BLOAD_PADDING))})"
    )
    print(
        f"    {'block_len':>9} {'window':>7} | {'blocks':>6} {'padded frames':>13} {'padding':>8} {'bound':>6}"
    )
    for t in (94, 128, 188, 256):
        for w in (DEFAULT_WINDOW, 2048, 512, 128):
            p = pack_blocks(shuffled, t, w)
            pad = p.block_fill.size * t - int(a.sum())
            bound = -(-int(a.sum()) // t) * t - int(a.sum())
            print(
                f"    {t:>9} {w:>7} | {p.block_fill.size:>6} {pad:>13,} {pct(pad / (p.block_fill.size * t)):>8} {bound:>6}"
            )
    print("    bound = padding of ceil(frames / block_len) full blocks (no packing does better)")
    n = 1_000_000 if quick else 10_000_000
    toks = sample_lengths("long-tail", n, np.random.default_rng(1), max_len=4096)
    pack_blocks(toks[:1000], 4096)
    t0 = time.perf_counter()
    p = pack_blocks(toks, 4096, DEFAULT_WINDOW)
    dt = time.perf_counter() - t0
    pad = 1 - toks.sum() / (p.block_fill.size * 4096)
    print(f"    speed: {n:,} long-tail samples into blocks of 4096: {dt:.2f} s, padding {pct(pad)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 1 min)")
    args = ap.parse_args()
    n = 1_000_000 if args.quick else 10_000_000
    lens = long_tail(n)
    shapes_table(lens)
    pipeline_table(lens if args.quick else lens[:: max(1, n // 2_000_000)])
    blocks_table(args.quick)


if __name__ == "__main__":
    main()
