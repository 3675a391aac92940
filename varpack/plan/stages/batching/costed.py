"""Cost-composed batching: shuffled steps whose ranks carry the same cost (``--compose cost``).

The strategy for ``--order shuffle`` with ``--batching budget`` in the packed layout (without
``--pp``). Per epoch the shuffle order's permutation comes with the lengths moved along
(:func:`varpack.plan.kernels.permute.permuted`), and
:func:`varpack.plan.kernels.compose.compose_epoch` deals each window of it to steps, ranks and
micro-batches by cost: heavy samples one per rank of a step, the rest filled to each rank's
level within the budget. Every ``grad_accum`` consecutive micro-batches of a step are one rank's
share, so the assign stage moves them whole (``Batches.group``). Where an epoch cannot be
composed so (fewer samples than whole steps need), the plan is composed by tokens
(:mod:`.greedy`).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cost import cost_coefficients
from varpack.plan.kernels.compose import compose_epoch
from varpack.plan.kernels.order import MovedTally
from varpack.plan.kernels.permute import permuted
from varpack.plan.stages.batching import greedy
from varpack.plan.stages.batching.common import EpochJoiner, order_rule, tokens_per_micro


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # always None: --oversize split is refused here
) -> Batches:
    """Micro-batches and steps of all epochs, composed by cost."""
    assert cfg.max_tokens is not None
    rule = cfg.pack_rule()
    orule = order_rule(cfg, tokens_per_micro(lens, alone, cfg, rule))
    coeffs = cost_coefficients(cfg.cost_model())
    joined, slens, tally = EpochJoiner(), [], MovedTally()
    per_step = cfg.micro_per_step
    for epoch in range(cfg.epochs):
        perm, plens = permuted(cfg.seed, epoch, lens)  # the shuffle order's permutation
        got = compose_epoch(
            plens,
            alone[perm] if alone.any() else np.zeros(len(perm), dtype=np.bool_),
            coeffs,
            orule.window * orule.step,
            orule.step,
            cfg.dp,
            cfg.grad_accum,
            cfg.pad_multiple,
            cfg.max_tokens,
            cfg.balance_fill,
        )
        if got is None:
            return greedy.build(lens, alone, cfg, lengths)
        pos, off = got
        joined.add(epoch, perm[pos], off, per_step)
        tally.add_epoch(pos, off, plens, per_step)
        slens.append(plens[pos])
        del perm, plens, pos
    batches = Batches(*joined.join(), joined.epochs, group=cfg.grad_accum)
    batches.stream_lens = slens[0] if len(slens) == 1 else np.concatenate(slens)
    batches.moved = tally.figures(cfg.shuffle_window)
    return batches
