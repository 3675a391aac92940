"""Cost-composed batching: shuffled steps whose ranks carry the same cost (``--compose cost``).

The strategy for ``--order shuffle`` with ``--batching budget`` in the packed layout (with
``--pp`` too, where a rank's micro-batches are never underfilled: they are padded alike). Per
epoch the shuffle order's permutation comes with the lengths moved along
(:func:`varpack.plan.kernels.permute.permuted`), and
:func:`varpack.plan.kernels.compose.compose_run` deals each window of it to steps, ranks and
micro-batches by cost: heavy samples one per rank of a step, the rest filled to each rank's
level within the budget. Every ``grad_accum`` consecutive micro-batches of a step are one rank's
share, so the assign stage moves them whole (``Batches.group``). With ``--sync micro`` (and
at grad-accum 1) the windows are composed as steps of grad-accum 1 (slots: one micro-batch per
rank), and each window's micro-batches are then cut into slots by cost and dealt to its steps
(:mod:`varpack.plan.kernels.slots`). Where an epoch cannot be composed so (fewer samples than
whole steps need), the plan is composed by tokens (:mod:`.greedy`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cost import cost_coefficients
from varpack.plan.kernels.compose import Composed, compose_run
from varpack.plan.kernels.compose_threads import compose_threaded, default_threads
from varpack.plan.kernels.order import OrderRule
from varpack.plan.kernels.permute import permuted
from varpack.plan.kernels.slots import move_micro, slot_order
from varpack.plan.mix import blend_sources
from varpack.plan.rules import capacity
from varpack.plan.stages.batching import greedy
from varpack.plan.stages.batching.common import (
    ComposedEpochs,
    order_rule,
    tokens_per_micro,
    whole_steps,
)
from varpack.plan.sync import slotted
from varpack.plan.tuning import MIX_SHARE, PP_FILL


def mix_seed(seed: int, epoch: int) -> np.uint64:
    """The seed of the slot cut's order among alike micro-batches (grad-accum 1) in ``epoch``."""
    return np.uint64((seed + (epoch + 1) * 0x9E3779B97F4A7C15) % 2**64)


def step_tokens(sorted_step: int, cfg: PlanConfig) -> int:
    """Tokens a step is composed from: what sorted packing puts in one; with ``--pp`` near the
    whole budget, as every micro-batch of a rank is padded to its fullest."""
    if cfg.pp == 1:
        return sorted_step
    full = cfg.micro_per_step * capacity(cfg.pad_multiple, cfg.max_tokens or 0)
    return max(sorted_step, int(PP_FILL * full))


def step_fill(cfg: PlanConfig) -> float:
    """The budget fill a step of heavy samples keeps at least: ``--balance-fill``, or all of
    it with ``--pp`` (a rank's micro-batches are padded alike)."""
    return 1.0 if cfg.pp > 1 else cfg.balance_fill


def levelled(cfg: PlanConfig) -> bool:
    """Are composed windows levelled by moves and swaps? Not with ``--pp``: a rank's
    micro-batches are padded to its fullest there, and a move could raise that."""
    return cfg.pp == 1


class Composing(NamedTuple):
    """How an epoch is composed by cost: the one rule of the one-process planner
    (:func:`build`) and the MPI planner (:mod:`varpack.make.mpi.shuffle`).
    :func:`~varpack.plan.kernels.compose.compose_run`'s arguments (:meth:`run_args`, ``k``:
    the micro-batches a rank takes in each step the kernel composes), then, where ``cut``, the
    composed micro-batches cut into slots by cost (:func:`slot_cut`)."""

    coeffs: tuple[float, float]
    window_tokens: int
    step_tokens: int
    dp: int
    k: int
    multiple: int
    budget: int
    fill: float
    level: bool
    mix: bool
    cut: bool

    def run_args(self) -> tuple[tuple[float, float], int, int, int, int, int, int, float]:
        """compose_run's positional arguments after the lengths and lone flags."""
        return (self.coeffs, self.window_tokens, self.step_tokens, self.dp, self.k,
                self.multiple, self.budget, self.fill)  # fmt: skip

    @property
    def tail_tokens(self) -> int:
        """An epoch's tail of fewer tokens joins the window before it."""
        return self.step_tokens

    @property
    def per_step(self) -> int:
        return self.dp * self.k

    def compose(
        self, arrays: tuple[np.ndarray, ...], run: tuple[int, int, int, int, np.ndarray]
    ) -> Composed | None:
        """A run of the permuted stream (``arrays``: its lengths and lone flags; ``run``: its
        place in the epoch, as :func:`compose_run` reads it), without a blend."""
        return compose_run(arrays[0], arrays[1], *self.run_args(), None, run, level=self.level,
                           mix=self.mix)  # fmt: skip


