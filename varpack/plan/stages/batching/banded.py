"""Cost-composed batching in the padded layout (``--compose cost`` with ``--layout padded``).

Per epoch the order stage gives shuffled windows sorted by (effective) length; each window is
cut into bands (:func:`varpack.plan.kernels.bands.band_items`: one micro-batch each, or with
``--pp`` a rank's ``grad_accum`` micro-batches of one shape) and the bands are dealt to steps by
cost (:func:`~varpack.plan.kernels.bands.deal_band_items`): heavy bands one per rank of a step,
the rest in a snake over the window's lengths. Where a rank holds one band per step (grad-accum 1, or
``--pp``), bands are capped by cost so the ranks of a step cost alike; with more, the assign
stage levels a rank's bands (longest-processing-time first). With ``--sync micro`` each slot
(one band per rank) is composed as a step of grad-accum 1, and ``grad_accum`` consecutive slots
make a step. The count is completed to whole steps by splitting the costliest bands
(:func:`varpack.plan.kernels.pack.complete`). Then (``--sync micro``, and grad-accum 1 under
both models) each pair of neighbouring blocks is cut as one, in sorted runs of ``dp``
(:func:`~varpack.plan.kernels.slots.pool_pairs`; at grad-accum 1 each group of four where that
lowers its time, :func:`~varpack.plan.kernels.slots.pool_quads`), rows are moved between the
bands of a block where that lowers its time (:func:`~varpack.plan.kernels.bandlevel.level_bands`),
and each block's micro-batches cut into slots by cost
(:func:`~varpack.plan.kernels.slots.slot_order`).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cost import cost_coefficients
from varpack.plan.kernels.bandlevel import group_by_band, level_bands
from varpack.plan.kernels.bands import band_items, deal_band_items
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.pack import complete
from varpack.plan.kernels.slots import move_micro, pool_pairs, pool_quads, slot_order
from varpack.plan.segments import gather_positions, segment_max
from varpack.plan.stages.batching import greedy, pipeline
from varpack.plan.stages.batching.common import (
    EpochJoiner,
    effective_lengths,
    epoch_order,
    order_rule,
    tokens_per_micro,
    whole_steps,
)
from varpack.plan.stages.batching.pipeline import expand_groups
from varpack.plan.stages.shaping import shape_rows
from varpack.plan.sync import slotted
from varpack.plan.tuning import BAND_PASSES, WIDE_GAIN


def merge_small(
    idx: np.ndarray, bounds: np.ndarray, eff: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of fewer than ``m`` samples (a band needs one per micro-batch) joined with the
    next one (the last with the one before), each joined window sorted by length again.

    >>> idx, b = merge_small(np.arange(5), np.array([0, 1, 3, 5]), np.array([9, 1, 2, 3, 4]), 2)
    >>> idx.tolist(), b.tolist()
    ([1, 2, 0, 3, 4], [0, 3, 5])
    """
    sizes = np.diff(bounds)
    if len(sizes) == 0 or sizes.min() >= m:
        return idx, bounds
    keep = [0]
    for w in range(len(sizes)):
        if bounds[w + 1] - keep[-1] >= m or w == len(sizes) - 1:
            keep.append(int(bounds[w + 1]))
    if len(keep) > 2 and keep[-1] - keep[-2] < m:
        del keep[-2]  # the last window joins the one before
    new = np.array(keep, dtype=np.int64)
    idx = idx.copy()
    for a, b in zip(new[:-1], new[1:], strict=True):
        if not np.all(np.diff(eff[idx[a:b]]) >= 0):
            idx[a:b] = idx[a:b][np.argsort(eff[idx[a:b]], kind="stable")]
    return idx, new


