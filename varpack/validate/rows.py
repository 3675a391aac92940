"""Rows and shapes: each micro-batch's padded shape, by the planner's own rule functions.

Checks, per rank: micro-batches are non-empty with positive lengths; ``pad_to`` is the shape rule's
(:func:`varpack.plan.kernels.micro.summarize` with the plan's layout, pad multiple and chosen
lengths; with ``--pp`` the largest of the step's own shapes); ``pad_rows`` is not negative; the
token budget (:func:`varpack.plan.rules.volume`, an ``--oversize alone`` sample excepted) or
``--batch-size``. Then the shape rules: with blocks,
:func:`varpack.plan.stages.batching.blocks.check_blocks` and ``blocks_per_batch`` rows per
micro-batch; with ``--max-shapes`` on the padded layout, the rows of each length's shape
(:func:`varpack.plan.stages.shaping.shape_rows`); at most K shapes per rank; one shape per pipeline
step; ``--warmup reorder``'s prefix (whole pipeline steps, one micro-batch per shape, largest first,
no new shape after it). Last, plan.json's ``shape_lengths`` against the options that choose them,
and recomputed as the padding-minimal ones (:func:`varpack.plan.kernels.shapes.choose_lengths` on
the same data).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.plan.config import PlanConfig
from varpack.plan.kernels.micro import Micro, summarize
from varpack.plan.kernels.shapes import check_shape_bound, choose_lengths
from varpack.plan.rules import LAYOUT_CODE, volume
from varpack.plan.segments import segment_sums
from varpack.plan.stages.batching.blocks import check_blocks
from varpack.plan.stages.batching.pipeline import check_pipeline_steps
from varpack.plan.stages.shaping import shape_rows
from varpack.plan.stages.warmup import check_warmup_prefix, encode_shapes
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import SHOW, Report


def check_micro_batches(
    r: int,
    rk: RankRows,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    alone_ok: set[int],
    report: Report,
) -> Micro | None:
    """Rank ``r``'s micro-batches (shape, budget, shape rules) summarized; ``None`` if one is empty."""
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
            [f"{i} (has {pad_to[i]}, rule {want[i]})" for i in bad[:SHOW]],
            len(bad),
        )
    if (rk.pad_rows < 0).any():
        report.examples(f"rank {r}: negative pad_rows at rows", np.flatnonzero(rk.pad_rows < 0))
    micro = summarize(rk.offsets, rk.lens, cfg.micro_rule(), pad_to=pad_to, pad_rows=rk.pad_rows)
    _check_shape_rules(r, rk, cfg, micro, report)
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
                [f"{i} (step {rk.step[i]}, {micro.samples[i]} samples)" for i in over[:SHOW]],
                len(over),
            )
    elif cfg.batching == "fixed" and (micro.samples > (cfg.batch_size or 0)).any():
        report.examples(
            f"rank {r}: micro-batches with more than --batch-size {cfg.batch_size} samples at rows",
            np.flatnonzero(micro.samples > (cfg.batch_size or 0)),
        )
    return micro


def _check_shape_rules(r: int, rk: RankRows, cfg: PlanConfig, micro: Micro, report: Report) -> None:
    """The shape rules on one rank: blocks or rows per shape, shape bound, pipeline, warm-up."""
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
        for i in bad[:SHOW]:
            problems.append(
                f"rank {r} micro-batch {i}: {used[i]} blocks + {rk.pad_rows[i]} pad_rows, not "
                f"--blocks-per-batch {cfg.blocks_per_batch}"
            )
    elif cfg.layout == "padded" and cfg.max_shapes is not None:
        want = shape_rows(micro.pad_to, cfg)
        bad = np.flatnonzero(micro.rows != want)
        for i in bad[:SHOW]:
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
            for s in mixed[:SHOW]:
                problems.append(f"rank {r} step {s}: warm-up covers part of a pipeline step")
            ids, warm = ids[::k], warm[::k]
        problems += check_warmup_prefix(ids, warm, rank=r)
    elif rk.warmup.any():
        problems.append(f"rank {r}: warmup rows without --warmup reorder")
    report.problems.extend(problems)


def shape_lengths(meta: dict[str, Any], cfg: PlanConfig, report: Report) -> np.ndarray | None:
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


def recompute_lengths(
    cfg: PlanConfig,
    lengths: np.ndarray,
    ranks: list[RankRows],
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
        elif len(epochs) > 1:  # reordered across epochs: one of each sample (or piece)
            ids = np.concatenate([rk.ids for rk in ranks])
            offs = [rk.sample_offsets for rk in ranks]
            if all(o is not None for o in offs):  # --oversize split: a piece is (id, offset)
                key = np.stack((ids, np.concatenate([o for o in offs if o is not None])), axis=1)
                lens = lens[np.unique(key, axis=0, return_index=True)[1]]
            else:
                lens = lens[np.unique(ids, return_index=True)[1]]
    else:  # over the micro-batch totals
        lens = np.concatenate([segment_sums(rk.offsets, rk.lens) for rk in ranks])
    want = choose_lengths(lens, cfg.max_shapes, cfg.pad_multiple)
    if not np.array_equal(want, lengths):
        report.add(
            f"plan.json shape_lengths {lengths.tolist()} are not the padding-minimal "
            f"{want.tolist()} for --max-shapes {cfg.max_shapes}"
        )
