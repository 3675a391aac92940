"""``varpack inspect``: a plan's figures as a table or JSON.

The figures are plan.json's stats (computed by :mod:`varpack.plan.figures.stats` when the plan was
made), read back with the checksums verified and laid out one per line. The four-panel figure of
``--plot`` is :mod:`varpack.manifest.plot`'s. A replanned plan (``varpack replan``) shows its
lineage: the parent it continues, from which step, and what changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from varpack.errors import VarpackError
from varpack.manifest.format import Plan, load_plan, read_meta
from varpack.plan.figures.stats import TIME_VS_IDEAL_LEGEND


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The plan's layout, config, input, stats and per-rank shape counts (JSON-ready)."""
    plan = load_plan(path, verify=True, full=True)  # every key shown below checked first
    meta = plan.meta
    return {
        "plan": str(path),
        "input": meta["input"],
        "layout": meta["layout"],
        "num_steps": meta["num_steps"],
        "config": meta["config"],
        "stats": meta["stats"],
        "dropped": len(meta.get("dropped") or []),
        **({"cp": meta["cp"]} if isinstance(meta.get("cp"), dict) else {}),
        **({"carry": meta["carry"]} if isinstance(meta.get("carry"), dict) else {}),
        **({"parent": lineage(plan)} if isinstance(meta.get("parent"), dict) else {}),
        **({"selection": meta["selection"]} if isinstance(meta.get("selection"), dict) else {}),
        "shape_lengths": meta.get("shape_lengths"),
        "ranks": [
            {
                "rank": r["rank"],
                "rows": r["rows"],
                "shapes": len(r.get("shapes", [])),
                "shape_list": r.get("shapes", []),
            }
            for r in meta["ranks"]
        ],
    }


_SHAPE_LINES = 8


def lineage(plan: Plan) -> dict[str, Any]:
    """A replanned plan's parent entry, with what changed from the parent (its layout and
    tokens per step, where the parent is still where plan.json records it)."""
    entry = dict(plan.meta["parent"])
    try:
        up = read_meta(Path(entry["plan"]))
    except (OSError, VarpackError):
        entry["found"] = False
        return entry
    s = up.get("stats") or {}
    entry.update(
        found=True,
        layout=up.get("layout"),
        num_steps=up.get("num_steps"),
        step_tokens=[s.get("step_tokens_min"), s.get("step_tokens_max")],
    )
    return entry


def _lineage_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    p = info.get("parent")
    if not p:
        return []
    lay, s = info["layout"], info["stats"]
    first = p["from_step"]
    row = (
        f"continues {p['plan']} from step {first:,} (steps {first:,} .. "
        f"{first + info['num_steps'] - 1:,})"
    )
    if not p.get("found"):
        return [("parent", row), ("", "(the parent is not where plan.json records it)")]
    up = p["layout"]
    tokens = (
        f"tokens / step {_n(p['step_tokens'][0])} .. {_n(p['step_tokens'][1])} in the parent, "
        f"{s['step_tokens_min']:,} .. {s['step_tokens_max']:,} here"
    )
    changed = (
        f"dp {up['dp']} x grad-accum {up['grad_accum']} -> dp {lay['dp']} x grad-accum "
        f"{lay['grad_accum']}; {p['num_steps']:,} steps in the parent; {tokens}"
    )
    return [("parent", row), ("", changed)]


def token_line(t: dict[str, Any] | None, lead: str = "tokens ") -> str:
    """Tokens kept, split and dropped, as counts and shares of all input tokens.

    >>> token_line({"total": 10, "kept": 9, "split": 4, "dropped": 1, "kept_share": 0.9,
    ...     "split_share": 0.4, "dropped_share": 0.1, "documents_split": 1, "pieces": 2})
    'tokens kept 9 (90.00%), split 4 (40.00%: 1 documents in 2 pieces), dropped 1 (10.00%)'
    """
    if not t:
        return f"{lead}kept ? (plan made before these figures)"
    return (
        f"{lead}kept {t['kept']:,} ({100 * t['kept_share']:.2f}%), split {t['split']:,} "
        f"({100 * t['split_share']:.2f}%: {t['documents_split']:,} documents in "
        f"{t['pieces']:,} pieces), dropped {t['dropped']:,} ({100 * t['dropped_share']:.2f}%)"
    )


