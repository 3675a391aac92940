"""Stage 3, shapes: the padded shape ``(rows, pad_to)`` of every micro-batch.

Shapes are decided twice: lengths known before batching (:func:`input_lengths`: ``--pack-to``,
or ``--max-shapes`` chosen over the samples in the padded layout), and after it (:func:`shape`:
``--max-shapes`` over the packed micro-batch totals, each micro-batch's ``pad_to`` by the shape
rule, and empty rows ``pad_rows`` where the row count is fixed by the length). Shapes come before
ranks because a micro-batch's cost depends on its shape; the one-shape-per-pipeline-step rule is
applied where ranks are known (:mod:`varpack.plan.stages.placement`).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches, Shapes
from varpack.plan.config import PlanConfig
from varpack.plan.kernels import shapes
from varpack.plan.kernels.micro import summarize
from varpack.plan.segments import segment_sums


def input_lengths(lens: np.ndarray, cfg: PlanConfig) -> np.ndarray | None:
    """Shape lengths known before batching: ``--pack-to``, or ``--max-shapes`` chosen over the
    samples in the padded layout (packed: over the micro-batch totals, after batching)."""
    if cfg.pack_to is not None:
        return np.array([cfg.pack_to], dtype=np.int64)
    if cfg.max_shapes is not None and cfg.layout == "padded" and cfg.batching != "blocks":
        return shapes.choose_lengths(lens, cfg.max_shapes, cfg.pad_multiple)
    return None


def shape_rows(pad_to: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Rows ``B`` of a padded shape of length ``pad_to`` under ``--max-shapes``.

    The budget fixes them (``max_tokens // T``), or ``--batch-size`` with fixed batching.

    >>> shape_rows(np.array([512, 1000]), PlanConfig(max_tokens=4096, max_shapes=2)).tolist()
    [8, 4]
    """
    if cfg.batching == "fixed":
        return np.full(len(pad_to), cfg.batch_size or 0, dtype=np.int64)
    assert cfg.max_tokens is not None
    return shapes.shape_batch_rows(np.asarray(pad_to, np.int64), cfg.max_tokens)


def shape(
    batches: Batches, lens: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> Shapes:
    """Each micro-batch's figures and shape; ``lens`` are the selection's lengths."""
    slens = lens[batches.stream] if batches.stream_lens is None else batches.stream_lens
    if cfg.max_shapes is not None and cfg.layout == "packed" and lengths is None:  # over totals
        lengths = shapes.choose_lengths(
            segment_sums(batches.offsets, slens), cfg.max_shapes, cfg.pad_multiple
        )
    rule = cfg.micro_rule()
    micro = summarize(
        batches.offsets,
        slens,
        rule,
        lengths=lengths,
        pad_to=batches.pad_to,
        pad_rows=batches.pad_rows,
    )
    pad_rows = batches.pad_rows
    if pad_rows is None and cfg.uses_pad_rows:  # --max-shapes, padded: B fixed by T
        pad_rows = (shape_rows(micro.pad_to, cfg) - micro.samples).astype(np.int32)
        micro = summarize(batches.offsets, slens, rule, lengths=lengths, pad_rows=pad_rows)
    return Shapes(micro, lengths, pad_rows, slens)
