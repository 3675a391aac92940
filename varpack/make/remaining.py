"""What a run has left, planned again: the general case of ``varpack replan``.

When the global batch or a planning option changes (another ``dp x grad_accum``, budget, cost
model, balance options), steps cannot be kept whole. The samples the parent plan would still
train from step ``S`` are then planned again, epoch by epoch, with the planner itself
(:func:`varpack.plan.plan_arrays`):

- each epoch's samples are taken in the order the parent trains them (step, rank, micro-batch,
  position) and given to the planner as that epoch's permutation
  (:func:`varpack.plan.kernels.permute.given_orders`): a shuffled plan's windows are cut from
  that order, so every sample trains within about one window of where it was; a curriculum
  plan's order is the sorted order of what is left;
- the epoch of ``S`` holds only the samples its steps ``>= S`` hold; the later epochs all of them;
- each epoch is planned as a plan of its own (one epoch, completed to whole steps), its steps
  numbered on from ``S``; the LR factors follow the new global batch;
- carried columns keep the parent's values, joined by sample id;
- the pieces of split documents (``--oversize split``) are planned as the units they are, with
  their offsets: the planner is given them selected already (:func:`varpack.plan.planner.plan_selected`),
  the pieces of one document numbered as one group so that none share a micro-batch, and a
  document's pieces trained before ``S`` stay its parent's;
- the data-dependent defaults are the remaining samples' (``--batching blocks``: the block
  length is the longest remaining sample, the same for every epoch).

Refused in one line: a remaining sample that the new options would drop or that fits no
micro-batch (a smaller budget, block length or another pad multiple).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.errors import ConfigError
from varpack.make.carry import join
from varpack.plan.arrays import PlanArrays, Selection
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.permute import given_orders
from varpack.plan.planner import plan_selected
from varpack.plan.segments import gather_positions
from varpack.plan.stages.batching import composes_by_cost
from varpack.plan.stages.select import oversize, select
from varpack.planfile.format import CARRY_PREFIX
from varpack.planfile.tables import Carried, plan_tables


@dataclasses.dataclass
class Stream:
    """The samples of one epoch a run has left, in the parent's training order."""

    epoch: int
    ids: np.ndarray
    lens: np.ndarray
    offsets: np.ndarray | None = None  # split plans: each piece's first token in its document


def epoch_streams(
    table: pa.Table, rank: np.ndarray, epochs: list[dict[str, Any]], reordered: bool = False
) -> list[Stream]:
    """Each epoch's remaining samples from the parent's rows ``table`` (steps ``>= S``, every
    rank; ``rank``: each row's rank), in training order: step, rank, micro-batch, position.
    ``reordered``: the run's first plan moved micro-batches across epochs (:func:`distinct_epochs`)."""
    step = table.column("step").to_numpy()
    micro = table.column("micro").to_numpy()
    order = np.lexsort((micro, rank, step))
    ids_col = table.column("sample_ids").combine_chunks()
    lens_col = table.column("seq_lens").combine_chunks()
    off = ids_col.offsets.to_numpy().astype(np.int64)
    counts = np.diff(off)
    pos, _ = gather_positions(off[:-1][order], counts[order])  # the rows' samples, in order
    ids = ids_col.values.to_numpy()[pos]
    lens = lens_col.values.to_numpy().astype(np.int64)[pos]
    offs = None
    if "sample_offsets" in table.column_names:  # split pieces keep where they start
        offs = table.column("sample_offsets").combine_chunks().values.to_numpy()[pos]
    row_step = np.repeat(step[order], counts[order])
    first = np.array([int(e["first_step"]) for e in epochs], dtype=np.int64)
    which = np.searchsorted(first, row_step, "right") - 1
    if reordered:  # a sort of what is left: only where micro-batches crossed epochs
        which = distinct_epochs(ids, offs, which, len(first))
    out = []
    for k, e in enumerate(epochs):
        sel = which == k
        if sel.any():
            out.append(
                Stream(int(e["epoch"]), ids[sel], lens[sel], None if offs is None else offs[sel])
            )
    return out