def composing(cfg: PlanConfig, orule: OrderRule, blend: bool) -> Composing:
    """The composition of ``cfg``'s epochs (``orule``: its order rule; ``blend``: a blend
    keeps its sources' weights in every step). With ``--sync micro`` (and at grad-accum 1)
    the windows are composed as steps of one micro-batch a rank (slots) and cut into slots by
    cost after; a blend's steps are composed whole (a slot of dp micro-batches is too small to
    hold the weights) and the assign stage cuts each step into slots."""
    assert cfg.max_tokens is not None
    slots = cfg.grad_accum if slotted(cfg.sync, cfg.grad_accum) and not blend else 1
    return Composing(
        cost_coefficients(cfg.cost_model()),
        orule.window * orule.step,
        step_tokens(orule.step, cfg) // slots,
        cfg.dp,
        cfg.grad_accum // slots,
        cfg.pad_multiple,
        cfg.max_tokens,
        step_fill(cfg),
        levelled(cfg),
        cfg.grad_accum == 1 and not blend,
        (slots > 1 or cfg.grad_accum == 1) and not blend,
    )


def slot_cut(cost: np.ndarray, dealt: np.ndarray, cfg: PlanConfig, epoch: int) -> np.ndarray:
    """The order of an epoch's micro-batches (whole steps, ``cost`` each) cut into slots by
    cost (:func:`~varpack.plan.kernels.slots.slot_order`); ``dealt``: whether each one's
    window was dealt window-wide (grad-accum 1: such windows' alike micro-batches mix)."""
    mix = None
    if cfg.grad_accum == 1:
        mix = (MIX_SHARE, mix_seed(cfg.seed, epoch), dealt)
    return slot_order(cost, cfg.dp, cfg.grad_accum, cfg.shuffle_window, mix)


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # unused: only full-budget pieces are composed by cost
) -> Batches:
    """Micro-batches and steps of all epochs, composed by cost."""
    rule = cfg.pack_rule()
    orule = order_rule(cfg, tokens_per_micro(lens, alone, cfg, rule))
    composed = ComposedEpochs(cfg.micro_per_step)
    blend = blend_sources()  # a blend (--mix): every step keeps its sources' weights
    how = composing(cfg, orule, blend is not None)
    threads = default_threads()  # the plan is the same whatever their number
    for epoch in range(cfg.epochs):
        perm, plens = permuted(cfg.seed, epoch, lens)  # the shuffle order's permutation
        got = compose_threaded(
            plens,
            alone[perm] if alone.any() else np.zeros(len(perm), dtype=np.bool_),
            *how.run_args(),
            None if blend is None else (blend[0][perm], blend[1], blend[2]),
            level=how.level,
            mix=how.mix,
            threads=threads,
        )
        if got is None:
            return greedy.build(lens, alone, cfg, lengths)
        pos, off, wide = got.stream, got.starts, got.wide
        del got
        if how.cut:  # slots cut by cost
            sl = plens[pos]
            off, cost = whole_steps(off, sl, cfg, epoch)
            del sl
            dealt = wide[off[:-1]] if len(wide) else np.zeros(len(off) - 1, np.bool_)
            (pos,), off = move_micro((pos,), off, slot_cut(cost, dealt, cfg, epoch))
        composed.add(epoch, perm, plens, pos, off)
        del perm, plens, pos, wide
    return composed.batches(how.k, cfg.shuffle_window)
