"""Calibrate the memory and time models on micro-batches that plans make, and test them on others.

    PYTHONPATH=$PWD python tests/benchmarks/bench_calibrate_gpu.py --out bench-out/calib   # one GPU
    python tests/benchmarks/bench_calibrate_gpu.py --device cpu --quick --out X            # smoke run

Measures training steps (forward + backward, bf16 autocast on CUDA, torch's varlen attention) of
the ``100m`` reference model on micro-batches of three kinds:

* **chat rows**: varpack plans of the long-SFT tail (many short samples in a row);
* **rollout rows**: plans of RL rollouts (a few long samples in a row; at budgets below a
  sample's length its pieces, ``--oversize split``);
* **single pieces**: one sample filling its row, 1 K to 32 K tokens (a piece of a split document).

The packed kinds come from plans at budgets of 1 K to 32 K (``gpu_ranks_plans.py``: shuffled,
pad multiple 64), a few micro-batches of each spread over the plan. Each micro-batch: the median
step time of ``--reps`` passes (CUDA events; no pass after the first starts past
``--time-budget``, counted from the start) and, on CUDA, the peak memory above the idle model.
Writes OUT.csv (``tokens,samples,flops,peak_memory,step_time``; FLOPs as ``--cost flops`` counts
them), then runs ``varpack calibrate OUT.csv OUT.json --holdout 3``: the rows ordered by kind and
size, every third held out of the fit. OUT.json is a calibration file a plan takes
(``--time-per-flop``, ``--time-fixed``, ``--memory-per-token``, ``--memory-fixed``).

Then the bench asks whether the data need a term that ``a * flops + b`` lacks: it fits, on the
same rows, ``+ c * samples`` (a cost per sample in a row) and separate slopes for the linear and
the attention FLOPs, and reports each one's held-out error, overall and per kind, and the error of
a model fitted on single pieces alone (what the earlier calibration did) on the plans' rows; and
the time model of ``varpack.plan.timefit``, ``a_lin linear + a_attn attention + c samples + b``
with the model's exact FLOPs (``gpu_steps.spec_of``: LM head, causal attention) by non-negative
least squares on the relative error, beside ``a flops + b`` fitted the same way. A term is called
needed when it lowers the held-out mean error of ``a * flops + b`` by at least 2 points and a
quarter.
Tables: OUT.md; figures: OUT-fits.json. On the CPU there is no allocator peak (time only), and
the figures are a smoke run. Without CUDA (and without ``--device cpu``) it says so and exits 0.
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

from gpu_ranks_plans import PAD, long_sft, rollouts, varpack_plan  # noqa: E402
from gpu_steps import (  # noqa: E402
    Stepper,
    device_name,
    dims_of,
    flops_parts,
    pick_device,
    spec_of,
    steady,
)

from varpack.errors import VarpackError  # noqa: E402
from varpack.plan.models import ModelDims  # noqa: E402
from varpack.plan.timefit import TERMS, Features, fit_time, micro_features  # noqa: E402

GPU_SIZES = [1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 20480, 24576, 32768]
CPU_SIZES = [64, 128, 192, 256, 384, 512]
KINDS = ("chat rows", "rollout rows", "single pieces")
#: candidate time models: name -> the columns of the least-squares fit (1 = the fixed term)
CANDIDATES = {
    "a*flops + b": ("flops", "one"),
    "a*flops + b + c*samples": ("flops", "one", "samples"),
    "a1*linear + a2*attention + b": ("linear", "attention", "one"),
}
NEEDED = (2.0, 0.25)  # points and share of the base model's held-out mean error
#: the time model of ``varpack.plan.timefit`` (exact FLOPs of the model's spec, NNLS on the
#: squares of the relative error), and ``a*flops + b`` fitted the same way on the same rows
TIMEFIT = "a_lin*linear + a_attn*attention + c*samples + b (NNLS)"
TIMEFIT_LINE = "a*flops + b (exact FLOPs, as NNLS)"


def micro_batches(sizes: list[int], per_budget: int, dims: ModelDims) -> list[dict[str, Any]]:
    """The micro-batches to measure: ``{"kind", "lens", "pad_to"}``, by kind and size."""
    top = sizes[-1]
    out: list[dict[str, Any]] = []
    for kind, make, n in (("chat rows", long_sft, 3000), ("rollout rows", rollouts, 600)):
        lens = make(n, top // 2, 2)  # the 16 K shapes on a GPU, scaled down on the CPU
        for budget in sizes[::2] + ([top] if len(sizes) % 2 == 0 else []):
            s = varpack_plan(lens, budget, 1, dims, order="shuffle", oversize="split")
            s = s.take(per_budget)
            out += [{"kind": kind, "lens": s.micro(i), "pad_to": int(s.pad_to[i])}
                    for i in range(len(s.pad_to))]  # fmt: skip
    out += [{"kind": "single pieces", "lens": np.array([t]), "pad_to": -(-t // PAD) * PAD}
            for t in sizes]  # fmt: skip
    return out


def measure(stepper: Stepper, micro: list[dict[str, Any]], reps: int, dims: ModelDims,
            deadline: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each micro-batch's median step time (no pass after the first starts past ``deadline``),
    peak memory (CUDA) and FLOPs."""
    batches = [stepper.batch(m["lens"], m["pad_to"]) for m in micro]
    secs = stepper.time(batches, reps=reps, deadline=deadline)
    exact = micro_features(np.concatenate([m["lens"] for m in micro]),
                           np.cumsum([0] + [len(m["lens"]) for m in micro]),
                           np.array([m["pad_to"] for m in micro]),
                           spec_of(stepper.preset))  # fmt: skip
    rows = []
    for i, (m, b, sec) in enumerate(zip(micro, batches, secs, strict=True)):
        lin, att = flops_parts(m["lens"], m["pad_to"], dims)
        rows.append({"kind": m["kind"], "tokens": int(m["lens"].sum()), "samples": len(m["lens"]),
                     "pad_to": m["pad_to"], "linear": lin, "attention": att, "flops": lin + att,
                     "exact_linear": float(exact.linear[i]),
                     "exact_attention": float(exact.attention[i]),
                     "peak_memory": stepper.peak_memory(b), "step_time": float(sec)})  # fmt: skip
        print(f"{m['kind']:>13} {rows[-1]['tokens']:>6} tokens, {len(m['lens']):>4} samples: "
              f"{sec * 1e3:8.2f} ms", flush=True)  # fmt: skip
    return sorted(rows, key=lambda r: (KINDS.index(r["kind"]), r["tokens"]))