def distinct_epochs(
    ids: np.ndarray, offsets: np.ndarray | None, which: np.ndarray, count: int
) -> np.ndarray:
    """Each remaining sample's epoch (``which``: the index of the epoch its step is in, of
    ``count``), with no unit (id and offset) twice in one epoch where it can be helped.
    ``--warmup reorder`` moves micro-batches across epochs' steps (one of every shape to the
    front, the rest shifted), so a unit may be left twice in the steps of one epoch and missing
    from another's; its occurrences then take, in training order, the last epochs (such a plan
    promises each sample once per epoch over the whole run, which ``validate`` checks). A unit
    left more times than there are epochs keeps its extra occurrences in the first one.

    >>> distinct_epochs(np.array([4, 4, 7]), None, np.array([0, 0, 0]), 2).tolist()
    [0, 1, 0]
    >>> distinct_epochs(np.array([4, 4, 4]), None, np.array([0, 1, 1]), 2).tolist()
    [0, 0, 1]
    """
    if count == 1:  # nothing to move to
        return which
    offs = np.zeros_like(ids) if offsets is None else offsets
    o = np.lexsort((offs, ids))  # stable: each unit's occurrences stay in training order
    i, f, w = ids[o], offs[o], which[o]
    new = np.ones(len(o), dtype=bool)
    new[1:] = (i[1:] != i[:-1]) | (f[1:] != f[:-1])
    group = np.cumsum(new) - 1
    twice = np.zeros(int(group[-1]) + 1 if len(o) else 0, dtype=bool)
    twice[group[1:][~new[1:] & (w[1:] == w[:-1])]] = True
    if not twice.any():
        return which
    starts = np.flatnonzero(new)
    size = np.diff(np.append(starts, len(o)))
    j = np.arange(len(o)) - starts[group]
    moved = twice[group]
    out = which.copy()
    out[o[moved]] = np.maximum(count - size[group] + j, 0)[moved]
    return out


def data_config(streams: list[Stream], cfg: PlanConfig) -> PlanConfig:
    """``cfg`` with the defaults that depend on the data filled from what is left (the block
    length: the longest remaining sample), once for every epoch."""
    return cfg.with_block_len(max(int(s.lens.max()) for s in streams))


def _carry_lookup(table: pa.Table) -> tuple[np.ndarray, pa.Table] | None:
    """The parent's carried values, one row per sample id (``None`` without carried columns)."""
    names = [n for n in table.column_names if n.startswith(CARRY_PREFIX)]
    if not names:
        return None
    ids = table.column("sample_ids").combine_chunks().values.to_numpy()
    _, first = np.unique(ids, return_index=True)
    cols = {
        n[len(CARRY_PREFIX) :]: table.column(n).combine_chunks().values.take(pa.array(first))
        for n in names
    }
    return ids[first], pa.table(cols)


def check_budget(streams: list[Stream], cfg: PlanConfig) -> None:
    """Refuse new options that a remaining sample fits in no micro-batch of (the planner would
    drop it or stop), unless it may go alone; split pieces are never longer than the split
    length, which the budget still fits (else the config is refused)."""
    if cfg.oversize in ("alone", "split"):
        return
    blocks = cfg.batching == "blocks"
    limit = f"--block-len {cfg.block_len}" if blocks else f"--max-tokens {cfg.max_tokens}"
    for s in streams:
        over = np.flatnonzero(oversize(s.lens, cfg))
        if len(over):
            i = over[0]
            raise ConfigError(
                f"{limit}: sample {int(s.ids[i])} ({int(s.lens[i]):,} tokens, epoch {s.epoch}) "
                f"fits no micro-batch, and {len(over) - 1:,} more; keep a budget of at least "
                "the longest remaining sample"
            )


@dataclasses.dataclass
class Planned:
    """What is left, planned: each rank's manifest, the epochs' entries and the samples that
    exceed the budget alone (``--oversize alone``)."""

    tables: list[pa.Table]
    epochs: list[dict[str, int]]
    alone: list[int]


def plan_streams(
    streams: list[Stream], cfg: PlanConfig, from_step: int, rows: pa.Table, where: str
) -> Planned:
    """The streams planned one epoch at a time (steps numbered from ``from_step``); ``cfg``
    with its data defaults filled (:func:`data_config`); ``rows``: the parent's rows (their
    carried values)."""
    check_budget(streams, cfg)
    lookup = _carry_lookup(rows)
    per_rank: list[list[pa.Table]] = [[] for _ in range(cfg.dp)]
    epochs, offset, alone = [], from_step, set()
    one = dataclasses.replace(cfg, epochs=1)
    for s in streams:
        arrays, carried = _plan_one(s, one, lookup, where)
        alone.update(arrays.oversize_alone)
        for r, t in enumerate(plan_tables(arrays, carried)):
            at = t.schema.get_field_index("step")
            per_rank[r].append(t.set_column(at, "step", pc.add(t.column("step"), offset)))
        epochs.append({"epoch": s.epoch, "first_step": offset, "num_steps": arrays.num_steps})
        offset += arrays.num_steps
    tables = [pa.concat_tables(ts).combine_chunks() for ts in per_rank]
    return Planned(tables, epochs, sorted(alone))


