"""What ranks wait for, on real kernels: dp ranks simulated on one GPU, under both sync models.

    PYTHONPATH=$PWD python tests/benchmarks/bench_gpu_ranks.py --out bench-out/ranks   # one GPU
    python tests/benchmarks/bench_gpu_ranks.py --quick --device cpu --out X            # smoke run

Under DDP with ``no_sync`` during accumulation ranks meet once per optimizer step: a step costs
its slowest rank's sum (``step``). Under FSDP / ZeRO-3 every micro-batch all-gathers the
parameters, so ranks meet at every micro-batch: a step costs the sum over its micro-batch slots
of the slowest rank in each slot (``micro``). For each plan (``gpu_ranks_plans.py``: varpack
shuffled at grad-accum 1 and 4 under each ``--sync``, curriculum, and two peers built here, KK by
tokens as verl does and sorted greedy packing), on the long-SFT tail and the RL-rollout shape,
dp 8, budget 16 K: the plan's steps (``--slots`` micro-batches per rank, spread evenly over the
plan) run rank after rank through the reference model (``100m`` preset, forward + backward, bf16,
each micro-batch timed with CUDA events after a warm-up). Each row reports, under both models,

* the measured time against its ideal (the sum of the measured micro-batch times over dp: no
  rank ever waits), and real tokens per second of the simulated job;
* the same ratio predicted by the cost model for the same micro-batches: ``--cost flops``, and a
  calibrated ``--cost time`` (``a * flops + b``), with the time model's error on the seconds.

The time model comes from ``--calib`` (the JSON of ``bench_calibrate_gpu.py``), else from a
calibration set measured first (micro-batches of plans with another seed, at the budget, half and
a quarter of it), fitted by varpack's own ``calibrate``. Rows not started within
``--time-budget`` (seconds from the start) are skipped and say so. Results: OUT.md, OUT.json.
Without CUDA (and without ``--device cpu``) it says so and exits 0. Needs torch, numpy, numba
and varpack; not polars, flash-attn or transformers. CPU figures are a smoke run: they mean
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however started

from gpu_ranks_plans import SHAPES, Schedule, all_plans, sync_times, varpack_plan  # noqa: E402
from gpu_steps import Stepper, device_name, dims_of, micro_flops, pick_device, steady  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.plan.calibrate import calibrate  # noqa: E402
from varpack.plan.models import ModelDims  # noqa: E402

SYNCS = ("step", "micro")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    p.add_argument("--quick", action="store_true", help="tiny model and sizes: a smoke run")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--preset", default=None, help="reference model preset (100m; quick: tiny)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--budget", type=int, default=None, help="tokens per micro-batch (16384)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel ranks (8; quick: 4)")
    p.add_argument("--slots", type=int, default=None, help="micro-batches per rank measured (16)")
    p.add_argument("--samples", type=int, default=None, help="long-SFT samples (rollouts: 1/10)")
    p.add_argument("--reps", type=int, default=1, help="passes per row (median per micro-batch)")
    p.add_argument("--calib", default=None, help="time model JSON of bench_calibrate_gpu.py")
    p.add_argument("--time-budget", type=float, default=400.0, help="s from the start")
    args = p.parse_args(argv)
    quick = {"preset": "tiny", "budget": 256, "slots": 2, "samples": 2000, "dp": 4}
    full = {"preset": "100m", "budget": 16384, "slots": 16, "samples": 30000, "dp": 8}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def time_model(args: argparse.Namespace, stepper: Stepper, dims: ModelDims) -> dict[str, Any]:
    """``(a, b)`` of ``--cost time``: from ``--calib``, else fitted here on a calibration set."""
    if args.calib:
        got = json.loads(Path(args.calib).read_text())
        return {"time_per_flop": got["time_per_flop"], "time_fixed": got["time_fixed"],
                "source": args.calib, "held_out": got.get("time_error_held_out")}  # fmt: skip
    lens_all, pads = [], []
    for make in SHAPES.values():
        lens = make(max(args.samples // 10, 400), args.budget, 1)
        for b in (args.budget, args.budget // 2, args.budget // 4):
            s = varpack_plan(lens, b, args.dp, dims, order="shuffle", oversize="split").take(2)
            for i in range(min(2 if args.quick else 4, len(s.pad_to))):
                lens_all.append(s.micro(i))
                pads.append(int(s.pad_to[i]))
    batches = [stepper.batch(x, t) for x, t in zip(lens_all, pads, strict=True)]
    secs = stepper.time(batches, reps=1 if args.quick else 2)
    flops = np.array([micro_flops(x, t, dims) for x, t in zip(lens_all, pads, strict=True)])
    tokens = np.array([int(x.sum()) for x in lens_all], dtype=np.float64)
    source = f"fitted here on {len(secs)} micro-batches (plans of seed 1)"
    try:
        fit = calibrate(tokens, None, secs, flops, holdout=3)
    except InputError as exc:  # noisy times (a shared CPU): seconds per FLOP on average instead
        fit = {"time_per_flop": float(secs.sum() / flops.sum()), "time_fixed": 0.0}
        source += f"; {exc}; through the origin"
    return {"time_per_flop": fit["time_per_flop"], "time_fixed": fit["time_fixed"],
            "source": source, "held_out": fit.get("time_error_held_out")}  # fmt: skip


def measure_row(stepper: Stepper, s: Schedule, args: argparse.Namespace, dims: ModelDims,
                model: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Run the schedule's micro-batches; measured and predicted times under both models."""
    n = len(s.pad_to)
    lens = [s.micro(i) for i in range(n)]
    batches = [stepper.batch(x, int(t)) for x, t in zip(lens, s.pad_to, strict=True)]
    first = np.ones(n, bool)
    first[1:] = (s.step[1:] != s.step[:-1]) | (s.rank[1:] != s.rank[:-1])
    secs = stepper.time(batches, new_step=first.tolist(), reps=args.reps)
    del batches
    flops = np.array([micro_flops(x, int(t), dims) for x, t in zip(lens, s.pad_to, strict=True)])
    pred = model["time_per_flop"] * flops + model["time_fixed"]
    meas, fl, tm = (sync_times(v, s, args.dp) for v in (secs, flops, pred))
    tokens = int(s.lens.sum())
    micro_err = np.abs(pred - secs) / secs * 100
    return {
        "steps": s.steps, "micro_batches": n, "tokens": tokens,
        "padded_frac": 1 - tokens / float(s.pad_to.sum()),
        "max_tokens": int(max(int(x.sum()) for x in lens)),
        "measured_s": meas, "flops": fl, "time_model_s": tm,
        "vs_ideal": {src: {m: d[m] / d["ideal"] for m in SYNCS}
                     for src, d in (("measured", meas), ("flops", fl), ("time_model", tm))},
        "tokens_per_s": {m: tokens / meas[m] for m in SYNCS},
        "time_model_error_pct": {**{m: (tm[m] - meas[m]) / meas[m] * 100 for m in SYNCS},
                                 "micro_batch_mean": float(micro_err.mean()),
                                 "micro_batch_max": float(micro_err.max())},
    }  # fmt: skip


