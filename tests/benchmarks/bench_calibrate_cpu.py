"""The four-term time model proved on this CPU: plans' micro-batches timed, fitted, held out.

    PYTHONPATH=$PWD python tests/benchmarks/bench_calibrate_cpu.py                 # ~4 min
    PYTHONPATH=$PWD python tests/benchmarks/bench_calibrate_cpu.py --quick         # < 1 min

Times forward + backward (fp32, one torch thread) of the reference model's ``small`` preset
(``TinyGPT``: 4 layers, hidden 256, 4 heads, GELU MLP 1024, vocab 8192, tied head) on the CPU,
over micro-batches of three kinds taken from real varpack plans (``bench_calibrate_gpu``'s
``micro_batches``: chat rows of the long-SFT tail, rollout rows of RL rollouts, single pieces).
A packed row runs its linear layers over the whole row and attention on each sample's own tokens
(the reader's ``segments`` backend: SDPA per sample, causal), the work a varlen kernel does. Each
micro-batch: the CPU seconds of the process (``time.process_time``: one thread, so on a dedicated
core the wall-clock time; on a shared one, time the process waits for the core is not counted),
the fewest of ``--reps`` passes over the list (no pass after the first starts past
``--time-budget`` seconds from the start).

Each row's features come from the model's spec (``gpu_steps.spec_of``) through
:func:`varpack.plan.timefit.micro_features`: linear FLOPs of the packed row, causal attention
FLOPs of its samples, its sample count. :func:`varpack.plan.timefit.fit_time` fits
``a_lin linear + a_attn attention + c sequences + b`` by non-negative least squares and, on the
same rows, ``a flops + b`` (``varpack calibrate``'s model), rows ordered by kind and size and
every third held out. Prints and writes the held-out error (mean / max) per kind and overall for
both, and the coefficients: OUT.csv (one row per micro-batch), OUT.json (the fit), OUT.md.

A shared CPU is noisy: wall-clock, the same row took 183 ms and 261 ms in one run while other
processes ran; CPU seconds and the fewest of several passes damp that (caches and memory
bandwidth stay shared). The figures prove the method (which terms a real step has), not a GPU's
coefficients.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however started

from bench_calibrate_gpu import KINDS, micro_batches  # noqa: E402
from gpu_steps import Stepper, dims_of, spec_of, steady  # noqa: E402

from varpack.errors import VarpackError  # noqa: E402
from varpack.plan.timefit import TERMS, Features, fit_time, micro_features  # noqa: E402

SIZES = [256, 512, 1024, 1536, 2048, 3072, 4096]
QUICK_SIZES = [256, 512, 1024, 2048]
HOLDOUT = 3
NEW, OLD = "a_lin·linear + a_attn·attention + c·sequences + b", "a·flops + b"
CALIBRATE = "a·flops + b, plain squares (`varpack calibrate`)"


def features(micro: list[dict[str, Any]], preset: str) -> Features:
    """The fit's columns for each micro-batch, from the preset's spec (vectorised)."""
    lens = np.concatenate([m["lens"] for m in micro]).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(m["lens"]) for m in micro])))
    pad_to = np.array([m["pad_to"] for m in micro])
    return micro_features(lens, offsets, pad_to, spec_of(preset))


def measure(preset: str, micro: list[dict[str, Any]], reps: int, deadline: float) -> np.ndarray:
    """CPU seconds of each micro-batch's forward + backward: the fewest of ``reps`` passes over
    the list (another process on a shared CPU only ever slows a pass down)."""
    device = torch.device("cpu")
    stepper = Stepper(preset, device, "fp32", clock=time.process_time)
    order = np.random.default_rng(0).permutation(len(micro))  # kinds and sizes interleaved:
    batches = [stepper.batch(micro[i]["lens"], micro[i]["pad_to"]) for i in order]  # no drift
    with steady(device):  # of the machine falls on one kind
        stepper.warm_up(max(m["pad_to"] for m in micro), n=2)
        secs = stepper.time(batches, reps=reps, deadline=deadline, reduce=min)
    out = np.empty(len(micro))
    out[order] = secs
    return out


def rows_of(micro: list[dict[str, Any]], f: Features, seconds: np.ndarray) -> list[dict[str, Any]]:
    """One row per micro-batch, ordered by kind and size (the order the holdout counts in)."""
    rows = [{"kind": m["kind"], "tokens": int(m["lens"].sum()), "samples": len(m["lens"]),
             "pad_to": int(m["pad_to"]), "linear_flops": float(f.linear[i]),
             "attention_flops": float(f.attention[i]), "step_time": float(seconds[i])}
            for i, m in enumerate(micro)]  # fmt: skip
    return sorted(rows, key=lambda r: (KINDS.index(r["kind"]), r["tokens"], r["samples"]))


def fit(rows: list[dict[str, Any]], holdout: int = HOLDOUT) -> dict[str, Any]:
    """:func:`fit_time` on the rows (squares of the relative error), with ``a flops + b`` as
    ``varpack calibrate`` fits it (plain squares) under ``calibrate``; a refusal is a result."""
    f = Features(*(np.array([r[k] for r in rows], dtype=np.float64)
                   for k in ("linear_flops", "attention_flops", "samples")))  # fmt: skip
    y = np.array([r["step_time"] for r in rows])
    kinds = [r["kind"] for r in rows]
    try:
        out = fit_time(f, y, kinds, holdout)
    except VarpackError as exc:
        return {"refused": str(exc)}
    out["calibrate"] = fit_time(f, y, kinds, holdout, objective="absolute")["flops_line"]
    return out


def _cell(e: dict[str, Any]) -> str:
    return f"{e['mean_pct']:.1f} % / {e['max_pct']:.1f} %" if e else "-"


def markdown(report: dict[str, Any]) -> str:
    got = report["fit"]
    head = (f"# Time model on the CPU ({report['model']}, torch {report['torch']}, "
            f"{report['threads']} thread)\n\n{report['rows']} micro-batches "
            f"({', '.join(f'{n} {k}' for k, n in report['kinds'].items())}), CPU seconds, the "
            f"fewest of {report['reps']} passes; rows by kind and size, every third held out; "
            f"measured in {report['seconds']:.0f} s.\n")  # fmt: skip
    if "refused" in got:
        return head + f"\nThe fit was refused: {got['refused']}\n"
    lines = [head, "Held-out error, mean / max:", "",
             "| time model | all | " + " | ".join(KINDS) + " |",
             "|---|---|" + "---|" * len(KINDS)]  # fmt: skip
    for name, g in ((CALIBRATE, got["calibrate"]), (OLD, got["flops_line"]), (NEW, got)):
        if "refused" in g:
            lines.append(f"| {name} | refused: {g['refused']} |" + " |" * len(KINDS))
            continue
        by = g["time_error_held_out_by_kind"]
        lines.append(f"| {name} | {_cell(g['time_error_held_out'])} | "
                     + " | ".join(_cell(by.get(k, {})) for k in KINDS) + " |")  # fmt: skip
    lines += ["", "Fitted on the squares of the relative error, but for the first row.", "",
              "Coefficients:", ""]  # fmt: skip
    for name in (CALIBRATE, OLD):
        line = got["calibrate" if name == CALIBRATE else "flops_line"]
        if "refused" not in line:
            lines.append(f"- {name}: a = {line['time_per_flop']:.4g} s/FLOP, "
                         f"b = {line['time_fixed'] * 1e3:.3g} ms")  # fmt: skip
    lines.append(f"- {NEW}: a_lin = {got['time_per_linear_flop']:.4g} s/FLOP, a_attn = "
                 f"{got['time_per_attention_flop']:.4g} s/FLOP, c = "
                 f"{got['time_per_sequence'] * 1e3:.3g} ms/sequence, b = "
                 f"{got['time_per_micro_batch'] * 1e3:.3g} ms"
                 + (f" (at 0: {', '.join(got['terms_at_zero'])})" if got["terms_at_zero"]
                    else ""))  # fmt: skip
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-out/calibrate_cpu", help="OUT.csv, OUT.json, OUT.md")
    ap.add_argument("--preset", default="small", help="reference model preset (small)")
    ap.add_argument("--reps", type=int, default=None, help="passes per micro-batch (4; quick: 2)")
    ap.add_argument("--per-budget", type=int, default=None, help="micro-batches per budget")
    ap.add_argument("--quick", action="store_true", help="fewer sizes: under a minute")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="s from the start; no pass starts after it (270; quick: 60)")  # fmt: skip
    args = ap.parse_args(argv)
    start = time.perf_counter()
    sizes = QUICK_SIZES if args.quick else SIZES
    reps = args.reps or (2 if args.quick else 4)
    budget = args.time_budget or (60.0 if args.quick else 270.0)
    micro = micro_batches(sizes, args.per_budget or (2 if args.quick else 3), dims_of(args.preset))
    print(f"bench_calibrate_cpu: {len(micro)} micro-batches of {args.preset}, "
          f"{sum(int(m['lens'].sum()) for m in micro):,} tokens, the fewest CPU seconds of "
          f"{reps} passes", flush=True)  # fmt: skip
    seconds = measure(args.preset, micro, reps, start + budget)
    rows = rows_of(micro, features(micro, args.preset), seconds)
    for r in rows:
        print(f"{r['kind']:>13} {r['tokens']:>5} tokens, {r['samples']:>3} samples: "
              f"{r['step_time'] * 1e3:8.1f} ms")  # fmt: skip
    report = {"model": spec_of(args.preset).describe(), "torch": torch.__version__,
              "threads": 1, "reps": reps, "rows": len(rows),
              "kinds": {k: sum(r["kind"] == k for r in rows) for k in KINDS},
              "seconds": time.perf_counter() - start, "terms": list(TERMS),
              "fit": fit(rows), "measured": rows}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out.with_suffix(".csv"))
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
