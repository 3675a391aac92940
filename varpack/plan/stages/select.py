"""Stage 1, select: which samples are planned, and how the oversize ones are treated.

Checks the input (non-empty, positive lengths that fit the manifest's int32), fills the
data-dependent defaults (the block length is the longest sample), then applies the oversize
strategy chosen by name from :data:`OVERSIZE`: ``error`` (refuse, naming the samples), ``drop``
(plan the rest; plan.json lists the dropped ones and why), ``alone`` (each gets a micro-batch
of its own, within the bound of :func:`varpack.plan.oversize.check_alone`) or ``split`` (every
document longer than ``--split-len`` becomes pieces, :mod:`varpack.plan.kernels.split`; the
selection's units are then documents and pieces, with their offsets). Inside
:func:`given_pieces` the input is units already (``plan --mix`` draws documents, then plans
their pieces).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.plan.arrays import Selection
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.pack import oversize_mask
from varpack.plan.kernels.split import split_units
from varpack.plan.oversize import check_alone

SHOW_IDS = 5  # samples an error names
#: units given by the caller (:func:`given_pieces`): each one's offset and split document
_PIECES: ContextVar[tuple[np.ndarray, np.ndarray] | None] = ContextVar("pieces", default=None)


@contextmanager
def given_pieces(offsets: np.ndarray, group: np.ndarray) -> Iterator[None]:
    """Inside the block, the planner's input is units already, documents and pieces of at most
    ``--split-len`` tokens: ``offsets[i]``, unit ``i``'s first token in its document, and
    ``group[i]`` its split document (-1: a whole one; pieces of one group never share a
    micro-batch). ``plan --mix`` draws whole documents and plans their pieces so."""
    token = _PIECES.set((np.asarray(offsets, np.int64), np.asarray(group, np.int64)))
    try:
        yield
    finally:
        _PIECES.reset(token)


def select(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> Selection:
    """The samples to plan, from sorted ``ids`` / ``lens`` and a resolved config."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    check_input(ids, lens)
    cfg = cfg.with_block_len(int(lens.max()))
    over = lens > (cfg.split_len or 0) if cfg.oversize == "split" else oversize(lens, cfg)
    given = _PIECES.get()
    if given is not None:  # units already: none is longer than a piece
        if len(given[0]) != len(ids) or over.any():
            raise ValueError("the given pieces are not the input's units")
        chosen = Selection(cfg, ids, lens, np.zeros(len(ids), bool), offsets=given[0],
                           group=given[1])  # fmt: skip
    elif not over.any():
        chosen = Selection(cfg, ids, lens, np.zeros(len(ids), dtype=bool))
    else:
        chosen = OVERSIZE[cfg.oversize](ids, lens, over, cfg)
    check_fills_step(len(chosen.ids), cfg)
    return chosen


#: Peak bytes per planned sample and epoch (stream, lengths, gathers, manifest columns), and per
#: input sample (ids and lengths), measured on shuffled 100 M-sample plans with some margin.
BYTES_PER_ROW = 64
BYTES_PER_INPUT = 24


def plan_bytes(num_samples: int, cfg: PlanConfig) -> int:
    """Estimated peak memory of planning ``num_samples`` samples with ``cfg``.

    >>> plan_bytes(1_000_000, PlanConfig(max_tokens=8, epochs=2)) // 1_000_000
    152
    """
    return num_samples * (BYTES_PER_ROW * cfg.epochs + BYTES_PER_INPUT)


def check_input(ids: np.ndarray, lens: np.ndarray) -> None:
    if len(ids) == 0:
        raise InputError("the input holds no samples; nothing to plan")
    if len(ids) != len(lens):
        raise InputError(f"{len(ids)} sample ids but {len(lens)} lengths")
    if lens.min() <= 0:
        raise InputError(
            f"sample_id {int(ids[np.argmin(lens)])}: non-positive seq_len; lengths must be > 0"
        )
    if lens.max() > np.iinfo(np.int32).max:
        raise InputError(
            f"sample_id {int(ids[np.argmax(lens)])}: seq_len does not fit int32 (manifest type)"
        )


def check_fills_step(n: int, cfg: PlanConfig) -> None:
    per_step = cfg.micro_per_step
    if n < per_step:
        raise ConfigError(
            f"{n} samples cannot fill one step of dp x grad_accum = {per_step} micro-batches "
            "(every rank needs grad_accum micro-batches per step); lower --dp or --grad-accum"
        )


def _limit(cfg: PlanConfig) -> str:
    return "--block-len" if cfg.batching == "blocks" else "--max-tokens"


def oversize(lens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Samples that fit no micro-batch even alone."""
    if cfg.batching == "blocks":
        return lens > (cfg.block_len or 0)
    if cfg.batching != "budget":
        return np.zeros(len(lens), dtype=bool)
    return oversize_mask(lens, cfg.pack_rule())


def _error(ids: np.ndarray, lens: np.ndarray, over: np.ndarray, cfg: PlanConfig) -> Selection:
    where = np.flatnonzero(over)[:SHOW_IDS]
    raise oversize_error(int(over.sum()), ids[where], lens[where], cfg)


def oversize_error(count: int, ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> ConfigError:
    """The error of ``count`` samples that fit nowhere, naming the first ones (``ids``/``lens``)."""
    shown = ", ".join(f"{int(i)} ({int(n)} tokens)" for i, n in zip(ids, lens, strict=True))
    more = f" and {count - SHOW_IDS} more" if count > SHOW_IDS else ""
    limit = _limit(cfg)
    value = cfg.block_len if cfg.batching == "blocks" else cfg.max_tokens
    return ConfigError(
        f"{count} samples do not fit {limit} {value} even alone: sample_id {shown}{more}; "
        + ("pass --oversize split (pieces of the budget), " if cfg.batching != "blocks" else "")
        + f"raise {limit}, or pass --oversize drop (skip them)"
        + (" or --oversize alone (own micro-batch)" if cfg.batching != "blocks" else "")
    )


def _drop(ids: np.ndarray, lens: np.ndarray, over: np.ndarray, cfg: PlanConfig) -> Selection:
    gone = np.flatnonzero(over)
    dropped = [{"sample_id": int(ids[i]), "seq_len": int(lens[i]), "reason": drop_reason(cfg)}
               for i in gone]  # fmt: skip
    keep = ~over
    return Selection(cfg, ids[keep], lens[keep], np.zeros(int(keep.sum()), bool), dropped)


def _alone(ids: np.ndarray, lens: np.ndarray, over: np.ndarray, cfg: PlanConfig) -> Selection:
    notes = check_alone(ids[over], lens[over], cfg)
    return Selection(cfg, ids, lens, over, notes=notes)


def drop_reason(cfg: PlanConfig) -> str:
    """Why ``--oversize drop`` dropped a sample (plan.json's ``dropped``)."""
    return f"oversize: longer than {_limit(cfg)} {cfg.block_len or cfg.max_tokens}"


def _split(ids: np.ndarray, lens: np.ndarray, over: np.ndarray, cfg: PlanConfig) -> Selection:
    assert cfg.split_len is not None
    units = split_units(ids, lens, cfg.split_len)
    assert units is not None  # ``over`` holds a document longer than the split length
    alone = np.zeros(len(units.ids), dtype=bool)
    return Selection(cfg, units.ids, units.lens, alone, offsets=units.offsets, group=units.group)


#: oversize strategy name -> ``fn(ids, lens, oversize mask, cfg) -> Selection``
OVERSIZE: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray, PlanConfig], Selection]] = {
    "error": _error,
    "drop": _drop,
    "alone": _alone,
    "split": _split,
}
