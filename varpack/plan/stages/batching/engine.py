"""Batching by the balance engine (``--compose engine``): shuffled steps composed for the plan's
objective, window by window (:mod:`varpack.plan.engine`).

Per epoch the shuffle order's permutation comes with the lengths moved along
(:func:`varpack.plan.kernels.permute.permuted`, as for ``--compose cost``), and
:func:`varpack.plan.engine.epoch.compose_epoch` composes it: under ``--sync step`` a bin is a
rank's ``grad_accum`` micro-batches of a step (the assign stage moves them whole,
``Batches.group``); under ``--sync micro`` a bin is one micro-batch and a step ``grad_accum``
slots of ``dp`` (the assign stage cuts each step's slots by cost). Where an epoch has too few
samples for whole steps it is composed by tokens (:mod:`.greedy`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.engine.epoch import compose_run
from varpack.plan.kernels.compose_threads import default_threads, threaded
from varpack.plan.kernels.permute import permuted
from varpack.plan.kernels.slots import move_micro, slot_order
from varpack.plan.mix import blend_sources
from varpack.plan.rules import capacity
from varpack.plan.stages.batching import greedy
from varpack.plan.stages.batching.common import ComposedEpochs, order_rule, tokens_per_micro
from varpack.plan.sync import slotted
from varpack.plan.tuning import ENGINE_FILL, ENGINE_PASSES

#: Lengths up to this are priced from a table (8 bytes a length); an epoch with a longer
#: sample (alone in its micro-batch) is priced sample by sample instead
PRICE_TABLE = 1 << 24


def regime(cfg: PlanConfig) -> tuple[int, int]:
    """``(kb, gps)``: the micro-batches of a bin and the groups of a step, as the ranks meet."""
    if slotted(cfg.sync, cfg.grad_accum):
        return 1, cfg.grad_accum
    return cfg.grad_accum, 1


def check(cfg: PlanConfig) -> None:
    """Refuse, in one line, what the engine does not compose yet."""
    if cfg.layout != "packed" or cfg.pp > 1 or blend_sources() is not None:
        raise ConfigError(
            "--compose engine composes the packed layout without --pp or --mix; use "
            "--compose cost for the others"
        )


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # unused: only full-budget pieces are composed by cost
) -> Batches:
    """Micro-batches and steps of all epochs, composed by the engine."""
    assert cfg.max_tokens is not None
    check(cfg)
    orule = order_rule(cfg, tokens_per_micro(lens, alone, cfg, cfg.pack_rule()))
    model = cfg.cost_model()
    longest = int(lens.max(initial=0))
    price = sample_cost(np.arange(min(longest, PRICE_TABLE) + 1), model)
    kb, gps = regime(cfg)
    cap = capacity(cfg.pad_multiple, cfg.max_tokens)
    composed = ComposedEpochs(cfg.micro_per_step)
    window_tok = max(orule.window * orule.step, 1)
    run = partial(compose_run, price=price, window_tok=window_tok, dp=cfg.dp, kb=kb, gps=gps,
                  cap=cap, fill_to=ENGINE_FILL, passes=ENGINE_PASSES)  # fmt: skip
    threads = default_threads()  # the plan is the same whatever their number
    for epoch in range(cfg.epochs):
        perm, plens = permuted(cfg.seed, epoch, lens)
        arrays = (plens, alone[perm] if alone.any() else np.zeros(len(perm), dtype=np.bool_))
        if longest > PRICE_TABLE:  # priced sample by sample
            arrays += (sample_cost(plens, model),)
        got = threaded(arrays, run, window_tok, window_tok // 2, cfg.dp * kb * gps, threads)
        if got is None:
            return greedy.build(lens, alone, cfg, lengths)
        stream, starts = got.stream, got.starts
        del got
        if kb == 1:  # the ranks meet at every micro-batch: slots of alike cost
            each = arrays[2][stream] if len(arrays) > 2 else price[plens[stream]]
            cost = np.add.reduceat(each, starts[:-1]) if len(stream) else price[:0]
            (stream,), starts = move_micro(
                (stream,), starts, slot_order(cost, cfg.dp, cfg.grad_accum, cfg.shuffle_window)
            )
        composed.add(epoch, perm, plens, stream, starts)
    return composed.batches(kb, cfg.shuffle_window)