def _shape_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """Lines about shapes: the largest shapes and the padding each costs, pp, blocks, warm-up."""
    s, cfg = info["stats"], info["config"]
    rows: list[tuple[str, str]] = []
    bound = f" (--max-shapes {cfg['max_shapes']})" if cfg.get("max_shapes") else ""
    per_rank = s["shapes_per_rank"]
    rows.append(
        (
            "shapes / rank",
            f"{min(per_rank):,} .. {max(per_rank):,}{bound}; {_n(s.get('num_shapes', '?'))} in all",
        )
    )
    if info.get("shape_lengths"):
        rows.append(("shape lengths", ", ".join(f"{x:,}" for x in info["shape_lengths"])))
    total_pad = max(s["padded_tokens"] - s["real_tokens"], 1)
    for i, sh in enumerate(s.get("shapes", [])[:_SHAPE_LINES]):
        b, t = sh["shape"]
        rows.append(
            (
                "largest shapes" if i == 0 else "",
                f"[{b}, {t:,}]: {sh['micro_batches']:,} micro-batches, padding {sh['padding']:,} tokens "
                f"({100 * sh['padding'] / max(sh['padded_tokens'], 1):.1f}% of the shape, "
                f"{100 * sh['padding'] / total_pad:.1f}% of all padding)",
            )
        )
    by_pad = sorted(s.get("shapes", []), key=lambda x: -x["padding"])[:3]
    if by_pad and len(s.get("shapes", [])) > _SHAPE_LINES:
        rows.append(
            (
                "costliest shapes",
                "; ".join(
                    f"[{x['shape'][0]}, {x['shape'][1]:,}] {x['padding']:,} tokens" for x in by_pad
                ),
            )
        )
    if s.get("pad_rows"):
        rows.append(("empty rows", f"{s['pad_rows']:,} (pad_rows), {s['pad_row_tokens']:,} tokens"))
    if "pp_extra_padding" in s:
        rows.append(
            (
                "pipeline",
                f"pp {cfg['pp']}: one shape per (step, rank) costs {s['pp_extra_padding']:,} tokens "
                f"({100 * s['pp_extra_padding_ratio']:.2f}% of processed tokens)",
            )
        )
    if "blocks" in s:
        b = s["blocks"]
        rows.append(
            (
                "blocks",
                f"{b['blocks']:,} blocks of {b['block_len']:,}, {b['blocks_per_batch']} per micro-batch; "
                f"padding inside blocks {b['block_padding']:,} ({100 * b['block_padding_ratio']:.2f}%), "
                f"{b['empty_blocks']:,} empty blocks",
            )
        )
    warm = s.get("warmup_rows", [])
    if cfg.get("warmup") == "reorder" and warm:
        rows.append(
            ("warm-up", f"reorder: first {min(warm)} .. {max(warm)} micro-batches per rank")
        )
    else:
        rows.append(("warm-up", f"{cfg.get('warmup', 'list')}: shapes listed in plan.json"))
    return rows


