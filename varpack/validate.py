"""``varpack validate``: recompute everything a plan promises, independently, from its files.

Checks (each violation is one line naming the rank, step, row or sample id):
checksums and row counts; manifest schema; the layout against the config; step numbering
(contiguous, every rank ``grad_accum`` micro-batches per step, ``micro`` 0..K-1); non-empty
micro-batches with matching id and length lists; ``pad_to`` by the shape rule and the budget
rule (:mod:`varpack.plan.rules`, the planner's own functions); every sample exactly once per
epoch or listed as dropped, with the input fingerprint (or ``--metadata``) as the reference;
each step's global tokens and samples and its LR factor on every row; the stats and shapes in
plan.json.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.errors import VarpackError
from varpack.fingerprint import fingerprint
from varpack.manifest import BASE_SCHEMA, Plan, load_plan, manifest_schema
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.lr import lr_factors
from varpack.plan.pack import summarize
from varpack.plan.rules import LAYOUT_CODE, fits
from varpack.plan.stats import plan_stats, rank_shapes

_SHOW = 5


@dataclass
class Report:
    """Violations found (empty: the plan is valid) and a few figures for the OK line."""

    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, message: str) -> None:
        self.problems.append(message)

    def examples(self, what: str, items: Any, total: int | None = None) -> None:
        """One line for a violation that hits many items: the first few and the count."""
        items = list(items[:_SHOW])
        total = len(items) if total is None else total
        shown = ", ".join(str(i) for i in items)
        more = f" (and {total - len(items)} more)" if total > len(items) else ""
        self.add(f"{what}: {shown}{more}")


@dataclass
class _Rank:
    step: np.ndarray
    micro: np.ndarray
    offsets: np.ndarray
    ids: np.ndarray
    lens: np.ndarray
    table: pa.Table


def _read_rank(plan: Plan, rank: int, report: Report) -> _Rank | None:
    try:
        table = plan.rank_table(rank, verify=False)
    except (OSError, pa.ArrowException, VarpackError) as exc:
        report.add(f"rank {rank}: cannot read its manifest ({exc})")
        return None
    expected = manifest_schema(table.column_names)
    missing = [f.name for f in BASE_SCHEMA if f.name not in table.column_names]
    if missing or table.schema != expected:
        report.add(
            f"rank {rank}: manifest schema {table.schema.to_string()!r} is not {expected.to_string()!r}"
        )
        return None
    ids_col = table.column("sample_ids").combine_chunks()
    lens_col = table.column("seq_lens").combine_chunks()
    off_ids = ids_col.offsets.to_numpy().astype(np.int64)
    off_lens = lens_col.offsets.to_numpy().astype(np.int64)
    if not np.array_equal(off_ids, off_lens):
        bad = np.flatnonzero(np.diff(off_ids) != np.diff(off_lens))
        report.examples(f"rank {rank}: sample_ids and seq_lens differ in length at rows", bad)
        return None
    return _Rank(
        step=table.column("step").to_numpy(),
        micro=table.column("micro").to_numpy().astype(np.int64),
        offsets=off_ids - off_ids[0],
        ids=ids_col.flatten().to_numpy(),
        lens=lens_col.flatten().to_numpy().astype(np.int64),
        table=table,
    )


def _check_numbering(r: int, rk: _Rank, num_steps: int, k: int, report: Report) -> bool:
    rows = len(rk.step)
    if rows != num_steps * k:
        per = np.bincount(np.clip(rk.step, 0, None), minlength=num_steps)[:num_steps]
        uneven = np.flatnonzero(per != k)
        report.examples(
            f"rank {r}: {rows} micro-batches, expected {num_steps} steps x {k}; unequal counts",
            [f"step {s} has {per[s]}" for s in uneven[:_SHOW]],
            len(uneven),
        )
        return False
    want_step = np.arange(rows) // k
    want_micro = np.arange(rows) % k
    bad = np.flatnonzero((rk.step != want_step) | (rk.micro != want_micro))
    if len(bad):
        report.examples(
            f"rank {r}: step/micro numbering is not contiguous (steps 0..{num_steps - 1}, micro 0..{k - 1}); rows",
            [f"{i} (step {rk.step[i]}, micro {rk.micro[i]})" for i in bad[:_SHOW]],
            len(bad),
        )
        return False
    return True


def _check_micro(r: int, rk: _Rank, cfg: PlanConfig, alone_ok: set[int], report: Report) -> Any:
    counts = np.diff(rk.offsets)
    if (counts == 0).any():
        report.examples(f"rank {r}: empty micro-batches at rows", np.flatnonzero(counts == 0))
        return None
    if (rk.lens <= 0).any():
        report.examples(f"rank {r}: non-positive seq_lens for sample ids", rk.ids[rk.lens <= 0])
    micro = summarize(rk.offsets, rk.lens, cfg)
    pad_to = rk.table.column("pad_to").to_numpy().astype(np.int64)
    bad = np.flatnonzero(pad_to != micro.pad_to)
    if len(bad):
        report.examples(
            f"rank {r}: pad_to differs from the shape rule ({cfg.layout}, pad multiple {cfg.pad_multiple}) at rows",
            [f"{i} (has {pad_to[i]}, rule {micro.pad_to[i]})" for i in bad[:_SHOW]],
            len(bad),
        )
    if cfg.batching == "budget":
        ok = fits(
            micro.samples,
            micro.tokens,
            micro.max_len,
            LAYOUT_CODE[cfg.layout],
            cfg.pad_multiple,
            cfg.max_tokens,
        )
        over = np.flatnonzero(~ok)
        if len(over) and cfg.oversize == "alone":
            first = rk.ids[rk.offsets[over]]
            lone = (micro.samples[over] == 1) & np.isin(
                first, np.fromiter(alone_ok, np.int64, len(alone_ok))
            )
            over = over[~lone]
        if len(over):
            report.examples(
                f"rank {r}: micro-batches over the budget of {cfg.max_tokens} tokens at rows",
                [f"{i} (step {rk.step[i]}, {micro.samples[i]} samples)" for i in over[:_SHOW]],
                len(over),
            )
    elif (micro.samples > (cfg.batch_size or 0)).any():
        report.examples(
            f"rank {r}: micro-batches with more than --batch-size {cfg.batch_size} samples at rows",
            np.flatnonzero(micro.samples > (cfg.batch_size or 0)),
        )
    return micro


def _check_coverage(
    meta: dict[str, Any],
    ids: np.ndarray,
    lens: np.ndarray,
    steps: np.ndarray,
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
) -> None:
    dropped = meta.get("dropped") or []
    d_ids = np.array([int(d["sample_id"]) for d in dropped], dtype=np.int64)
    d_lens = np.array([int(d["seq_len"]) for d in dropped], dtype=np.int64)
    epochs = meta.get("epochs") or [
        {"epoch": 0, "first_step": 0, "num_steps": int(meta["num_steps"])}
    ]
    bounds = [0]
    for e in epochs:
        if int(e["first_step"]) != bounds[-1]:
            report.add(
                f"plan.json epochs: epoch {e['epoch']} starts at step {e['first_step']}, expected {bounds[-1]}"
            )
        bounds.append(int(e["first_step"]) + int(e["num_steps"]))
    if bounds[-1] != int(meta["num_steps"]):
        report.add(f"plan.json epochs cover {bounds[-1]} steps, num_steps is {meta['num_steps']}")
    info = meta.get("input", {})
    for e, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        sel = (steps >= lo) & (steps < hi)
        e_ids, e_lens = ids[sel], lens[sel]
        order = np.argsort(e_ids, kind="stable")
        s_ids = e_ids[order]
        dup = np.flatnonzero(s_ids[1:] == s_ids[:-1])
        if len(dup):
            report.examples(f"epoch {e}: samples planned more than once", np.unique(s_ids[dup]))
        both = np.intersect1d(s_ids, d_ids)
        if len(both):
            report.examples(f"epoch {e}: samples both planned and listed as dropped", both)
        all_ids = np.concatenate((e_ids, d_ids))
        all_lens = np.concatenate((e_lens, d_lens))
        if metadata is not None:
            ref_ids, ref_lens = metadata
            missing = np.setdiff1d(ref_ids, all_ids)
            if len(missing):
                report.examples(
                    f"epoch {e}: samples of the metadata missing from the plan (not dropped)",
                    missing,
                )
            extra = np.setdiff1d(all_ids, ref_ids)
            if len(extra):
                report.examples(f"epoch {e}: sample ids not in the metadata", extra)
            order = np.argsort(ref_ids, kind="stable")
            pos = np.clip(np.searchsorted(ref_ids, all_ids, sorter=order), 0, len(ref_ids) - 1)
            ref_len = ref_lens[order[pos]]
            known = ref_ids[order[pos]] == all_ids
            wrong = np.flatnonzero(known & (ref_len != all_lens))
            if len(wrong):
                report.examples(
                    f"epoch {e}: seq_len differs from the metadata for sample ids",
                    all_ids[wrong],
                    len(wrong),
                )
        if fingerprint(all_ids, all_lens).hex != info.get("fingerprint"):
            report.add(
                f"epoch {e}: planned + dropped samples ({len(all_ids)}, {int(all_lens.sum())} tokens) do not match "
                f"the input fingerprint {info.get('fingerprint')} ({info.get('num_samples')} samples): "
                "samples missing, duplicated or changed"
            )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def validate_plan(
    path: str | os.PathLike[str], metadata: tuple[np.ndarray, np.ndarray] | None = None
) -> Report:
    """Every check of the module doc; ``metadata`` = (ids, lens) of the input when given."""
    report = Report()
    plan = load_plan(
        path
    )  # format, version, dp vs rank entries (an unreadable plan is an InputError)
    meta = plan.meta
    try:
        cfg = PlanConfig.from_mapping(meta.get("config", {}), where="plan.json config").resolved()
    except VarpackError as exc:
        report.add(f"plan.json config is invalid: {exc}")
        return report
    layout = meta.get("layout", {})
    if layout != {"dp": cfg.dp, "pp": 1, "cp": 1, "grad_accum": cfg.grad_accum}:
        report.add(
            f"plan.json layout {layout} does not match the config (dp {cfg.dp}, grad_accum {cfg.grad_accum})"
        )
    num_steps, k, dp = int(meta["num_steps"]), cfg.grad_accum, cfg.dp
    for rank in range(dp):
        report.problems.extend(plan.verify_rank(rank))
    ranks: list[_Rank] = []
    micros: list[Any] = []
    alone_ok = set(int(i) for i in meta.get("stats", {}).get("oversize_alone", []))
    for rank in range(dp):
        rk = _read_rank(plan, rank, report)
        if rk is None or not _check_numbering(rank, rk, num_steps, k, report):
            return report
        micro = _check_micro(rank, rk, cfg, alone_ok, report)
        if micro is None:
            return report
        ranks.append(rk)
        micros.append(micro)
    # Global per-step totals, LR factors, coverage.
    step = np.concatenate([rk.step for rk in ranks])
    rank_of = np.repeat(np.arange(dp), [len(rk.step) for rk in ranks])
    count = np.concatenate([m.samples for m in micros])
    tokens = np.concatenate([m.tokens for m in micros])
    step_samples = np.bincount(step, weights=count, minlength=num_steps).astype(np.int64)
    step_tokens = np.bincount(step, weights=tokens, minlength=num_steps).astype(np.int64)
    lr = lr_factors(step_samples, step_tokens, cfg)
    for r, rk in enumerate(ranks):
        for col, want in (
            ("step_tokens", step_tokens),
            ("step_samples", step_samples),
            ("lr_factor", lr),
        ):
            have = rk.table.column(col).to_numpy()
            bad = np.flatnonzero(have != want[rk.step])
            if len(bad):
                report.examples(
                    f"rank {r}: {col} differs from the recomputed value at rows",
                    [
                        f"{i} (step {rk.step[i]}: {have[i]} vs {want[rk.step[i]]})"
                        for i in bad[:_SHOW]
                    ],
                    len(bad),
                )
    ids = np.concatenate([rk.ids for rk in ranks])
    lens = np.concatenate([rk.lens for rk in ranks])
    sample_step = np.concatenate([np.repeat(rk.step, np.diff(rk.offsets)) for rk in ranks])
    _check_coverage(meta, ids, lens, sample_step, metadata, report)
    # Stats and shapes recomputed with the planner's functions.
    pad_to = np.concatenate([m.pad_to for m in micros])
    shapes = rank_shapes(rank_of, count, pad_to, cfg.layout, dp)
    for r in range(dp):
        if plan.meta["ranks"][r].get("shapes") != shapes[r]:
            report.add(
                f"rank {r}: plan.json shapes do not match the manifest's {len(shapes[r])} distinct shapes"
            )
    stats = plan_stats(
        step=step,
        rank=rank_of,
        count=count,
        tokens=tokens,
        padded_len=pad_to,
        cost=np.concatenate([m.cost for m in micros]),
        sample_step=sample_step,
        sample_len=lens,
        ideal_cost=float(sample_cost(lens, cfg).sum()),
        lr=lr,
        step_samples=step_samples,
        step_tokens=step_tokens,
        num_steps=num_steps,
        dp=dp,
        layout=cfg.layout,
        shapes=shapes,
    )
    saved = meta.get("stats", {})
    for key, value in stats.items():
        have = saved.get(key)
        same = (
            have == value
            if not isinstance(value, float)
            else isinstance(have, int | float) and _close(have, value)
        )
        if not same:
            report.add(f"plan.json stats {key} = {have!r}, recomputed {value!r}")
    report.facts = {
        "samples": int(len(ids)),
        "steps": num_steps,
        "dp": dp,
        "grad_accum": k,
        "dropped": len(meta.get("dropped") or []),
        "padding_ratio": stats["padding_ratio"],
        "time_vs_ideal": stats["time_vs_ideal"],
    }
    return report
