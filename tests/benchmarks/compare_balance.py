"""Balance of this checkout against an earlier commit, row by row, in the same run.

    python tests/benchmarks/compare_balance.py REF [--model M ...] [--full]
    python tests/benchmarks/compare_balance.py --compose engine [--model M ...] [--full]

Checks REF out into a temporary git worktree and plans the same rows with each side's code (a
child process per side, ``PYTHONPATH`` set to its checkout; the data comes from this checkout's
generators): the real-model sets of ``plan_balance.py`` (quick sizes unless ``--full``) and
bimodal 20K, heavy-bodied 10K and documents (split), at their grad-accums, both sync models, in
the packed and padded layouts and with ``--pp 4`` (grad-accum 4 and 16, step sync), each model's
``--cost flops``. Every plan is scored by ``real_cost.py`` (the model's own FLOPs) under its
sync. Prints each row that moved (time by more than 0.001, mixing by more than 0.02, a change in
micro-batches per rank and step), the count of rows worse by more than 0.003 (the gate a new
composer must pass), and on each side the rows outside the balance targets: time (grad-accum
>= 4 over 1.01x, 2 over 1.03x), micro-batches (over the fewest that hold the step + 5 %, or +1),
mixing (packed: over the shuffle floor + 0.05 and over 0.15), padded over packed + 0.03 (from
grad-accum 2). A side's rows take 20-60 s at quick sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("qwen2.5-0.5b", "mistral-7b-v0.1")
WORSE = 0.003


def _sets(full: bool) -> dict[str, tuple]:  # type: ignore[type-arg]
    from plan_balance import datasets, real_sets

    out = dict(real_sets(not full))
    for name, value in datasets(True).items():
        if name.startswith(("bimodal", "heavy-bodied 10K", "documents")):
            out[name] = value
    return out


def rows(models: list[str], full: bool, compose: str = "cost") -> dict[str, dict[str, float]]:
    """Every row's figures, planned by the ``varpack`` on ``sys.path`` (``compose``: the
    composer of the rows it composes)."""
    from plan_balance import fewest, make_for, shuffle_mixing
    from real_cost import RealModel, times

    out: dict[str, dict[str, float]] = {}
    for model in models:
        real = RealModel.of(model)
        for name, (lens, budget, dp, extra, ks) in _sets(full).items():
            for k in ks:
                runs = [(s, lay, 1) for s in (("step", "micro") if k > 1 else ("step",))
                        for lay in ("packed", "padded")]  # fmt: skip
                if k in (4, 16):
                    runs.append(("step", "packed", 4))
                for sync, layout, pp in runs:
                    kw = dict(grad_accum=k, sync=sync, layout=layout, pp=pp, **extra)
                    if layout == "packed" and pp == 1:
                        kw["compose"] = compose
                    arrays, stats = make_for(lens, budget, dp, {"model_preset": model}, **kw)
                    mb, least = fewest(arrays, budget)
                    key = f"{model} | {name} | K={k} {sync} | {layout if pp == 1 else 'pp 4'}"
                    out[key] = {"time": times(arrays, real)[sync], "mixing": stats["mixing"],
                                "floor": shuffle_mixing(arrays), "mb": mb, "fewest": least,
                                "k": k}  # fmt: skip
    return out


def misses(side: dict[str, dict[str, float]]) -> list[str]:
    """The rows outside the balance targets (see the module doc)."""
    out = []
    for key, r in side.items():
        k = int(r["k"])
        limit = 1.01 if k >= 4 else 1.03 if k == 2 else None
        if limit is not None and r["time"] > limit:
            out.append(f"time {r['time']:.4f}: {key}")
        allowed = r["fewest"] * 1.05 if r["fewest"] * 0.05 >= 1 else r["fewest"] + 1
        if r["mb"] > allowed + 1e-9:
            out.append(f"micro-batches {r['mb']:.2f} / fewest {r['fewest']:.2f}: {key}")
        if key.endswith("packed") and r["mixing"] > max(r["floor"] + 0.05, 0.15):
            out.append(f"mixing {r['mixing']:.3f} / floor {r['floor']:.3f}: {key}")
        if key.endswith("padded") and k >= 2:
            packed = side.get(key[: -len("padded")] + "packed")
            if packed is not None and r["time"] > packed["time"] + 0.03:
                out.append(f"padded {r['time']:.4f} / packed {packed['time']:.4f}: {key}")
    return out


def side(checkout: Path, models: list[str], full: bool, out: Path, compose: str = "cost"
         ) -> dict[str, dict[str, float]]:  # fmt: skip
    """The rows planned by ``checkout``'s code, in a child process."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, __file__, "--child", str(out), "--model", *models, "--compose", compose]
    subprocess.run(cmd + (["--full"] if full else []), check=True, env=env, cwd=checkout)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", nargs="?", help="the commit to compare with")
    ap.add_argument("--model", nargs="+", default=list(MODELS))
    ap.add_argument("--full", action="store_true", help="the real-model sets at full size")
    ap.add_argument(
        "--compose",
        default=None,
        help="compare this checkout's --compose cost with this composer instead",
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        args.child.write_text(json.dumps(rows(args.model, args.full, args.compose or "cost")))
        return
    if args.ref is None and args.compose is None:
        ap.error("give REF, the commit to compare with, or --compose NAME")
    if args.compose is not None:
        with tempfile.TemporaryDirectory() as tmp:
            ref = side(ROOT, args.model, args.full, Path(tmp) / "ref.json")
            this = side(ROOT, args.model, args.full, Path(tmp) / "this.json", args.compose)
        report(ref, this, f"--compose {args.compose} against --compose cost")
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.ref], check=True)  # fmt: skip
        try:
            ref = side(base, args.model, args.full, Path(tmp) / "ref.json")
            this = side(ROOT, args.model, args.full, Path(tmp) / "this.json")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)  # fmt: skip
    report(ref, this, f"this checkout vs {args.ref}")


def report(ref: dict[str, dict[str, float]], this: dict[str, dict[str, float]], what: str) -> None:
    """Each row that moved, the count worse and better, and each side's rows outside the
    targets."""
    print(f"balance rows: {what} (time in the model's FLOPs under the row's sync, over the "
          "ideal; mixing against its shuffle floor)")  # fmt: skip
    worse = better = 0
    for key, a in ref.items():
        b = this[key]
        dt, dm = b["time"] - a["time"], b["mixing"] - a["mixing"]
        worse += dt > WORSE
        better += dt < -0.001
        if abs(dt) > 0.001 or abs(dm) > 0.02 or abs(b["mb"] - a["mb"]) > 1e-9:
            print(f"  {key}: time {a['time']:.4f} -> {b['time']:.4f}, mixing "
                  f"{a['mixing']:.3f} -> {b['mixing']:.3f} (floor {b['floor']:.3f}), "
                  f"micro-batches {a['mb']:.2f} -> {b['mb']:.2f} (fewest {b['fewest']:.2f})")  # fmt: skip
    print(
        f"{len(ref)} rows: {worse} worse by more than {WORSE}, {better} better by more than 0.001"
    )
    for name, s in (("ref", ref), ("this", this)):
        missed = misses(s)
        print(f"{name}: {len(missed)} rows outside the targets")
        for line in missed:
            print(f"  {line}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
