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
- carried columns keep the parent's values, joined by sample id.

Refused in one line: ``--oversize split`` and ``--cp`` plans (a piece's offset and a CP
placement are not re-planned yet), and a remaining sample longer than a new budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.errors import ConfigError
from varpack.manifest.carry import Carried, join
from varpack.manifest.format import CARRY_PREFIX
from varpack.manifest.tables import plan_tables
from varpack.plan import plan_arrays
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.permute import given_orders
from varpack.plan.segments import gather_positions


@dataclasses.dataclass
class Stream:
    """The samples of one epoch a run has left, in the parent's training order."""

    epoch: int
    ids: np.ndarray
    lens: np.ndarray


def epoch_streams(table: pa.Table, rank: np.ndarray, epochs: list[dict[str, Any]]) -> list[Stream]:
    """Each epoch's remaining samples from the parent's rows ``table`` (steps ``>= S``, every
    rank; ``rank``: each row's rank), in training order: step, rank, micro-batch, position."""
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
    row_step = np.repeat(step[order], counts[order])
    out = []
    for e in epochs:
        lo, hi = int(e["first_step"]), int(e["first_step"]) + int(e["num_steps"])
        sel = (row_step >= lo) & (row_step < hi)
        if sel.any():
            out.append(Stream(int(e["epoch"]), ids[sel], lens[sel]))
    return out


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
    """Refuse a new budget that a remaining sample does not fit (unless it may go alone)."""
    if cfg.max_tokens is None or cfg.oversize == "alone":
        return
    for s in streams:
        over = np.flatnonzero(s.lens > cfg.max_tokens)
        if len(over):
            i = over[0]
            raise ConfigError(
                f"--max-tokens {cfg.max_tokens}: sample {int(s.ids[i])} ({int(s.lens[i]):,} "
                f"tokens, epoch {s.epoch}) is longer, and {len(over) - 1:,} more; keep a budget "
                "of at least the longest remaining sample"
            )


def plan_streams(
    streams: list[Stream], cfg: PlanConfig, from_step: int, rows: pa.Table, where: str
) -> tuple[list[pa.Table], list[dict[str, int]]]:
    """Each rank's manifest of the streams planned one epoch at a time (steps numbered from
    ``from_step``) and the epochs' entries; ``rows``: the parent's rows (their carried values)."""
    check_budget(streams, cfg)
    lookup = _carry_lookup(rows)
    per_rank: list[list[pa.Table]] = [[] for _ in range(cfg.dp)]
    epochs, offset = [], from_step
    one = dataclasses.replace(cfg, epochs=1)
    for s in streams:
        arrays, carried = _plan_one(s, one, lookup, where)
        for r, t in enumerate(plan_tables(arrays, carried)):
            at = t.schema.get_field_index("step")
            per_rank[r].append(t.set_column(at, "step", pc.add(t.column("step"), offset)))
        epochs.append({"epoch": s.epoch, "first_step": offset, "num_steps": arrays.num_steps})
        offset += arrays.num_steps
    tables = [pa.concat_tables(ts).combine_chunks() for ts in per_rank]
    return tables, epochs


def input_order(ids: np.ndarray, lens: np.ndarray, shuffled: bool) -> np.ndarray:
    """The order that sorts samples by length, the planner's input. Ties: by id (curriculum
    order, which the planner packs as it is given); for a shuffled plan, whose epoch order is
    given separately, in the stream's order, which lets short lengths sort in one radix pass.

    >>> input_order(np.array([7, 3, 5]), np.array([2, 9, 2]), False).tolist()
    [2, 0, 1]
    >>> input_order(np.array([7, 3, 5]), np.array([2, 9, 2]), True).tolist()
    [0, 2, 1]
    """
    if not shuffled:
        return np.lexsort((ids, lens))
    if len(lens) and lens.max() < 2**16:
        return np.argsort(lens.astype(np.uint16), kind="stable")  # a radix sort
    return np.argsort(lens, kind="stable")


def given_input(ids: np.ndarray, lens: np.ndarray, shuffled: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(srt, perm)`` for samples given in training order: the planner's input is
    ``ids[srt]``/``lens[srt]`` (:func:`input_order`), and ``perm`` the permutation of it that
    gives back the training order (``srt[perm]`` is ``0, 1, ...``), the epoch's order to give
    the planner (:func:`varpack.plan.kernels.permute.given_orders`).

    >>> srt, perm = given_input(np.array([7, 3, 5]), np.array([9, 2, 4]), True)
    >>> srt.tolist(), srt[perm].tolist()
    ([1, 2, 0], [0, 1, 2])
    """
    srt = input_order(ids, lens, shuffled)
    perm = np.empty(len(srt), dtype=np.int64)
    perm[srt] = np.arange(len(srt))
    return srt, perm


def _plan_one(
    s: Stream, cfg: PlanConfig, lookup: tuple[np.ndarray, pa.Table] | None, where: str
) -> tuple[Any, Carried | None]:
    """One epoch's stream planned in its given order."""
    srt, perm = given_input(s.ids, s.lens, cfg.order == "shuffle")
    try:
        with given_orders({0: perm} if cfg.order == "shuffle" else {}):
            arrays = plan_arrays(s.ids[srt], s.lens[srt], cfg)
    except ConfigError as exc:
        raise ConfigError(
            f"the {len(srt):,} samples left of epoch {s.epoch} cannot be planned so: {exc}"
        ) from None
    carried = None if lookup is None else join(arrays.ids, lookup[0], lookup[1], where)
    return arrays, carried
