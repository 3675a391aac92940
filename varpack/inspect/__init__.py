"""``varpack inspect``: a plan's figures as a table or JSON.

The figures are plan.json's stats (computed by :mod:`varpack.plan.figures.stats` when the plan was
made), read back with the checksums verified and laid out one per line. The four-panel figure of
``--plot`` is :mod:`varpack.inspect.plot`'s. A replanned plan (``varpack replan``) shows its
lineage: the parent it continues, from which step, and what changed.

The package holds the views of a plan: this module (text or JSON) and :mod:`.plot` (the figure).
May import: the ground floor, :mod:`varpack.metadata` (a ``--where`` selection's words),
:mod:`varpack.plan` (its figure words and cost functions) and :mod:`varpack.planfile` (to read
the plan, verified); never :mod:`varpack.make`, :mod:`varpack.validate` or :mod:`varpack.cli`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from varpack.errors import VarpackError
from varpack.plan.figures.stats import time_vs_ideal_legend
from varpack.plan.figures.words import (
    counted,
    lr_note,
    lr_spread,
    mix_drawn,
    mix_rows,
    plan_epochs,
    samples_text,
    shape_text,
    token_line,
    tokens_how,
)
from varpack.plan.model_choice import model_rows
from varpack.planfile.format import Plan, load_plan, read_meta


def describe(path: str | os.PathLike[str], plan: Plan | None = None) -> dict[str, Any]:
    """The plan's layout, config, input, stats and per-rank shape counts (JSON-ready); ``plan``:
    the plan at ``path``, opened and verified already (:mod:`varpack.planfile.opened`, under MPI)."""
    if plan is None:
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
        **({"mix": meta["mix"]} if isinstance(meta.get("mix"), dict) else {}),
        "epochs": plan_epochs(meta),
        "lr_factors": lr_factors(plan),
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


def lr_factors(plan: Plan) -> dict[str, Any]:
    """The LR factors over the steps: ``min``, ``median``, ``max``, and the note of
    :func:`~varpack.plan.figures.lr_spread.lr_note` (``None`` when they sit near 1), read from
    rank 0's manifest (every rank holds the same factor for a step)."""
    import pyarrow.parquet as pq

    cfg = plan.meta["config"]
    cols = ["step", "lr_factor", "step_samples", "step_tokens"]
    t = pq.read_table(plan.rank_path(0), columns=cols)
    step = t.column("step").to_numpy()
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])  # a row of each step
    lr, n, tok = (t.column(c).to_numpy()[first] for c in cols[1:])
    lo, mid, hi = lr_spread(lr)
    note = lr_note(lr, cfg.get("lr_scaling", "none"), cfg.get("base_batch_size"),
                   cfg.get("base_unit", "samples"), n, tok)  # fmt: skip
    return {"min": lo, "median": mid, "max": hi, "note": note}


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
    rows.extend(_largest_rows(s))
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


def _largest_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The largest shapes with their real tokens and padding, and the shapes that pad most."""
    shapes = s.get("shapes", [])
    total_pad = s["padded_tokens"] - s["real_tokens"]
    rows: list[tuple[str, str]] = []
    for i, sh in enumerate(shapes[:_SHAPE_LINES]):
        pad = (
            f"padding {sh['padding']:,} ({100 * sh['padding'] / max(sh['padded_tokens'], 1):.1f}% "
            f"of the shape, {100 * sh['padding'] / total_pad:.1f}% of all padding)"
            if sh["padding"]
            else "no padding"
        )
        rows.append(
            (
                "largest shapes" if i == 0 else "",
                f"{shape_text(sh['shape'])}: {sh['micro_batches']:,} micro-batch"
                f"{'es' if sh['micro_batches'] != 1 else ''}, "
                f"{sh['real_tokens']:,} real tokens, {pad}",
            )
        )
    if len(shapes) <= _SHAPE_LINES:
        return rows
    padding = sorted((x for x in shapes if x["padding"] > 0), key=lambda x: -x["padding"])[:3]
    if not padding:  # a packed plan padded to no multiple pads nothing: no shape costs padding
        return [*rows, ("most padding", "none: no shape pads (padding 0 tokens in all)")]
    rest = s.get("shapes_not_shown") or {}
    more = (
        f"; the {rest['shapes']:,} shapes not listed pad {rest['padding']:,} tokens in all"
        if rest.get("shapes")
        else ""
    )
    return [
        *rows,
        (
            "most padding",
            "; ".join(
                f"{shape_text(x['shape'])} {x['padding']:,} tokens "
                f"({100 * x['padding'] / total_pad:.1f}% of all padding)"
                for x in padding
            )
            + more,
        ),
    ]


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


def _sync(cfg: dict[str, Any]) -> str:
    """The model the plan was balanced for (a plan from before ``--sync``: step)."""
    return str(cfg.get("sync", "step"))


def _sync_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Time vs ideal under each synchronisation model (absent in older plans)."""
    both = s.get("time_vs_ideal_by_sync")
    if not both:
        return []
    text = ", ".join(f"{name} {value:.4f}" for name, value in both.items())
    return [("by sync", f"{text} (ranks meet once a step / at every micro-batch)")]


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


