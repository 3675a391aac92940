"""Batching by the balance engine (``--compose engine``): shuffled steps composed for the plan's
objective, window by window (:mod:`varpack.plan.engine`).

Per epoch the shuffle order's permutation comes with the lengths moved along
(:func:`varpack.plan.kernels.permute.permuted`, as for ``--compose cost``), and the engine's
rule (:class:`EngineRule`) composes its runs on threads (the same plan whatever their number;
the MPI planner calls the same rule): under ``--sync step`` a bin is a rank's ``grad_accum``
micro-batches of a step (the assign stage moves them whole, ``Batches.group``); under ``--sync
micro`` a bin is one micro-batch, a step ``grad_accum`` slots of ``dp``, and the epoch's
micro-batches are cut into slots of alike cost, window by window. Where an epoch has too few
samples for whole steps it is composed by tokens (:mod:`.greedy`). :func:`batch_steps` composes
the steps of a batch planned in memory (``plan_batch(compose="engine")``)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cost import CostModel, sample_cost
from varpack.plan.engine.epoch import compose_run, emit
from varpack.plan.engine.window import compose_steps
from varpack.plan.kernels.compose import Composed
from varpack.plan.kernels.compose_threads import default_threads, threaded
from varpack.plan.kernels.order import OrderRule
from varpack.plan.kernels.permute import permuted
from varpack.plan.kernels.slots import move_micro, slot_order
from varpack.plan.mix import blend_sources
from varpack.plan.rules import capacity
from varpack.plan.stages.batching import greedy
from varpack.plan.stages.batching.common import ComposedEpochs, order_rule, tokens_per_micro
from varpack.plan.sync import slotted
from varpack.plan.tuning import BATCH_TOLERANCE, ENGINE_FILL, ENGINE_PASSES, MORE_MICRO

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


class EngineRule(NamedTuple):
    """How the engine composes an epoch: the one rule of the one-process planner (:func:`build`,
    on threads) and the MPI planner (:mod:`varpack.make.mpi.shuffle`), each composing runs of
    the permuted stream (:meth:`compose`) and, where the ranks meet at every micro-batch,
    cutting the composed micro-batches into slots of alike cost (:meth:`slot_cut`)."""

    model: CostModel
    price: np.ndarray  # the cost of a sample of each length, up to the epoch's longest
    per_sample: bool  # lengths beyond the table: priced sample by sample
    window_tokens: int
    dp: int
    kb: int
    gps: int
    cap: int
    grad_accum: int
    shuffle_window: int

    @property
    def tail_tokens(self) -> int:
        """An epoch's tail of fewer tokens joins the window before it."""
        return self.window_tokens // 2

    @property
    def per_step(self) -> int:
        return self.dp * self.kb * self.gps

    @property
    def cut(self) -> bool:
        """The ranks meet at every micro-batch: the epoch's micro-batches are cut into slots."""
        return self.kb == 1

    def costs(self, lens: np.ndarray) -> np.ndarray:
        """Each sample's cost (the same numbers from the table or the model)."""
        return sample_cost(lens, self.model) if self.per_sample else self.price[lens]

    def compose(
        self, arrays: tuple[np.ndarray, ...], run: tuple[int, int, int, int, np.ndarray]
    ) -> Composed | None:
        """A run of the permuted stream (``arrays``: its lengths and lone flags; ``run``: its
        place in the epoch, as :func:`~varpack.plan.engine.epoch.compose_run` reads it)."""
        lens = arrays[0]
        if self.per_sample:
            arrays = (*arrays[:2], sample_cost(lens, self.model))
        return compose_run(arrays, run, self.price, self.window_tokens, self.dp, self.kb,
                           self.gps, self.cap, ENGINE_FILL, ENGINE_PASSES)  # fmt: skip

    def slot_cut(self, slens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The order of an epoch's micro-batches (whole steps, cut at ``starts`` from the
        stream's lengths ``slens``) cut into slots of alike cost
        (:func:`~varpack.plan.kernels.slots.slot_order`)."""
        cost = np.add.reduceat(self.costs(slens), starts[:-1]) if len(slens) else np.zeros(0)
        return slot_order(cost, self.dp, self.grad_accum, self.shuffle_window)


def engine_rule(cfg: PlanConfig, orule: OrderRule, longest: int) -> EngineRule:
    """The engine's rule for ``cfg``'s epochs (``orule``: its order rule; ``longest``: the
    longest selected sample, over every rank)."""
    assert cfg.max_tokens is not None
    check(cfg)
    model = cfg.cost_model()
    kb, gps = regime(cfg)
    return EngineRule(
        model,
        sample_cost(np.arange(min(longest, PRICE_TABLE) + 1), model),
        longest > PRICE_TABLE,
        max(orule.window * orule.step, 1),
        cfg.dp,
        kb,
        gps,
        capacity(cfg.pad_multiple, cfg.max_tokens),
        cfg.grad_accum,
        cfg.shuffle_window,
    )


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # unused: only full-budget pieces are composed by cost
) -> Batches:
    """Micro-batches and steps of all epochs, composed by the engine."""
    orule = order_rule(cfg, tokens_per_micro(lens, alone, cfg, cfg.pack_rule()))
    rule = engine_rule(cfg, orule, int(lens.max(initial=0)))
    composed = ComposedEpochs(cfg.micro_per_step)
    threads = default_threads()  # the plan is the same whatever their number
    for epoch in range(cfg.epochs):
        perm, plens = permuted(cfg.seed, epoch, lens)
        lone = alone[perm] if alone.any() else np.zeros(len(perm), dtype=np.bool_)
        got = threaded((plens, lone), rule.compose, rule.window_tokens, rule.tail_tokens,
                       rule.per_step, threads)  # fmt: skip
        if got is None:
            return greedy.build(lens, alone, cfg, lengths)
        stream, starts = got.stream, got.starts
        del got
        if rule.cut:
            (stream,), starts = move_micro((stream,), starts, rule.slot_cut(plens[stream], starts))
        composed.add(epoch, perm, plens, stream, starts)
    return composed.batches(rule.kb, cfg.shuffle_window)


def batch_steps(
    steps: list[tuple[np.ndarray, np.ndarray]], cfg: PlanConfig
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int] | None:
    """A batch planned in memory (``plan_batch``), each of its steps (``(lens, alone)``: its
    samples) composed by the engine on its own into ``dp x K`` micro-batches: ``K`` the fewest
    that composes every step, from the fewest a rank needs for the fullest step's tokens up to
    :data:`~varpack.plan.tuning.MORE_MICRO` of them more, and one (beyond, only where none of
    those composes: up to the most that leave no micro-batch empty). Each step's samples in
    their composed order and its micro-batch starts (ranks' shares of ``kb`` micro-batches in
    turn; slot after slot under ``--sync micro``), and ``K``; None where no ``K`` will do."""
    assert cfg.max_tokens is not None
    check(cfg)
    cap = capacity(cfg.pad_multiple, cfg.max_tokens)
    model = cfg.cost_model()
    fewest = max(-(-int(lens.sum()) // (cfg.dp * cap)) for lens, _ in steps)
    least = min(len(lens) for lens, _ in steps) // cfg.dp  # K that leaves no micro-batch empty
    priced = [_priced(lens, alone, model, cap) for lens, alone in steps]

    def composed(k: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
        kb, gps = regime(dataclasses.replace(cfg, grad_accum=k))
        parts = []
        for x in priced:
            got = _batch_step(*x, cfg.dp, kb, gps, cap)
            if got is None:
                return None
            parts.append(got)
        return parts

    # the fewest K that composes, found by bisection (more micro-batches only add room): up
    # to MORE_MICRO more than the fewest, else up to the most that leave none empty
    lo, hi = max(fewest, 1), min(fewest + int(MORE_MICRO * fewest) + 1, least)
    found = composed(hi) if hi >= lo else None
    if found is None and least > hi:
        lo, hi = max(hi + 1, lo), least
        found = composed(hi)
    if found is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        got = composed(mid)
        if got is None:
            lo = mid + 1
        else:
            hi, found = mid, got
    return found, hi


def _priced(
    lens: np.ndarray, alone: np.ndarray, model: CostModel, cap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step's samples' costs, tokens (a lone one counts the budget) and order, costliest
    (longest) first, ties in the step's order."""
    tok = np.where(alone, cap, lens).astype(np.int64)
    return sample_cost(lens, model), tok, np.lexsort((np.arange(len(lens)), -lens))


def _batch_step(
    cost: np.ndarray, tok: np.ndarray, order: np.ndarray, dp: int, kb: int, gps: int, cap: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """One step composed: its samples' order and micro-batch starts, or None."""
    m = len(cost)
    out_bin, out_mb = np.empty(m, np.int64), np.empty(m, np.int64)
    if not np.isfinite(compose_steps(cost, tok, order, np.int64(1), np.int64(dp), np.int64(kb),
                                     np.int64(gps), np.int64(cap), np.int64(ENGINE_PASSES),
                                     float(BATCH_TOLERANCE), out_bin, out_mb)):  # fmt: skip
        return None
    pos, starts = np.empty(m, dtype=np.int64), np.empty(dp * kb * gps + 1, dtype=np.int64)
    _, nmb = emit(np.arange(m, dtype=np.int64), order, cost, out_bin, out_mb, np.int64(1),
                  np.int64(dp), np.int64(kb), np.int64(gps), pos, np.int64(0), starts,
                  np.int64(0))  # fmt: skip
    starts[nmb] = m
    return pos, starts
