"""Greedy batching: consecutive samples fill a micro-batch while they fit (budget or count).

The strategy for ``--batching budget`` and ``fixed`` (without ``--pp`` in the padded layout). Per
epoch: the order stage gives the stream (one segment per step when shuffled), the packing kernel
(:func:`varpack.plan.kernels.pack.pack`) cuts it into micro-batches, exactly one step's worth per
shuffled segment, and the count is completed to a multiple of ``dp x grad_accum`` by splitting the
costliest micro-batches (:func:`varpack.plan.kernels.pack.complete`). A curriculum scored by FLOPs
or time then orders each window's micro-batches by cost (:mod:`varpack.plan.stages.levelling`).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.pack import complete, pack
from varpack.plan.stages.batching.common import (
    EpochJoiner,
    effective_lengths,
    epoch_order,
    order_rule,
    tokens_per_micro,
)
from varpack.plan.stages.levelling import by_cost_in_windows, levels


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,
) -> Batches:
    """Micro-batches and steps of all epochs; pieces of one ``group`` never share one."""
    per_step = cfg.micro_per_step
    view = (
        lens if lengths is None or cfg.layout == "packed" else effective_lengths(lens, cfg, lengths)
    )
    rule, mrule = cfg.pack_rule(), cfg.micro_rule()
    orule = order_rule(cfg, tokens_per_micro(view, alone, cfg, rule))
    joined, slens = EpochJoiner(), []
    shuffled = cfg.order == "shuffle"
    any_alone = bool(alone.any())
    for epoch in range(cfg.epochs):
        idx, bounds = epoch_order(lens, cfg, epoch, "steps", orule)
        # Each random gather over the stream costs about a second at 100 M samples: do it once
        # (curriculum: the stream is the input order, no gather at all).
        sview = view[idx] if shuffled else view
        salone = alone if not shuffled else alone[idx] if any_alone else np.zeros(len(idx), bool)
        sgroup = None if group is None else group[idx] if shuffled else group
        perm, off = pack(sview, bounds, salone, rule, per_step if shuffled else 0, sgroup)
        del salone, sgroup
        if perm is not None:  # close to the identity: cheap gathers
            idx, sview = idx[perm], sview[perm]
        del perm
        epoch_lens = sview if view is lens else lens[idx]
        del sview
        off = complete(
            off,
            epoch_lens,
            per_step,
            lambda o, v: summarize(o, v, mrule).cost,
            f"epoch {epoch}",
        )
        if levels(cfg.cost, cfg.order):
            cost = summarize(off, epoch_lens, mrule).cost
            window = cfg.shuffle_window * per_step
            idx, off, epoch_lens = by_cost_in_windows(idx, off, epoch_lens, cost, window)
        joined.add(epoch, idx, off, per_step)
        slens.append(epoch_lens)
    batches = Batches(*joined.join(), joined.epochs)
    batches.stream_lens = slens[0] if len(slens) == 1 else np.concatenate(slens)
    return batches
