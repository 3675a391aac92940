"""Planning time of ``--compose engine`` against ``--compose cost``, paired in one run.

    python tests/benchmarks/compare_compose_speed.py [--samples 8M] [--repeat 3]

Plans the same lengths with each composer in turn (``plan_arrays``: the whole plan, no write),
``--repeat`` times, alternating, and prints each side's median seconds and the ratio
engine / cost, under ``--sync step`` and ``micro``, dp 8, grad-accum 4, budget 16 K, on two
shapes: lognormal lengths (median 300, sigma 1: the scale bench's, ``--cost tokens``) and
long-tail lengths priced in Qwen2.5-0.5B's FLOPs. Threads: ``$VARPACK_THREADS`` or the CPUs.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, plan_arrays


def _count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def shapes(n: int) -> dict[str, tuple[np.ndarray, dict[str, str]]]:
    rng = np.random.default_rng(0)
    lognormal = np.clip(np.rint(np.exp(rng.normal(np.log(300), 1.0, n))), 1, 16384)
    tail = sample_lengths("long-tail", n, rng, max_len=16384)
    return {
        "lognormal, tokens": (np.sort(lognormal.astype(np.int64)), {}),
        "long-tail, Qwen2.5-0.5B FLOPs": (
            np.sort(tail.astype(np.int64)),
            {"cost": "flops", "model_preset": "qwen2.5-0.5b"},
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="8M")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = _count(args.samples)
    print(f"{n:,} samples, dp 8, grad-accum 4, budget 16 K; threads "
          f"{os.environ.get('VARPACK_THREADS', 'default')}; median of {args.repeat}")  # fmt: skip
    for name, (lens, extra) in shapes(n).items():
        ids = np.arange(len(lens))
        for sync in ("step", "micro"):
            took: dict[str, list[float]] = {"cost": [], "engine": []}
            for _ in range(args.repeat):
                for compose in took:
                    cfg = PlanConfig(max_tokens=16384, dp=8, grad_accum=4, order="shuffle",
                                     compose=compose, sync=sync, **extra)  # type: ignore[arg-type]  # fmt: skip
                    t = time.perf_counter()
                    plan_arrays(ids, lens, cfg)
                    took[compose].append(time.perf_counter() - t)
            c, e = float(np.median(took["cost"])), float(np.median(took["engine"]))
            print(f"{name:32} {sync:5}  cost {c:6.2f} s  engine {e:6.2f} s  engine / cost "
                  f"{e / c:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
