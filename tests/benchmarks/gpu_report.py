"""The GPU benchmark's rows and its report: which rows ``bench_gpu.py`` runs, in what order, what
each is compared with, and the ratios and Markdown table made of their figures.

A row is a plan (packed, ``--max-shapes``, ``--pack-to``, padded fixed or length-grouped), an
attention path and a compile mode; the two references (eager and compiled) are full-length causal
rows. Every row is compared with the reference of its own compile mode, and the best eager
varpack row with the padded baselines (eager too: like with like). Needs no GPU and runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from varpack.torch.model import param_count_str


@dataclass(frozen=True)
class Row:
    name: str
    plan: str  # key of the prepared plans ("" for the references)
    attention: str
    compile: str = "none"  # none | static | dynamic
    varpack: bool = True  # a packed row (counts for "best varpack row")


def make_rows(budget: int, ga: int, shapes: int) -> list[Row]:
    """The benchmark's rows, named after the budget, grad-accum and shape limit in use."""
    k = f"{budget // 1024}K" if budget >= 1024 else str(budget)
    return [
        Row(f"packed {k}, ga {ga}, mask", "packed", "mask"),
        Row(f"packed {k}, ga {ga}, varlen", "packed", "varlen"),
        Row(f"packed {k}, ga {ga}, flex", "packed", "flex"),
        Row(f"packed --max-shapes {shapes}, varlen", "shapes", "varlen"),
        Row(f"packed --pack-to {budget}, flex", "packto", "flex"),
        Row("padded fixed 4 random, per-sample mask", "fixed", "mask", varpack=False),
        Row("padded fixed 4 random, is_causal", "fixed", "causal", varpack=False),
        Row(f"padded {k} length-grouped, is_causal", "grouped", "causal", varpack=False),
        Row(f"packed --max-shapes {shapes}, --compile static", "shapes", "auto", "static"),
        Row(f"packed {k}, --compile dynamic", "packed", "auto", "dynamic"),
        Row(f"reference: full-length causal rows of {budget}", "", "causal", varpack=False),
        Row("reference: full-length causal rows, --compile static", "", "causal", "static", False),
    ]


REFERENCE, COMPILED_REFERENCE = 10, 11  # indices of the reference rows (eager, compiled)
BASELINES = {"vs_padded_random_mask": 5, "vs_padded_random_causal": 6, "vs_padded_length_grouped": 7}  # fmt: skip
# Run order (the time budget may cut the tail): eager rows, the references, the compiled rows;
# the reader share runs before the first compiled row.
ORDER = [1, 2, 0, 3, 4, 5, 6, 7, REFERENCE, COMPILED_REFERENCE, 8, 9]


def reference_of(row: Row) -> int:
    """The reference a row is compared with: the one of its compile mode."""
    return REFERENCE if row.compile == "none" else COMPILED_REFERENCE


def _ok(results: dict, k: int) -> bool:
    return results.get(k, {}).get("status") == "ok"


def best_row(rows: list[Row], results: dict, compiled: bool = True) -> int | None:
    """The varpack row with the most real tokens/s (``compiled=False``: among eager rows)."""
    ok = [
        k
        for k, r in enumerate(rows)
        if r.varpack and (compiled or r.compile == "none") and _ok(results, k)
    ]
    return max(ok, key=lambda k: results[k]["tokens_per_s"]) if ok else None


def ratios(rows: list[Row], results: dict) -> dict:
    """Every row as a share of the reference of its compile mode (in place); the best eager
    varpack row against the baselines (eager too: like with like)."""
    for k in results:
        ref = reference_of(rows[k])
        if _ok(results, k) and _ok(results, ref):
            results[k]["vs_reference"] = results[k]["tokens_per_s"] / results[ref]["tokens_per_s"]
    best, eager = best_row(rows, results), best_row(rows, results, compiled=False)
    out: dict[str, Any] = {"best_varpack_row": rows[best].name if best is not None else None,
                           "best_eager_row": rows[eager].name if eager is not None else None}  # fmt: skip
    for key, k in BASELINES.items():
        if eager is not None and _ok(results, k):
            out[key] = results[eager]["tokens_per_s"] / results[k]["tokens_per_s"]
    return out


def markdown(report: dict) -> str:
    peak = report["peak_tflops"]
    lines = [f"# GPU benchmark ({report['device']}, torch {report['torch']})", "",
             f"Model {report['preset']} ({param_count_str(report['params'])} params), {report['dtype']}, budget "
             f"{report['budget']} tokens, grad-accum {report['grad_accum']}, {report['warmup_steps']} "
             f"warm-up + {report['steps']} timed steps. MFU over {peak or 'n/a'} TFLOP/s.", "",
             "| # | row | attention | real tokens/s | padded | peak GiB | MFU | recompiles | vs reference |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in report["rows"].items():
        i = r["row"]
        if r.get("status") != "ok":
            why = r["status"] + (f" ({r['detail']})" if "detail" in r else "")
            lines.append(f"| {i} | {name} | {why} | | | | | | |")
            continue
        mfu = f"{r['tflops'] / peak:.1%}" if peak else "n/a"
        gib = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "n/a"
        vs = f"{r['vs_reference']:.2f}" if "vs_reference" in r else "n/a"
        lines.append(f"| {i} | {name} | {r['attention']} | {r['tokens_per_s']:,.0f} | "
                     f"{r['padded_frac']:.1%} | {gib} | {mfu} | {r['recompiles']} | {vs} |")  # fmt: skip
    rat, rd = report["ratios"], report["reader"]
    lines += ["", "vs reference: against the full-length rows of the same compile mode (eager or "
              "compiled); a reference, not a bound: short samples cost less attention per token.",
              "", f"Best varpack row: {rat.get('best_varpack_row')}. Against the padded "
              f"baselines (eager), the best eager row: {rat.get('best_eager_row')}."]  # fmt: skip
    for key, value in rat.items():
        if key.startswith("vs_") and value is not None:
            lines.append(f"- {key.replace('_', ' ')}: {value:.2f}x")
    if "share" in rd:
        lines.append(f"- reader's share ({rd['row']}, {report['workers']} DataLoader workers): "
                     f"{rd['share']:.1%} of the loop "
                     f"({'within' if rd['ok'] else 'over'} the 2 % target)")  # fmt: skip
    return "\n".join(lines) + "\n"