def write_csv(rows: list[dict[str, Any]], path: Path, cuda: bool) -> None:
    cols = ["tokens", "samples", "flops", "peak_memory", "step_time"]
    if not cuda:
        cols.remove("peak_memory")
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows([r[c] for c in cols] for r in rows)


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred - y) / y * 100
    return {"mean_pct": float(rel.mean()), "max_pct": float(rel.max())} if len(y) else {}


def fit_candidates(rows: list[dict[str, Any]], holdout: int = 3) -> dict[str, Any]:
    """Each candidate's coefficients and its held-out errors (all rows, per kind), fitted on the
    rows ``varpack calibrate --holdout`` fits on; and ``a*flops + b`` fitted on single pieces
    alone, judged on the plans' rows."""
    y = np.array([r["step_time"] for r in rows])
    kind = np.array([r["kind"] for r in rows])
    test = np.zeros(len(rows), bool)
    test[holdout - 1 :: holdout] = True
    out: dict[str, Any] = {}
    for name, cols in CANDIDATES.items():
        x = np.array([[1.0 if c == "one" else float(r[c]) for c in cols] for r in rows])
        coef = np.linalg.lstsq(x[~test], y[~test], rcond=None)[0]
        pred = x @ coef
        out[name] = {"coef": dict(zip(cols, coef.tolist(), strict=True)),
                     "held_out": _errors(pred[test], y[test]),
                     "by_kind": {k: _errors(pred[test & (kind == k)], y[test & (kind == k)])
                                 for k in KINDS}}  # fmt: skip
    base = out["a*flops + b"]["held_out"].get("mean_pct", 0.0)
    for name in list(CANDIDATES)[1:]:
        gain = base - out[name]["held_out"].get("mean_pct", base)
        out[name]["needed"] = bool(gain >= NEEDED[0] and gain >= NEEDED[1] * base)
    out.update(_timefit(rows, y, kind, holdout, base))
    single = kind == "single pieces"
    if single.sum() >= 2 and (~single).any():
        x = np.array([[float(r["flops"]), 1.0] for r in rows])
        coef = np.linalg.lstsq(x[single], y[single], rcond=None)[0]
        out["single pieces only -> plan rows"] = _errors(x[~single] @ coef, y[~single])
    return out


def _timefit(rows: list[dict[str, Any]], y: np.ndarray, kind: np.ndarray, holdout: int,
             base: float) -> dict[str, Any]:  # fmt: skip
    """The four-term model of ``varpack.plan.timefit`` and its ``a*flops + b``, as candidates."""
    f = Features(*(np.array([float(r[c]) for r in rows])
                   for c in ("exact_linear", "exact_attention", "samples")))  # fmt: skip
    try:
        t = fit_time(f, y, kind, holdout)
    except VarpackError as exc:
        return {TIMEFIT: {"refused": str(exc)}}
    out = {}
    for name, g, coef in ((TIMEFIT_LINE, t["flops_line"], ("time_per_flop", "time_fixed")),
                          (TIMEFIT, t, TERMS)):  # fmt: skip
        if "refused" in g:
            out[name] = {"refused": g["refused"]}
            continue
        gain = base - g["time_error_held_out"].get("mean_pct", base)
        out[name] = {"coef": {c: g[c] for c in coef}, "held_out": g["time_error_held_out"],
                     "by_kind": g["time_error_held_out_by_kind"],
                     "needed": bool(gain >= NEEDED[0] and gain >= NEEDED[1] * base)}  # fmt: skip
    return out