def _moved_rows(s: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """How far a shuffled plan moved samples from their random positions."""
    if "moved_steps_mean" not in s:
        return []
    return [
        (
            "moved",
            f"mean {s['moved_steps_mean']:.2f}, p99 {s['moved_steps_p99']}, max "
            f"{s['moved_steps_max']:.1f} steps from the random position "
            f"({s['moved_windows_max']:.2f} windows of {cfg.get('shuffle_window')} steps at most)",
        )
    ]


def _balance_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The bound on time vs ideal and the fill given up for balance (absent in older plans)."""
    if "time_vs_ideal_bound" not in s:
        return []
    f = s["fill_given_up"]
    return [
        (
            "bound",
            f"{s['time_vs_ideal_bound']:.4f} (no composition of these windows' samples into "
            f"as many steps does better; the plan is {s['time_vs_ideal'] - s['time_vs_ideal_bound']:.4f} above)",
        ),
        (
            "fill given up",
            f"mean {100 * f['mean']:.2f}%, max {100 * f['max']:.2f}% of a step's budget "
            "(below the median step, to level its ranks)",
        ),
    ]


def _n(x: Any) -> str:
    """An integer with thousands separators (anything else as it is)."""
    return f"{x:,}" if isinstance(x, int) else str(x)


def _fill_row(s: dict[str, Any]) -> tuple[str, str]:
    """Budget fill: real tokens / (micro-batches x budget tokens); absent in older plans."""
    fill = s.get("budget_fill")
    if fill is None:
        return ("budget fill", "n/a (no token budget)" if "budget_fill" in s else "n/a")
    return ("budget fill", f"{100 * fill:.2f}% (real tokens / (micro-batches x budget tokens))")


def _cp_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """Lines about context parallelism: estimated time, placement, memory and balance per CP rank."""
    c = info.get("cp")
    if not c:
        return []
    unit = "s" if info["config"]["cost"] == "time" else info["config"]["cost"]
    return [
        ("context parallel",
         f"cp {c['cp']} x bucket {_n(c['bucket_size'])} tokens, placement "
         f"{info['config'].get('cp_placement', 'dacp')}, batching {info['config'].get('cp_batching', 'gds')}"),
        ("estimated time", f"{c['estimated_time']:.6g} ({unit}; per step the slowest DP rank)"),
        ("CP placement", f"{_n(c['local_samples'])} samples local, {_n(c['distributed_samples'])} distributed"),
        ("CP memory", f"mean {100 * c['memory_mean']:.1f}%, max {100 * c['memory_max']:.1f}% "
                      "of the bucket (fullest CP rank of each micro-batch)"),
        ("CP imbalance", f"mean {c['cp_imbalance_mean']:.4f}, max {c['cp_imbalance_max']:.4f} "
                         "(slowest CP rank / mean, per micro-batch)"),
    ]  # fmt: skip


def _carry_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The metadata columns carried into the manifests (``--carry``) and where they came from."""
    c = info.get("carry")
    if not c or not c.get("columns"):
        return []
    cols = ", ".join(f"{col['name']} ({col['type']})" for col in c["columns"])
    return [("carried", f"{cols} from {c['from']}; manifest columns carry.NAME, batch.carry")]


def render(info: dict[str, Any]) -> str:
    """Human-readable summary (plain text, one figure per line)."""
    s, lay, cfg = info["stats"], info["layout"], info["config"]
    budget = {
        "budget": f"max-tokens {_n(cfg['max_tokens'])}",
        "fixed": f"batch-size {_n(cfg['batch_size'])}",
        "blocks": f"block-len {cfg.get('block_len')} x {cfg.get('blocks_per_batch')} blocks",
    }[cfg["batching"]]
    rows = [
        ("plan", info["plan"]),
        *_lineage_rows(info),
        (
            "input",
            f"{info['input']['num_samples']:,} samples, {info['input']['total_tokens']:,} tokens ({info['input']['source']})",
        ),
        (
            "layout",
            f"dp {lay['dp']} x grad-accum {lay['grad_accum']} (pp {lay['pp']}, cp {lay['cp']}); {info['num_steps']:,} steps",
        ),
        (
            "batching",
            f"{cfg['batching']} ({budget}), {cfg['layout']}, pad multiple {cfg['pad_multiple']}, order {cfg['order']}",
        ),
        ("micro-batches", f"{s['num_micro_batches']:,} ({s['micro_batches_per_rank']:,} per rank)"),
        ("real tokens", f"{s['real_tokens']:,}"),
        _fill_row(s),
        ("padded tokens", f"{s['padded_tokens']:,} (padding {100 * s['padding_ratio']:.3f}%)"),
        ("time vs ideal", f"{s['time_vs_ideal']:.4f} (cost {s['cost']})"),
        ("", f"({TIME_VS_IDEAL_LEGEND})"),
        *_balance_rows(s),
        (
            "imbalance",
            f"mean {s['imbalance_mean']:.4f}, max {s['imbalance_max']:.4f} (slowest rank / mean, per step)",
        ),
        ("mixing", f"{s['mixing']:.4f} (mean KS distance of a step's lengths to the dataset's)"),
        *_moved_rows(s, cfg),
        ("samples / step", f"{s['step_samples_min']:,} .. {s['step_samples_max']:,}"),
        ("tokens / step", f"{s['step_tokens_min']:,} .. {s['step_tokens_max']:,}"),
        (
            "LR factor",
            f"{s['lr_factor_min']:.4g} .. {s['lr_factor_max']:.4g} ({cfg['lr_scaling']})",
        ),
        *_shape_rows(info),
        *_cp_rows(info),
        ("dropped", f"{info['dropped']:,}; oversize alone {len(s.get('oversize_alone', []))}"),
        ("tokens", token_line(s.get("tokens"), lead="")),
    ]
    rows.extend(_carry_rows(info))
    if "selection" in info:
        w = info["selection"]
        rows.append(
            (
                "selection",
                f"where {w['where']}: kept {w['kept_samples']:,} of {w['samples']:,} samples, "
                f"{w['kept_tokens']:,} of {w['tokens']:,} tokens ({w['from']})",
            )
        )
    if cfg.get("oversize") == "split":
        rows.append(
            ("split", f"pieces of <= {cfg['split_len']} tokens, positions {cfg['split_positions']}")
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
