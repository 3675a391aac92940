"""What every batching strategy shares: the order stage per epoch, and joining the epochs.

:func:`epoch_order` is the order stage: the order chosen by name (``--order``, from
:data:`varpack.plan.kernels.order.ORDERS`) gives one epoch's stream, cut into the segments the
strategy asks for. :class:`EpochJoiner` numbers micro-batches into steps and runs positions and step
numbers on across epochs.
"""

from __future__ import annotations

import numpy as np

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.kernels import assign
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.order import ORDERS, MovedTally, OrderRule, step_size
from varpack.plan.kernels.pack import PackRule, complete, pack
from varpack.plan.kernels.shapes import round_up, round_up_to


def order_rule(cfg: PlanConfig, tokens_per_micro: float | None = None) -> OrderRule:
    """The order's parameters: seed, window and the size of one step (samples or tokens)."""
    if cfg.batching == "blocks":  # a plain permutation: no steps to size
        return OrderRule(cfg.seed, cfg.shuffle_window)
    fixed = cfg.batching == "fixed"
    step = step_size(
        cfg.micro_per_step, cfg.batch_size if fixed else None, cfg.max_tokens, tokens_per_micro
    )
    return OrderRule(cfg.seed, cfg.shuffle_window, step, fixed)


def epoch_order(
    lens: np.ndarray, cfg: PlanConfig, epoch: int, segments: str, rule: OrderRule
) -> tuple[np.ndarray, np.ndarray]:
    """The order stage: ``(index, bounds)`` of one epoch (see :mod:`varpack.plan.kernels.order`)."""
    return ORDERS[cfg.order](lens, epoch, rule, segments)


def tokens_per_micro(
    view: np.ndarray, alone: np.ndarray, cfg: PlanConfig, rule: PackRule
) -> float | None:
    """Real tokens per micro-batch of sorted packing (sizes shuffled steps); None if unused."""
    if cfg.order != "shuffle" or cfg.batching != "budget":
        return None
    _, sorted_off = pack(view, np.array([0, len(view)]), alone, rule)
    return float(view.sum()) / (len(sorted_off) - 1)


def effective_lengths(lens: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None) -> np.ndarray:
    """Each sample's padded length in the padded layout (pad multiple, then chosen lengths)."""
    e = round_up(lens, cfg.pad_multiple)
    return e if lengths is None else round_up_to(e, lengths)


class EpochJoiner:
    """Joins the epochs' micro-batches into one stream: positions and step numbers run on."""

    def __init__(self) -> None:
        self.streams: list[np.ndarray] = []
        self.offs: list[np.ndarray] = []
        self.steps: list[np.ndarray] = []
        self.epochs: list[dict[str, int]] = []
        self.n_pos = self.n_steps = 0

    def add(self, epoch: int, idx: np.ndarray, starts: np.ndarray, per_step: int) -> None:
        """One epoch: stream ``idx`` cut at ``starts``; ``per_step`` micro-batches make a step."""
        m = len(starts) - 1
        self.streams.append(idx)
        self.offs.append(starts[:-1] + self.n_pos)
        self.steps.append(assign.steps_in_order(m, per_step) + self.n_steps)
        self.epochs.append({"epoch": epoch, "first_step": self.n_steps, "num_steps": m // per_step})
        self.n_pos += len(idx)
        self.n_steps += m // per_step

    def join(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream, offsets, step)`` of all epochs (no copy for a single epoch)."""
        one = len(self.streams) == 1
        stream = self.streams[0] if one else np.concatenate(self.streams)
        step = self.steps[0] if one else np.concatenate(self.steps)
        return stream, np.append(np.concatenate(self.offs), self.n_pos), step


class ComposedEpochs:
    """What a composer of shuffled epochs collects, epoch by epoch: the stream (positions of
    the selection) cut into micro-batches, the lengths along it, and how far samples moved
    from their shuffled places; :meth:`batches` makes the plan's ``Batches``."""

    def __init__(self, per_step: int) -> None:
        self.joined, self.tally = EpochJoiner(), MovedTally()
        self.slens: list[np.ndarray] = []
        self.per_step = per_step

    def add(self, epoch: int, perm: np.ndarray, plens: np.ndarray, pos: np.ndarray,
            starts: np.ndarray) -> None:  # fmt: skip
        """Epoch ``epoch``: its permutation ``perm`` (lengths ``plens`` in its order), composed
        into positions ``pos`` of it cut at ``starts``."""
        self.joined.add(epoch, perm[pos], starts, self.per_step)
        self.tally.add_epoch(pos, starts, plens, self.per_step)
        self.slens.append(plens[pos])

    def batches(self, group: int, window: int) -> Batches:
        """Every epoch's micro-batches, ``group`` consecutive ones a rank's share of a step."""
        out = Batches(*self.joined.join(), self.joined.epochs, group=group)
        out.stream_lens = self.slens[0] if len(self.slens) == 1 else np.concatenate(self.slens)
        out.moved = self.tally.figures(window)
        return out


def whole_steps(
    starts: np.ndarray, slens: np.ndarray, cfg: PlanConfig, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, cost)`` of an epoch composed slot by slot (``--sync micro``, or grad-accum 1)
    completed to whole steps: the costliest micro-batches of its last partial step split
    (:func:`~varpack.plan.kernels.pack.complete`), and each micro-batch's cost, by which
    :func:`~varpack.plan.kernels.slots.slot_order` cuts each window's slots (once the caller let
    ``slens``, the stream's lengths, go: they are as long as the stream)."""
    rule = cfg.micro_rule()
    starts = complete(starts, slens, cfg.micro_per_step,
                      lambda o, v: summarize(o, v, rule).cost, f"epoch {epoch}")  # fmt: skip
    return starts, summarize(starts, slens, rule).cost