def cut_slots(
    idx: np.ndarray, starts: np.ndarray, lens: np.ndarray, eff: np.ndarray, cfg: PlanConfig,
    epoch: int,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """An epoch's bands (``idx`` cut at ``starts``) completed to whole steps, pooled (pairs of
    blocks; at grad-accum 1 groups of four where that pays), levelled by moving rows inside each
    block, and cut into slots by cost: ``(idx, starts)`` in step order."""
    starts, cost = whole_steps(starts, lens[idx], cfg, epoch)
    size, dp = cfg.micro_per_step * cfg.shuffle_window, cfg.dp
    if cfg.grad_accum == 1:
        pooled = pool_quads(cost, size, dp, WIDE_GAIN)
    else:
        pooled = pool_pairs(cost, size, dp)
    lin, quad = cost_coefficients(cfg.cost_model())
    band = level_bands(np.ascontiguousarray(eff[idx], dtype=np.int64), starts, pooled, size, dp,
                       cfg.max_tokens, lin, quad, BAND_PASSES)  # fmt: skip
    perm, starts = group_by_band(band, len(starts) - 1)
    idx = idx[perm]
    micro = summarize(starts, lens[idx], cfg.micro_rule())
    # from grad-accum 2 up, slots dealt to steps by their rows' length, so that steps mix
    deal = micro.max_len[pooled] if cfg.grad_accum > 1 else None
    order = slot_order(micro.cost[pooled], dp, cfg.grad_accum, cfg.shuffle_window, deal=deal)
    (idx,), starts = move_micro((idx,), starts, pooled[order])
    return idx, starts


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # always None: --oversize split is refused here
) -> Batches:
    """Micro-batches and steps of all epochs in the padded layout, composed by cost."""
    assert cfg.max_tokens is not None
    dp, pp = cfg.dp, cfg.pp > 1
    slots = cfg.grad_accum if slotted(cfg.sync, cfg.grad_accum) else 1  # (--sync micro)
    k = cfg.grad_accum // slots  # a rank's micro-batches in what is composed: a step or a slot
    m = k if pp else 1  # micro-batches per band
    per_step = dp if pp else dp * k  # bands per step (per slot)
    eff = effective_lengths(lens, cfg, lengths)
    lin, quad = cost_coefficients(cfg.cost_model())
    capped = pp or k == 1 and slots == 1  # slots of several steps are levelled by their cut
    cut = not pp and (slots > 1 or cfg.grad_accum == 1)  # slots cut by cost (one at K = 1)
    orule = order_rule(cfg, tokens_per_micro(eff, np.zeros(len(lens), bool), cfg, cfg.pack_rule()))
    joined = EpochJoiner()
    mrule = cfg.micro_rule()
    for epoch in range(cfg.epochs):
        idx, bounds = epoch_order(lens, cfg, epoch, "windows", orule)
        idx, bounds = merge_small(idx, np.asarray(bounds, np.int64), eff, m)
        e = np.ascontiguousarray(eff[idx], dtype=np.int64)
        starts, item_cost, heavy = band_items(
            e, np.asarray(bounds, np.int64), m, cfg.max_tokens, lin, quad, capped,
            cfg.balance_fill, 1 if pp else k,
        )  # fmt: skip
        if len(starts) == 1:  # a window too small for bands of m samples: by tokens instead
            return pipeline.build(lens, alone, cfg, lengths) if pp else greedy.build(
                lens, alone, cfg, lengths)  # fmt: skip
        order = deal_band_items(
            starts, np.asarray(bounds, np.int64), heavy, item_cost, per_step, dp
        )
        pos, starts = gather_positions(starts[:-1][order], np.diff(starts)[order])
        idx = idx[pos]
        if cut:  # whole steps, blocks pooled, rows levelled, slots cut by cost
            idx, starts = cut_slots(idx, starts, lens, eff, cfg, epoch)
        else:
            starts = complete(
                starts,
                lens[idx],
                per_step,
                lambda o, v: summarize(o, v, mrule).cost if not pp else np.diff(o).astype(float),
                f"epoch {epoch}",
                min_size=m,
            )
        joined.add(epoch, idx, starts, per_step * slots)
    stream, offsets, step = joined.join()
    if not pp:
        return Batches(stream, offsets, step, joined.epochs)
    t = segment_max(offsets, eff[stream])
    rows_of = shape_rows(t, cfg) if cfg.max_shapes is not None else None
    micro_off, pad_to, pad_rows = expand_groups(offsets, t, k, rows_of)
    return Batches(stream, micro_off, np.repeat(step, k), joined.epochs, pad_to, pad_rows, None, k)
