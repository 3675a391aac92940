"""Plan throughput of this checkout against an earlier commit, in the same run.

    python tests/benchmarks/compare_throughput.py REF [--samples 100M] [--repeat 3]

Checks REF out into a temporary git worktree and runs each side's own ``bench_plan.py --child N
ORDER`` (plan + write of N long-tail samples, dp 8, grad-accum 4, flops cost), alternating the
two sides so that machine noise falls on both alike. Prints the median plan + write seconds of
each side and the ratio (this checkout / REF: below 1 is faster) per order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(checkout: Path, n: int, order: str) -> float:
    """Seconds of plan + write in a fresh process running ``checkout``'s code."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    bench = checkout / "tests" / "benchmarks" / "bench_plan.py"
    out = subprocess.run(
        [sys.executable, str(bench), "--child", str(n), order],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=checkout,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return float(r["plan_s"] + r["write_s"])


def count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", help="the commit to compare with")
    ap.add_argument("--samples", default="100M")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = count(args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.ref], check=True)  # fmt: skip
        try:
            print(f"plan + write, {n:,} long-tail samples: this checkout vs {args.ref}")
            print(f"{'order':>10} {'ref s':>8} {'this s':>8} {'this / ref':>11}")
            for order in ("curriculum", "shuffle"):
                ref, this = [], []
                for _ in range(args.repeat):
                    ref.append(child(base, n, order))
                    this.append(child(ROOT, n, order))
                a, b = statistics.median(ref), statistics.median(this)
                print(f"{order:>10} {a:>8.2f} {b:>8.2f} {b / a:>11.3f}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)  # fmt: skip


if __name__ == "__main__":
    main()
