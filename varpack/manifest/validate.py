"""``varpack validate``: recompute everything a plan promises, independently, from its files.

Checks (each violation is one line naming the rank, step, row or sample id):
checksums and row counts; manifest schema; the layout against the config; step numbering
(contiguous, every rank ``grad_accum`` micro-batches per step, ``micro`` 0..K-1); non-empty
micro-batches with matching id and length lists; ``pad_to`` by the shape rule and the budget
rule (:mod:`varpack.plan.rules`, the planner's own functions); every sample exactly once per
epoch or listed as dropped, with the input fingerprint (or ``--metadata``) as the reference;
each step's global tokens and samples and its LR factor on every row; the stats and shapes in
plan.json. Shapes (issue 5): ``pad_to`` by the shape rule with the chosen lengths
(``--max-shapes`` / ``--pack-to``, recomputed with :func:`varpack.plan.shapes.choose_lengths`), at
most K shapes per rank, rows fixed by the length; ``--pp``: one shape per (step, rank), the
largest of its micro-batches' own shapes, and a count that is a multiple of P; ``--warmup
reorder``: the warm-up rows are a prefix with one micro-batch per shape, largest first, and no
rank meets a new shape after it; blocks: ``pad_to`` is the block length, ``block_index`` runs
0, 1, .. in order, no block over its length, ``blocks_per_batch`` rows per micro-batch.
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
from varpack.manifest.format import BASE_SCHEMA, Plan, load_plan, manifest_schema
from varpack.plan.batching.blocks import check_blocks
from varpack.plan.batching.pipeline import check_pipeline_steps
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.figures import plan_figures
from varpack.plan.lr import lr_factors
from varpack.plan.micro import Micro, summarize
from varpack.plan.rules import LAYOUT_CODE, volume
from varpack.plan.segments import segment_sums
from varpack.plan.shapes import check_shape_bound, choose_lengths
from varpack.plan.shaping import shape_rows
from varpack.plan.stats import rank_shapes
from varpack.plan.warmup import check_warmup_prefix, encode_shapes

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
    pad_rows: np.ndarray
    block_index: np.ndarray | None
    warmup: np.ndarray


def _expected_columns(cfg: PlanConfig) -> list[str]:
    names = list(BASE_SCHEMA.names)
    if cfg.uses_pad_rows:
        names.append("pad_rows")
    if cfg.batching == "blocks":
        names.append("block_index")
    return names


def _read_rank(plan: Plan, rank: int, cfg: PlanConfig, report: Report) -> _Rank | None:
    try:
        table = plan.rank_table(rank, verify=False)
    except (OSError, pa.ArrowException, VarpackError) as exc:
        report.add(f"rank {rank}: cannot read its manifest ({exc})")
        return None
    expected = manifest_schema(_expected_columns(cfg))
    if table.schema != expected:
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
    block_index = None
    if "block_index" in table.column_names:
        bcol = table.column("block_index").combine_chunks()
        off_b = bcol.offsets.to_numpy().astype(np.int64)
        if not np.array_equal(off_b, off_ids):
            report.add(f"rank {rank}: block_index lists are not parallel to sample_ids")
            return None
        block_index = bcol.flatten().to_numpy().astype(np.int64)
    pad_rows = (
        table.column("pad_rows").to_numpy().astype(np.int64)
        if "pad_rows" in table.column_names
        else np.zeros(table.num_rows, np.int64)
    )
    return _Rank(
        step=table.column("step").to_numpy(),
        micro=table.column("micro").to_numpy().astype(np.int64),
        offsets=off_ids - off_ids[0],
        ids=ids_col.flatten().to_numpy(),
        lens=lens_col.flatten().to_numpy().astype(np.int64),
        table=table,
        pad_rows=pad_rows,
        block_index=block_index,
        warmup=table.column("warmup").to_numpy(zero_copy_only=False).astype(bool),
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


def _check_micro(
    r: int,
    rk: _Rank,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    alone_ok: set[int],
    report: Report,
) -> Micro | None:
    counts = np.diff(rk.offsets)
    if (counts == 0).any():
        report.examples(f"rank {r}: empty micro-batches at rows", np.flatnonzero(counts == 0))
        return None
    if (rk.lens <= 0).any():
        report.examples(f"rank {r}: non-positive seq_lens for sample ids", rk.ids[rk.lens <= 0])
    own = summarize(
        rk.offsets, rk.lens, cfg.micro_rule(), lengths=lengths
    )  # the shape rule, no pipeline
    want = own.pad_to
    if cfg.pp > 1:  # one shape per (step, rank): the largest own shape of the step
        start = np.flatnonzero(np.r_[True, rk.step[1:] != rk.step[:-1]])
        want = np.repeat(np.maximum.reduceat(own.pad_to, start), np.diff(np.r_[start, len(want)]))
    pad_to = rk.table.column("pad_to").to_numpy().astype(np.int64)
    bad = np.flatnonzero(pad_to != want)
    if len(bad):
        rule = f"{cfg.layout}, pad multiple {cfg.pad_multiple}"
        if lengths is not None:
            rule += f", lengths {lengths.tolist()[:8]}{'...' if len(lengths) > 8 else ''}"
        if cfg.pp > 1:
            rule += f", one shape per step (--pp {cfg.pp})"
        report.examples(
            f"rank {r}: pad_to differs from the shape rule ({rule}) at rows",
            [f"{i} (has {pad_to[i]}, rule {want[i]})" for i in bad[:_SHOW]],
            len(bad),
        )
    if (rk.pad_rows < 0).any():
        report.examples(f"rank {r}: negative pad_rows at rows", np.flatnonzero(rk.pad_rows < 0))
    micro = summarize(rk.offsets, rk.lens, cfg.micro_rule(), pad_to=pad_to, pad_rows=rk.pad_rows)
    _check_rows(r, rk, cfg, micro, report)
    if cfg.max_tokens is not None and cfg.batching != "fixed":
        vol = volume(micro.rows, micro.pad_to, LAYOUT_CODE[cfg.layout])
        over = np.flatnonzero(vol > cfg.max_tokens)
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
    elif cfg.batching == "fixed" and (micro.samples > (cfg.batch_size or 0)).any():
        report.examples(
            f"rank {r}: micro-batches with more than --batch-size {cfg.batch_size} samples at rows",
            np.flatnonzero(micro.samples > (cfg.batch_size or 0)),
        )
    return micro


def _check_rows(r: int, rk: _Rank, cfg: PlanConfig, micro: Micro, report: Report) -> None:
    """Shape rules of issue 5 on one rank: rows, shape bound, pipeline steps, blocks, warm-up."""
    problems: list[str] = []
    if cfg.batching == "blocks":
        assert cfg.block_len is not None and cfg.blocks_per_batch is not None
        assert rk.block_index is not None
        problems += check_blocks(
            rk.offsets,
            rk.lens,
            rk.block_index,
            micro.pad_to,
            cfg.block_len,
            cfg.blocks_per_batch,
            rank=r,
        )
        used = np.maximum.reduceat(rk.block_index, rk.offsets[:-1]) + 1
        bad = np.flatnonzero(used + rk.pad_rows != cfg.blocks_per_batch)
        for i in bad[:_SHOW]:
            problems.append(
                f"rank {r} micro-batch {i}: {used[i]} blocks + {rk.pad_rows[i]} pad_rows, not "
                f"--blocks-per-batch {cfg.blocks_per_batch}"
            )
    elif cfg.layout == "padded" and cfg.max_shapes is not None:
        want = shape_rows(micro.pad_to, cfg)
        bad = np.flatnonzero(micro.rows != want)
        for i in bad[:_SHOW]:
            problems.append(
                f"rank {r} micro-batch {i}: {micro.rows[i]} rows (samples + pad_rows), the shape "
                f"of length {micro.pad_to[i]} has {want[i]}"
            )
    if cfg.max_shapes is not None:
        problems += check_shape_bound(micro.rows, micro.pad_to, cfg.max_shapes, rank=r)
    if cfg.pp > 1:
        budget = cfg.max_tokens if cfg.layout == "padded" and cfg.batching != "fixed" else None
        problems += check_pipeline_steps(
            rk.step, micro.rows, micro.pad_to, cfg.pp, max_tokens=budget, rank=r
        )
    ids, _ = encode_shapes(micro.rows, micro.pad_to)
    if cfg.warmup == "reorder":
        warm = rk.warmup
        if cfg.pp > 1:
            k = cfg.grad_accum
            mixed = np.flatnonzero(
                warm.reshape(-1, k).any(axis=1) != warm.reshape(-1, k).all(axis=1)
            )
            for s in mixed[:_SHOW]:
                problems.append(f"rank {r} step {s}: warm-up covers part of a pipeline step")
            ids, warm = ids[::k], warm[::k]
        problems += check_warmup_prefix(ids, warm, rank=r)
    elif rk.warmup.any():
        problems.append(f"rank {r}: warmup rows without --warmup reorder")
    report.problems.extend(problems)


def _check_coverage(
    meta: dict[str, Any],
    ids: np.ndarray,
    lens: np.ndarray,
    steps: np.ndarray,
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
    whole: bool = False,
) -> None:
    """Every sample exactly once per epoch (or dropped). ``whole``: ``--warmup reorder`` may move a
    few micro-batches of a later epoch into the prefix, so count over the whole plan instead."""
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
    ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
    if whole and len(epochs) > 1:
        uniq, first, times = np.unique(ids, return_index=True, return_counts=True)
        off = np.flatnonzero(times != len(epochs))
        if len(off):
            report.examples(
                f"samples not planned exactly {len(epochs)} times (once per epoch)", uniq[off]
            )
        ids, lens, steps = uniq, lens[first], np.zeros(len(uniq), np.int64)
        ranges = [(0, 1)]
    for e, (lo, hi) in enumerate(ranges):
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


def _same_tree(a: Any, b: Any) -> bool:
    """Equal JSON values, floats compared with :func:`_close`."""
    if isinstance(b, float):
        return isinstance(a, int | float) and _close(a, b)
    if isinstance(b, dict):
        return (
            isinstance(a, dict) and a.keys() == b.keys() and all(_same_tree(a[x], b[x]) for x in b)
        )
    return bool(a == b)


def _shape_lengths(meta: dict[str, Any], cfg: PlanConfig, report: Report) -> np.ndarray | None:
    """plan.json ``shape_lengths``, checked against the options that choose them."""
    raw = meta.get("shape_lengths")
    lengths = None if raw is None else np.asarray(raw, dtype=np.int64)
    if cfg.pack_to is not None:
        if lengths is None or lengths.tolist() != [cfg.pack_to]:
            report.add(
                f"plan.json shape_lengths {raw!r}: --pack-to {cfg.pack_to} needs [{cfg.pack_to}]"
            )
        return np.array([cfg.pack_to], dtype=np.int64)
    if cfg.max_shapes is None or cfg.batching == "blocks":
        if lengths is not None:
            report.add(f"plan.json shape_lengths {raw!r} without --max-shapes or --pack-to")
        return None
    if lengths is None or len(lengths) == 0:
        report.add("plan.json has no shape_lengths although --max-shapes is set")
        return None
    if len(lengths) > cfg.max_shapes or np.any(np.diff(lengths) <= 0):
        report.add(
            f"plan.json shape_lengths {raw!r}: not at most --max-shapes {cfg.max_shapes} "
            "increasing lengths"
        )
    return lengths


def _recompute_lengths(
    cfg: PlanConfig,
    lengths: np.ndarray,
    ranks: list[_Rank],
    micros: list[Micro],
    sample_step: np.ndarray,
    meta: dict[str, Any],
    report: Report,
) -> None:
    """The chosen lengths are the padding-minimal ones (the planner's DP on the same data)."""
    assert cfg.max_shapes is not None
    if cfg.layout == "padded":  # over the kept samples, once each: epoch 0's
        lens = np.concatenate([rk.lens for rk in ranks])
        epochs = meta.get("epochs") or [{"first_step": 0, "num_steps": int(meta["num_steps"])}]
        if len(epochs) > 1 and cfg.warmup != "reorder":
            lens = lens[sample_step < int(epochs[0]["num_steps"])]
        elif len(epochs) > 1:  # reordered across epochs: one of each sample
            ids = np.concatenate([rk.ids for rk in ranks])
            lens = lens[np.unique(ids, return_index=True)[1]]
    else:  # over the micro-batch totals
        lens = np.concatenate([segment_sums(rk.offsets, rk.lens) for rk in ranks])
    want = choose_lengths(lens, cfg.max_shapes, cfg.pad_multiple)
    if not np.array_equal(want, lengths):
        report.add(
            f"plan.json shape_lengths {lengths.tolist()} are not the padding-minimal "
            f"{want.tolist()} for --max-shapes {cfg.max_shapes}"
        )


@dataclass
class _Whole:
    """The plan's micro-batches of all ranks, concatenated, with the recomputed step totals."""

    step: np.ndarray  # per micro-batch
    rank_of: np.ndarray
    micro: Micro
    ids: np.ndarray  # per planned sample
    lens: np.ndarray
    sample_step: np.ndarray
    step_samples: np.ndarray  # per step
    step_tokens: np.ndarray
    lr: np.ndarray
    num_steps: int


def validate_plan(
    path: str | os.PathLike[str], metadata: tuple[np.ndarray, np.ndarray] | None = None
) -> Report:
    """Every check of the module doc; ``metadata`` = (ids, lens) of the input when given."""
    report = Report()
    # format, version, dp vs rank entries (an unreadable plan is an InputError)
    plan = load_plan(path)
    meta = plan.meta
    cfg = _read_config(meta, report)
    if cfg is None:
        return report
    _check_layout(meta, cfg, report)
    lengths = _shape_lengths(meta, cfg, report)
    _check_files(plan, cfg.dp, report)
    read = _read_ranks(plan, cfg, lengths, report)
    if read is None:  # the later checks need every rank's rows, well numbered
        return report
    ranks, micros = read
    whole = _combine(ranks, micros, int(meta["num_steps"]), cfg)
    _check_step_columns(ranks, whole, report)
    reordered = cfg.warmup == "reorder"
    _check_coverage(
        meta, whole.ids, whole.lens, whole.sample_step, metadata, report, whole=reordered
    )
    if cfg.max_shapes is not None and lengths is not None:
        _recompute_lengths(cfg, lengths, ranks, micros, whole.sample_step, meta, report)
    shapes = rank_shapes(whole.rank_of, whole.micro.rows, whole.micro.pad_to, cfg.dp)
    _check_rank_shapes(meta, shapes, report)
    stats = _recompute_stats(ranks, whole, shapes, lengths, cfg)
    _compare_stats(meta.get("stats", {}), stats, report)
    report.facts = {
        "samples": int(len(whole.ids)),
        "steps": whole.num_steps,
        "dp": cfg.dp,
        "grad_accum": cfg.grad_accum,
        "dropped": len(meta.get("dropped") or []),
        "padding_ratio": stats["padding_ratio"],
        "time_vs_ideal": stats["time_vs_ideal"],
    }
    return report


def _read_config(meta: dict[str, Any], report: Report) -> PlanConfig | None:
    """plan.json's config, resolved; ``None`` (one violation) if it is invalid."""
    try:
        return PlanConfig.from_mapping(meta.get("config", {}), where="plan.json config").resolved()
    except VarpackError as exc:
        report.add(f"plan.json config is invalid: {exc}")
        return None


def _check_layout(meta: dict[str, Any], cfg: PlanConfig, report: Report) -> None:
    layout = meta.get("layout", {})
    if layout != {"dp": cfg.dp, "pp": cfg.pp, "cp": 1, "grad_accum": cfg.grad_accum}:
        report.add(
            f"plan.json layout {layout} does not match the config (dp {cfg.dp}, pp {cfg.pp}, "
            f"grad_accum {cfg.grad_accum})"
        )


def _check_files(plan: Plan, dp: int, report: Report) -> None:
    """Checksums and row counts of every rank file against plan.json."""
    for rank in range(dp):
        report.problems.extend(plan.verify_rank(rank))


def _read_ranks(
    plan: Plan, cfg: PlanConfig, lengths: np.ndarray | None, report: Report
) -> tuple[list[_Rank], list[Micro]] | None:
    """Each rank's manifest, its numbering and its micro-batches checked; ``None`` at the first
    rank that cannot be read or is misnumbered (nothing later could be recomputed from it)."""
    num_steps, k = int(plan.meta["num_steps"]), cfg.grad_accum
    alone_ok = set(int(i) for i in plan.meta.get("stats", {}).get("oversize_alone", []))
    ranks: list[_Rank] = []
    micros: list[Micro] = []
    for rank in range(cfg.dp):
        rk = _read_rank(plan, rank, cfg, report)
        if rk is None or not _check_numbering(rank, rk, num_steps, k, report):
            return None
        micro = _check_micro(rank, rk, cfg, lengths, alone_ok, report)
        if micro is None:
            return None
        ranks.append(rk)
        micros.append(micro)
    return ranks, micros


def _combine(ranks: list[_Rank], micros: list[Micro], num_steps: int, cfg: PlanConfig) -> _Whole:
    """All ranks together, and each step's global samples, tokens and LR factor recomputed."""
    step = np.concatenate([rk.step for rk in ranks])
    allm = Micro(*(np.concatenate([getattr(m, f) for m in micros]) for f in Micro._fields))
    step_samples = np.bincount(step, weights=allm.samples, minlength=num_steps).astype(np.int64)
    step_tokens = np.bincount(step, weights=allm.tokens, minlength=num_steps).astype(np.int64)
    return _Whole(
        step=step,
        rank_of=np.repeat(np.arange(cfg.dp), [len(rk.step) for rk in ranks]),
        micro=allm,
        ids=np.concatenate([rk.ids for rk in ranks]),
        lens=np.concatenate([rk.lens for rk in ranks]),
        sample_step=np.concatenate([np.repeat(rk.step, np.diff(rk.offsets)) for rk in ranks]),
        step_samples=step_samples,
        step_tokens=step_tokens,
        lr=lr_factors(
            step_samples, step_tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit
        ),
        num_steps=num_steps,
    )


def _check_step_columns(ranks: list[_Rank], whole: _Whole, report: Report) -> None:
    """Every row carries its step's global tokens, samples and LR factor."""
    for r, rk in enumerate(ranks):
        for col, want in (
            ("step_tokens", whole.step_tokens),
            ("step_samples", whole.step_samples),
            ("lr_factor", whole.lr),
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


def _check_rank_shapes(meta: dict[str, Any], shapes: list[Any], report: Report) -> None:
    """plan.json's per-rank shapes are the manifests' distinct shapes."""
    for r, want in enumerate(shapes):
        if meta["ranks"][r].get("shapes") != want:
            report.add(
                f"rank {r}: plan.json shapes are not the manifest's {len(want)} distinct "
                "shapes [rows, pad_to], largest first"
            )


def _recompute_stats(
    ranks: list[_Rank],
    whole: _Whole,
    shapes: list[Any],
    lengths: np.ndarray | None,
    cfg: PlanConfig,
) -> dict[str, Any]:
    """plan.json's stats, recomputed from the manifests with the planner's own function."""
    allm = whole.micro
    pad_rows = np.concatenate([rk.pad_rows for rk in ranks]) if cfg.uses_pad_rows else None
    warm = np.concatenate([rk.warmup for rk in ranks])
    return plan_figures(
        step=whole.step,
        rank=whole.rank_of,
        micro=allm,
        pad_rows=pad_rows,
        warm=warm if warm.any() else None,
        sample_step=whole.sample_step,
        sample_len=whole.lens,
        ideal_cost=float(sample_cost(whole.lens, cfg.cost_model()).sum()),
        lr=whole.lr,
        step_samples=whole.step_samples,
        step_tokens=whole.step_tokens,
        num_steps=whole.num_steps,
        lengths=lengths,
        shapes=shapes,
        cfg=cfg,
    )


def _compare_stats(saved: dict[str, Any], stats: dict[str, Any], report: Report) -> None:
    """One violation per recomputed stat that plan.json does not hold (floats within 1e-6)."""
    for key, value in stats.items():
        have = saved.get(key)
        same = (
            have == value
            if not isinstance(value, float)
            else isinstance(have, int | float) and _close(have, value)
        )
        if isinstance(value, dict) and isinstance(have, dict):
            same = _same_tree(have, value)
        if not same:
            report.add(f"plan.json stats {key} = {have!r}, recomputed {value!r}")