def _input_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The input's samples and tokens, and what ``--where`` selected of them (the plan's
    ``input`` then counts the selected samples)."""
    i, w = info["input"], info.get("selection")
    if not w:
        return [("input", f"{counted(i['num_samples'], 'sample')}, "
                          f"{counted(i['total_tokens'], 'token')} ({i['source']})")]  # fmt: skip
    from varpack.metadata.where import Where

    return [
        ("input", f"{counted(w['samples'], 'sample')}, {counted(w['tokens'], 'token')} "
                  f"({i['source']})"),
        ("selection", f"{Where.from_entry(w).line()} (columns read from {w['from']})"),
    ]  # fmt: skip


def _real_tokens(info: dict[str, Any]) -> str:
    """The real tokens planned, and how (epochs, a mix) when more than one epoch's kept."""
    s = info["stats"]
    how = tokens_how(s["real_tokens"], info["epochs"], s.get("tokens"), "mix" in info)
    return f"{s['real_tokens']:,}" + (f" ({how.removeprefix('= ')})" if how else "")


def _oversize_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """What ``--oversize`` did with the samples longer than the budget: the samples dropped
    (``drop``) or planned alone (``alone``); nothing for ``error`` and ``split`` (the split
    row and the token figures say it)."""
    s, mode = info["stats"], info["config"].get("oversize")
    rows = []
    if info["dropped"] or mode == "drop":  # their tokens: the token figures' dropped
        why = " (--oversize drop)" if mode == "drop" else ""
        rows.append(("dropped", f"{counted(info['dropped'], 'sample')}{why}"))
    if mode == "alone":
        alone = len(s.get("oversize_alone", []))
        rows.append(("alone", f"{counted(alone, 'sample')} longer than the budget, each in a "
                              "micro-batch of its own (--oversize alone)"))  # fmt: skip
    return rows


def _planned_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """What the plan trains on, in samples, pieces and epochs (a replanned plan: its parent's)."""
    if "parent" in info:
        return []
    drawn, pieces = mix_drawn(info.get("mix"))
    t = info["stats"].get("tokens")
    return [("planned", samples_text(info["input"]["num_samples"], info["dropped"],
                                     info["epochs"], t, drawn, pieces))]  # fmt: skip


def _per_step_row(s: dict[str, Any], cfg: dict[str, Any]) -> tuple[str, str]:
    """Samples per step (all ranks); a split plan counts pieces (each piece one)."""
    span = f"{s['step_samples_min']:,} .. {s['step_samples_max']:,}"
    if cfg.get("oversize") == "split":
        return ("pieces / step", f"{span} (a split document counts once per piece)")
    return ("samples / step", span)


def _lr_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The LR factors' range and median, and the note when they sit far from 1."""
    s, cfg, f = info["stats"], info["config"], info.get("lr_factors")
    base = cfg.get("base_batch_size")
    rule = cfg["lr_scaling"] + (
        f", --base-batch-size {base:,.6g} {cfg.get('base_unit', 'samples')}" if base else ""
    )
    if not f:
        return [("LR factor", f"{s['lr_factor_min']:.4g} .. {s['lr_factor_max']:.4g} ({rule})")]
    rows = [("LR factor", f"{f['min']:.4g} .. {f['max']:.4g}, median {f['median']:.4g} ({rule})")]
    if f.get("note"):
        rows.append(("", f["note"].removeprefix("note: ")))
    return rows


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
        *_input_rows(info),
        (
            "layout",
            f"dp {lay['dp']} x grad-accum {lay['grad_accum']} (pp {lay['pp']}, cp {lay['cp']}); {counted(info['num_steps'], 'step')}",
        ),
        (
            "batching",
            f"{cfg['batching']} ({budget}), {cfg['layout']}, pad multiple {cfg['pad_multiple']}, order {cfg['order']}",
        ),
        *_planned_rows(info),
        ("micro-batches", f"{s['num_micro_batches']:,} ({s['micro_batches_per_rank']:,} per rank)"),
        ("real tokens", _real_tokens(info)),
        _fill_row(s),
        ("padded tokens", f"{s['padded_tokens']:,} (padding {100 * s['padding_ratio']:.3f}%)"),
        ("time vs ideal", f"{s['time_vs_ideal']:.4f} (cost {s['cost']}, {_sync(cfg)} sync)"),
        ("", f"({time_vs_ideal_legend(_sync(cfg))})"),
        *model_rows(cfg),
        *_sync_rows(s),
        *_balance_rows(s),
        (
            "imbalance",
            f"mean {s['imbalance_mean']:.4f}, max {s['imbalance_max']:.4f} (slowest rank / mean, per step)",
        ),
        ("mixing", f"{s['mixing']:.4f} (mean KS distance of a step's lengths to the dataset's)"),
        *_moved_rows(s, cfg),
        _per_step_row(s, cfg),
        ("tokens / step", f"{s['step_tokens_min']:,} .. {s['step_tokens_max']:,}"),
        *_lr_rows(info),
        *_shape_rows(info),
        *_cp_rows(info),
        *_oversize_rows(info),
        ("tokens", token_line(s.get("tokens"), lead="")),
    ]
    rows.extend(_carry_rows(info))
    rows.extend(mix_rows(info["mix"]) if isinstance(info.get("mix"), dict) else [])
    if cfg.get("oversize") == "split":
        rows.append(
            (
                "split",
                f"pieces of <= {_n(cfg['split_len'])} tokens, positions {cfg['split_positions']}",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