def run(args: argparse.Namespace, device: torch.device, start: float) -> dict[str, Any]:
    stepper = Stepper(args.preset, device, args.dtype)
    dims = dims_of(args.preset)
    plans = {}
    for shape, make in SHAPES.items():
        n = args.samples if shape == "long-SFT tail" else max(args.samples // 10, 400)
        plans[shape] = all_plans(make(n, args.budget, 0), args.budget, args.dp, dims)
    print(f"bench_gpu_ranks: plans in {time.perf_counter() - start:.1f}s", flush=True)
    stepper.warm_up(args.budget)
    model = time_model(args, stepper, dims)
    rows = [{"shape": shape, "plan": name} for shape, by in plans.items() for name in by]
    # run plan by plan, the shapes in turn: a time budget that ends early cuts both shapes alike
    for row in sorted(rows, key=lambda r: list(plans[r["shape"]]).index(r["plan"])):
        if time.perf_counter() - start > args.time_budget:
            row["status"] = "skipped: time budget"
            continue
        sched = plans[row["shape"]][row["plan"]]
        k = int(sched.slot.max()) + 1
        print(f"bench_gpu_ranks: {row['shape']}: {row['plan']} ...", flush=True)
        row.update(measure_row(stepper, sched.take(-(-args.slots // k)), args, dims, model))
        row["status"] = "ok"
    return {"device": device_name(device), "torch": torch.__version__, "preset": args.preset,
            "dtype": str(stepper.dtype).removeprefix("torch."), "budget": args.budget,
            "dp": args.dp, "slots": args.slots, "reps": args.reps, "time_model": model,
            "rows": rows}  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    tm = r["time_model"]
    held = tm.get("held_out") or {}
    lines = [
        f"# Ranks on real kernels ({r['device']}, torch {r['torch']})", "",
        f"Model {r['preset']}, {r['dtype']}, budget {r['budget']} tokens, dp {r['dp']} simulated "
        f"on one device, {r['slots']} micro-batches per rank per row. Time model a = "
        f"{tm['time_per_flop']:.4g} s/FLOP, b = {tm['time_fixed']:.4g} s ({tm['source']}"
        + (f"; held-out error {held['mean_pct']:.1f} %, max {held['max_pct']:.1f} %" if held else "")
        + "). Time vs ideal: the job's time over (sum of micro-batch times / dp).", "",
        "| shape | plan | µb | step sync: measured | FLOPs | time model | micro sync: measured | "
        "FLOPs | time model | tokens/s (step / micro) | time-model error (step / micro / per µb) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in r["rows"]:
        if row["status"] != "ok":
            lines.append(f"| {row['shape']} | {row['plan']} | {row['status']} |" + " |" * 8)
            continue
        v, e, tps = row["vs_ideal"], row["time_model_error_pct"], row["tokens_per_s"]
        cells = [f"{v[src][m]:.3f}" for m in SYNCS for src in ("measured", "flops", "time_model")]
        lines.append(
            f"| {row['shape']} | {row['plan']} | {row['micro_batches']} | " + " | ".join(cells)
            + f" | {tps['step']:,.0f} / {tps['micro']:,.0f} | {e['step']:+.1f} % / "
            f"{e['micro']:+.1f} % / {e['micro_batch_mean']:.1f} % |"
        )  # fmt: skip
    if r["device"] == "cpu":
        lines += ["", "CPU smoke run: these figures say nothing about a GPU."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    device = pick_device(args.device)
    if device is None:
        print("bench_gpu_ranks: no CUDA device here; skipped (--device cpu runs it on the CPU)")
        return 0
    with steady(device):
        report = run(args, device, start)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