def input_order(
    ids: np.ndarray, lens: np.ndarray, shuffled: bool, offsets: np.ndarray | None = None
) -> np.ndarray:
    """The order that sorts samples by length, the planner's input. Ties: by id, then by
    ``offsets`` (split pieces: the planner's (length, id, offset) order), for a curriculum,
    which the planner packs as it is given; for a shuffled plan, whose epoch order is given
    separately, in the stream's order, which lets short lengths sort in one radix pass.

    >>> input_order(np.array([7, 3, 5]), np.array([2, 9, 2]), False).tolist()
    [2, 0, 1]
    >>> input_order(np.array([7, 3, 5]), np.array([2, 9, 2]), True).tolist()
    [0, 2, 1]
    >>> input_order(np.array([7, 7]), np.array([4, 4]), False, np.array([4, 0])).tolist()
    [1, 0]
    """
    if not shuffled:
        return np.lexsort((ids, lens) if offsets is None else (offsets, ids, lens))
    if len(lens) and lens.max() < 2**16:
        return np.argsort(lens.astype(np.uint16), kind="stable")  # a radix sort
    return np.argsort(lens, kind="stable")


def given_input(
    ids: np.ndarray, lens: np.ndarray, shuffled: bool, offsets: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(srt, perm)`` for samples given in training order: the planner's input is
    ``ids[srt]``/``lens[srt]`` (:func:`input_order`), and ``perm`` the permutation of it that
    gives back the training order (``srt[perm]`` is ``0, 1, ...``), the epoch's order to give
    the planner (:func:`varpack.plan.kernels.permute.given_orders`).

    >>> srt, perm = given_input(np.array([7, 3, 5]), np.array([9, 2, 4]), True)
    >>> srt.tolist(), srt[perm].tolist()
    ([1, 2, 0], [0, 1, 2])
    """
    srt = input_order(ids, lens, shuffled, offsets)
    perm = np.empty(len(srt), dtype=np.int64)
    perm[srt] = np.arange(len(srt))
    return srt, perm


def piece_groups(ids: np.ndarray) -> np.ndarray:
    """Each unit's group: the pieces of one document left in a stream share a number (``-1``
    for a document, or a piece, alone in it), which keeps them out of each other's micro-batch.

    >>> piece_groups(np.array([5, 9, 5, 2, 9, 5])).tolist()
    [0, 1, 0, -1, 1, 0]
    """
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    number = np.cumsum(counts > 1) - 1
    return np.where(counts[inverse] > 1, number[inverse], -1).astype(np.int64)


def _selection(s: Stream, srt: np.ndarray, cfg: PlanConfig) -> Selection:
    """The planner's units: the stream's samples in input order ``srt``, selected by the
    planner's own rule; split pieces with their offsets and groups (select would see them as
    documents no longer than the split length, so whole)."""
    chosen = select(s.ids[srt], s.lens[srt], cfg)
    if s.offsets is None:
        return chosen
    offs = s.offsets[srt]
    return dataclasses.replace(chosen, offsets=offs, group=piece_groups(chosen.ids))


def check_twice(s: Stream, cfg: PlanConfig) -> None:
    """Refuse a piece left twice in one epoch (:func:`distinct_epochs` could not help it)
    where the batcher keeps pieces apart by their size only (steps composed by cost:
    full-budget pieces never fit two to a micro-batch, but a short one fits beside itself)."""
    if s.offsets is None or not composes_by_cost(cfg):
        return
    units = np.unique(np.stack([s.ids, s.offsets]), axis=1)
    if units.shape[1] < len(s.ids):
        raise ConfigError(
            f"replan: a piece is left twice in epoch {s.epoch} (the plan's --warmup reorder "
            "moved it across epochs) and could share a micro-batch with itself; replan from an "
            "earlier step, or keep dp x grad-accum and the options"
        )


def _plan_one(
    s: Stream, cfg: PlanConfig, lookup: tuple[np.ndarray, pa.Table] | None, where: str
) -> tuple[PlanArrays, Carried | None]:
    """One epoch's stream planned in its given order."""
    check_twice(s, cfg)
    srt, perm = given_input(s.ids, s.lens, cfg.order == "shuffle", s.offsets)
    try:
        with given_orders({0: perm} if cfg.order == "shuffle" else {}):
            arrays = plan_selected(_selection(s, srt, cfg))
    except ConfigError as exc:
        raise ConfigError(
            f"the {len(srt):,} samples left of epoch {s.epoch} cannot be planned so: {exc}"
        ) from None
    carried = None if lookup is None else join(arrays.ids, lookup[0], lookup[1], where)
    return arrays, carried
