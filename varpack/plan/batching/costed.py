"""Cost-composed batching: shuffled steps whose ranks carry the same cost (``--compose cost``).

The strategy for ``--order shuffle`` with ``--batching budget`` in the packed layout (without
``--pp``). Per epoch the order stage gives the permutation (``segments="none"``), and
:func:`varpack.plan.compose.compose_epoch` deals each window of it to steps, ranks and
micro-batches by cost: heavy samples one per rank of a step, the rest filled to each rank's
level within the budget. Every ``grad_accum`` consecutive micro-batches of a step are one rank's
share, so the assign stage moves them whole (``Batches.group``). Where an epoch cannot be
composed so (fewer samples than whole steps need), the plan is composed by tokens
(:mod:`.greedy`).
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.batching import greedy
from varpack.plan.batching.common import EpochJoiner, epoch_order, order_rule, tokens_per_micro
from varpack.plan.compose import compose_epoch
from varpack.plan.config import PlanConfig
from varpack.plan.cost import CostModel, linear_flops_per_token


def cost_coefficients(model: CostModel) -> tuple[float, float]:
    """``(lin, quad)`` with a sample of ``x`` tokens costing ``lin * x + quad * x^2``.

    >>> cost_coefficients(CostModel("tokens"))
    (1.0, 0.0)
    """
    if model.kind != "flops":  # tokens, and padded in the packed layout: the length
        return 1.0, 0.0
    dims = model.model_dims
    return linear_flops_per_token(dims), dims.layers * 4.0 * dims.hidden


def build(
    lens: np.ndarray, alone: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> Batches:
    """Micro-batches and steps of all epochs, composed by cost."""
    assert cfg.max_tokens is not None
    rule = cfg.pack_rule()
    orule = order_rule(cfg, tokens_per_micro(lens, alone, cfg, rule))
    coeffs = cost_coefficients(cfg.cost_model())
    joined, slens = EpochJoiner(), []
    for epoch in range(cfg.epochs):
        perm, _ = epoch_order(lens, cfg, epoch, "none", orule)
        got = compose_epoch(
            perm,
            lens,
            alone,
            coeffs,
            orule.window * orule.step,
            orule.step,
            cfg.dp,
            cfg.grad_accum,
            cfg.pad_multiple,
            cfg.max_tokens,
        )
        del perm
        if got is None:
            return greedy.build(lens, alone, cfg, lengths)
        idx, off = got
        joined.add(epoch, idx, off, cfg.micro_per_step)
        slens.append(lens[idx])
    batches = Batches(*joined.join(), joined.epochs, group=cfg.grad_accum)
    batches.stream_lens = slens[0] if len(slens) == 1 else np.concatenate(slens)
    return batches
