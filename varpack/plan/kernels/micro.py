"""The figures of a micro-batch: samples, real tokens, longest, shape (``rows x pad_to``), cost.

One function, :func:`summarize`, computes them for any set of micro-batches given as offsets into
a length stream; the planner and ``varpack validate`` (reading the manifests) both call it, with
the same :class:`MicroRule`, so every figure written is a figure checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from varpack.plan.cost import (
    COST_MODELS,
    CostModel,
    micro_cost,
    pad_token_cost,
    segment_cost_sums,
    time_scale,
)
from varpack.plan.kernels.shapes import round_up_to
from varpack.plan.rules import LAYOUT_CODE, pad_to
from varpack.plan.segments import segment_max, segment_sums


class Micro(NamedTuple):
    """Per micro-batch figures (arrays of equal length) that costs, rules and stats need.

    ``rows``: rows of the shape (padded layout: samples + ``pad_rows``; blocks: blocks per
    micro-batch; packed: 1), so a micro-batch's shape is ``(rows, pad_to)``.
    """

    samples: np.ndarray
    tokens: np.ndarray
    max_len: np.ndarray
    pad_to: np.ndarray
    cost: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True)
class MicroRule:
    """What shapes and scores a micro-batch: layout, pad multiple, cost model, and for blocks
    batching ``(block_len, blocks_per_batch)`` (every micro-batch is that many blocks of T)."""

    layout: str = "packed"
    pad_multiple: int = 1
    cost: CostModel = CostModel()
    blocks: tuple[int, int] | None = None


def shape_rule(
    count: np.ndarray,
    tokens: np.ndarray,
    longest: np.ndarray,
    rule: MicroRule,
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """``pad_to`` of micro-batches by the shape rule (the planner's and validate's one rule).

    :func:`varpack.plan.rules.pad_to` (the longest or the total, rounded to ``--pad-multiple``),
    then up to the smallest of the chosen ``lengths`` (``--max-shapes`` / ``--pack-to``); with
    ``--batching blocks`` it is the block length.

    >>> rule = MicroRule("padded", 4)
    >>> shape_rule(np.array([2, 1]), np.array([8, 9]), np.array([5, 9]), rule, np.array([8, 16])).tolist()
    [8, 16]
    """
    if rule.blocks is not None:
        return np.full(len(count), rule.blocks[0], dtype=np.int64)
    base = np.asarray(
        pad_to(count, tokens, longest, LAYOUT_CODE[rule.layout], rule.pad_multiple), dtype=np.int64
    )
    if lengths is None:
        return base
    return round_up_to(base, lengths)


def summarize(
    offsets: np.ndarray,
    lens: np.ndarray,
    rule: MicroRule,
    *,
    lengths: np.ndarray | None = None,
    pad_to: np.ndarray | None = None,
    pad_rows: np.ndarray | None = None,
) -> Micro:
    """Count, real tokens, longest, ``pad_to``, cost and rows of every micro-batch.

    Micro-batch ``i`` holds ``lens[offsets[i]:offsets[i+1]]`` (never empty). ``pad_to`` is the
    shape rule (:func:`shape_rule`, with the chosen ``lengths``) unless given (a pipeline step's
    common shape, read from a manifest); ``pad_rows`` adds empty rows to the padded shape.

    >>> m = summarize(np.array([0, 2, 3]), np.array([3, 5, 9]), MicroRule("packed", 4))
    >>> m.samples.tolist(), m.tokens.tolist(), m.pad_to.tolist()
    ([2, 1], [8, 9], [8, 12])
    """
    lens64 = np.asarray(lens, dtype=np.int64)
    count = np.diff(offsets).astype(np.int64)
    tokens = segment_sums(offsets, lens64)
    longest = segment_max(offsets, lens64)
    if pad_to is None:
        padded = shape_rule(count, tokens, longest, rule, lengths)
    else:
        padded = np.asarray(pad_to, dtype=np.int64)
    rows = _rows(count, rule, pad_rows)
    cost = _cost(offsets, lens64, tokens, rows, padded, rule)
    return Micro(count, tokens, longest, padded, cost, rows)


def _rows(count: np.ndarray, rule: MicroRule, pad_rows: np.ndarray | None) -> np.ndarray:
    if rule.blocks is not None:
        return np.full(len(count), rule.blocks[1], dtype=np.int64)
    if rule.layout == "padded":
        return count if pad_rows is None else count + np.asarray(pad_rows, dtype=np.int64)
    return np.ones(len(count), dtype=np.int64)


def _cost(
    offsets: np.ndarray,
    lens: np.ndarray,
    tokens: np.ndarray,
    rows: np.ndarray,
    padded: np.ndarray,
    rule: MicroRule,
) -> np.ndarray:
    model = rule.cost
    if not COST_MODELS[model.kind].needs_sample_sums or (
        rule.layout != "packed" and rule.blocks is None
    ):
        return micro_cost(rows, tokens, padded, None, model)
    flops = segment_cost_sums(offsets, lens, model)
    if rule.blocks is not None:
        # Samples never attend across a reset: their own FLOPs plus the linear part of the padding.
        scale, fixed = time_scale(model)
        linear = scale * pad_token_cost(model)
        return flops + linear * (rows * padded - tokens) + fixed
    return micro_cost(rows, tokens, padded, flops, model)