def markdown(report: dict[str, Any]) -> str:
    fits, cal = report["fits"], report["calibration"]
    lines = [f"# Time model on plans' micro-batches ({report['device']}, torch {report['torch']})",
             "", f"Model {report['preset']}, {report['rows']} micro-batches "
             f"({', '.join(f'{n} {k}' for k, n in report['kinds'].items())}), median of "
             f"{report['reps']}; every third row (by kind and size) held out.", ""]  # fmt: skip
    if "error" in cal:
        lines += [f"{cal['error']}: no calibration file.", ""]
    mem = cal.get("memory_error_held_out")
    if mem:
        lines += [f"Memory A*S + B: {cal['memory_per_token']:,.0f} B/token + "
                  f"{cal['memory_fixed'] / 2**20:,.0f} MiB, held-out error {mem['mean_pct']:.2f} % "
                  f"(max {mem['max_pct']:.2f} %).", ""]  # fmt: skip
    lines += ["| time model | held-out error mean / max | " + " | ".join(KINDS) + " | needed |",
              "|---|---|" + "---|" * (len(KINDS) + 1)]  # fmt: skip
    for name in [*CANDIDATES, TIMEFIT_LINE, TIMEFIT]:
        f = fits.get(name, {"refused": "not fitted"})
        if "refused" in f:
            lines.append(f"| {name} | refused: {f['refused']} |" + " |" * (len(KINDS) + 1))
            continue
        h = f["held_out"]
        kinds = [f"{f['by_kind'][k]['mean_pct']:.1f} %" if f["by_kind"].get(k) else "-"
                 for k in KINDS]  # fmt: skip
        need = {True: "yes", False: "no"}.get(f.get("needed"), "(base)")
        lines.append(f"| {name} | {h['mean_pct']:.1f} % / {h['max_pct']:.1f} % | "
                     + " | ".join(kinds) + f" | {need} |")  # fmt: skip
    single = fits.get("single pieces only -> plan rows")
    if single:
        lines += ["", f"a*flops + b fitted on single pieces alone: error on the plans' rows "
                  f"{single['mean_pct']:.1f} % (max {single['max_pct']:.1f} %)."]  # fmt: skip
    if report["device"] == "cpu":
        lines += ["", "CPU smoke run: these figures say nothing about a GPU."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="OUT.csv, OUT.json, OUT.md, OUT-fits.json")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--preset", default=None, help="reference model preset (100m; quick: tiny)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--reps", type=int, default=None, help="passes per micro-batch (5; quick: 1)")
    ap.add_argument("--per-budget", type=int, default=None, help="micro-batches per budget")
    ap.add_argument("--quick", action="store_true", help="fewer sizes: a smoke run")
    ap.add_argument("--time-budget", type=float, default=150.0,
                    help="s from the start; no repetition starts after it (one always runs)")  # fmt: skip
    args = ap.parse_args(argv)
    start = time.perf_counter()
    device = pick_device(args.device)
    if device is None:
        print("bench_calibrate_gpu: no CUDA device here; not yet measured (--device cpu runs it)")
        return 0
    cuda = device.type == "cuda"
    preset = args.preset or ("100m" if cuda and not args.quick else "tiny")
    sizes = GPU_SIZES if cuda else CPU_SIZES
    if args.quick:
        sizes = sizes[::2]
    reps = args.reps or (1 if args.quick else 5)
    dims = dims_of(preset)
    t = time.perf_counter()
    micro = micro_batches(sizes, args.per_budget or (2 if args.quick else 3), dims)
    print(f"bench_calibrate_gpu: {len(micro)} micro-batches in {time.perf_counter() - t:.1f}s")
    stepper = Stepper(preset, device, args.dtype)
    with steady(device):
        stepper.warm_up(sizes[-1])
        rows = measure(stepper, micro, reps, dims, start + args.time_budget)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out.with_suffix(".csv"), out.with_suffix(".json")
    write_csv(rows, csv_path, cuda)
    from varpack.cli import main as cli

    calibration: dict[str, Any] = {}
    try:
        cli.main(["calibrate", str(csv_path), str(json_path), "--holdout", "3", "--overwrite"],
                 prog_name="varpack")  # fmt: skip
    except SystemExit as exc:  # a fit varpack refuses is a result too (its line is printed above)
        if exc.code:
            calibration = {"error": f"varpack calibrate refused the fit (exit {exc.code})"}
    if not calibration:
        calibration = json.loads(json_path.read_text())
    report = {"device": device_name(device), "torch": torch.__version__, "preset": preset,
              "reps": reps, "rows": len(rows),
              "kinds": {k: sum(r["kind"] == k for r in rows) for k in KINDS},
              "calibration": calibration, "fits": fit_candidates(rows),
              "measured": rows}  # fmt: skip
    out.with_name(out.name + "-fits.json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
