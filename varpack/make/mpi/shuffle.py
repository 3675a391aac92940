"""Order and pack under MPI, shuffle order: every epoch's micro-batches, whole steps per rank.

Per epoch the ranks hold runs of the permuted stream (:mod:`.permute`); then, as one process:

* ``--compose tokens`` (the ``greedy`` batcher): windows of ``--shuffle-window`` steps' worth of
  the stream are sorted and dealt to their steps (:func:`~varpack.plan.kernels.order.regroup`),
  and each step's segment is packed into exactly one step of micro-batches, the overflow carried
  into the next (:func:`~varpack.plan.kernels.pack.pack_steps`); the last rank completes the
  count (:mod:`.curriculum`);
* ``--compose cost`` (the ``costed`` batcher) and ``--compose engine`` (the balance engine):
  each window is composed by the one-process planner's rule (:func:`~varpack.plan.stages.
  batching.costed.composing`, :func:`~varpack.plan.stages.batching.engine.engine_rule`), what
  fits nowhere carried into the next window. Where the epoch's last window cannot be composed,
  the plan is composed by tokens.

Windows never cross ranks: each moves whole to the rank holding its first position. The carry
between windows (a few samples) is relayed from rank to rank (:func:`~.moves.relayed`), so every
cut is the one process's. The step size comes from packing the sorted input (a relayed count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.compose import compose_share
from varpack.make.mpi.curriculum import complete_tail, whole_units
from varpack.make.mpi.moved import Tally, moved_tally
from varpack.make.mpi.moves import Rows, count, join_into, move_rows, relay_pack, relayed
from varpack.make.mpi.permute import permuted_share
from varpack.plan import PlanConfig
from varpack.plan.kernels.cuts import next_cuts
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.order import OrderRule, regroup
from varpack.plan.kernels.pack import pack, pack_steps
from varpack.plan.kernels.slots import move_micro
from varpack.plan.stages.batching import composes_by_cost
from varpack.plan.stages.batching.common import effective_lengths, order_rule
from varpack.plan.stages.batching.costed import Composing, composing, slot_cut
from varpack.plan.stages.batching.engine import EngineRule, engine_rule
from varpack.plan.sync import slotted

Epoch = tuple[Rows, np.ndarray, int, int]  # (rows, off, first micro-batch, epoch's count)


def shuffle_epochs(
    comm: Any, held: dict[str, Rows], cfg: PlanConfig, lengths: np.ndarray | None
) -> tuple[list[Epoch], bool, list[Tally] | None]:
    """``(epochs, grouped, tallies)``: each epoch's micro-batches on this rank (whole steps),
    whether they come in per-rank groups of ``grad_accum`` (composed by cost), and the moved
    figures' tally of each epoch where composing kept them (rank 0's; an empty list on the
    other ranks; None where nothing was composed by cost; see :mod:`.moved`).
    ``held["rows"]``: this rank's selected rows in input order, taken out of ``held`` once the
    last epoch has drawn from them; ``held["again"]()`` selects them again."""
    if composes_by_cost(cfg) and cfg.layout == "packed":
        got = _costed(comm, held, cfg)
        if got is not None:  # per-rank groups, except slots cut by cost (--sync micro)
            return got[0], not slotted(cfg.sync, cfg.grad_accum), got[1]
        if "rows" not in held:  # the last epoch let them go
            held["rows"] = held.pop("again")()  # type: ignore[operator]
    return _greedy(comm, held, cfg, lengths), False, None


def _draw(comm: Any, held: dict[str, Rows], cfg: PlanConfig, epoch: int) -> Rows:
    """This rank's run of epoch ``epoch``'s permuted stream, with ``pos2``; the selected rows
    let go after the last epoch (a fallback to tokens selects them again: ``held["again"]``)."""
    rows = permuted_share(comm, held, cfg.seed, epoch, keep=epoch < cfg.epochs - 1)
    return _with_pos2(comm, rows)


def _view(rows: Rows, cfg: PlanConfig, lengths: np.ndarray | None) -> np.ndarray:
    """The lengths packing sees: padded lengths in the padded layout with chosen lengths."""
    if lengths is None or cfg.layout == "packed":
        return rows["lens"]
    return effective_lengths(rows["lens"], cfg, lengths)


def _sorted_micro(comm: Any, base: Rows, cfg: PlanConfig, view: np.ndarray) -> float | None:
    """Real tokens per micro-batch of the sorted input packed greedily (sizes shuffled steps)."""
    if cfg.batching != "budget":
        return None
    rule = cfg.pack_rule()

    def pack_rows(r: Rows) -> np.ndarray:  # as one process: split pieces not kept apart
        return pack(r["view"], np.array([0, count(r)]), r["alone"], rule)[1].copy()

    def cuts(r: Rows) -> np.ndarray:
        return next_cuts(r["view"], r["alone"], rule)

    _, off = relay_pack(comm, {"view": view, "alone": base["alone"]}, pack_rows, cuts)
    micro = comm.allreduce(len(off) - 1)
    return float(comm.allreduce(int(view.sum()))) / micro


def _prefix(comm: Any, weight: np.ndarray) -> tuple[int, int]:
    """``(before, total)``: the weight on the ranks before this one, and on all ranks."""
    every = comm.allgather(int(weight.sum()))
    return sum(every[: comm.Get_rank()]), sum(every)


def _whole_windows(comm: Any, rows: Rows) -> tuple[Rows, np.ndarray]:
    """Rows moved so that each window (a run of equal labels ``rows["_window"]``, nondecreasing
    over the ranks) lies whole on the rank holding its first row; the rows and their labels."""
    window = rows["_window"]
    n, rank = count(rows), comm.Get_rank()
    ends = comm.allgather((n, int(window[0]) if n else -1, int(window[-1]) if n else -1))
    dest = np.full(n, rank, dtype=np.int64)
    if n:
        head = int(window[0])
        owner = min(r for r, (c, _, last) in enumerate(ends) if c and last >= head)
        dest[window == head] = owner
    del window  # the rows' column is replaced in place
    moved = move_rows(comm, rows, dest)
    return moved, moved.pop("_window")


def _with_pos2(comm: Any, rows: Rows) -> Rows:
    """Twice each sample's middle token position in the epoch's permuted stream (``pos2``)."""
    lens = rows["lens"].astype(np.int64)
    before, _ = _prefix(comm, lens)
    rows["pos2"] = 2 * (before + np.cumsum(lens)) - lens
    return rows


def _greedy(
    comm: Any, held: dict[str, Rows], cfg: PlanConfig, lengths: np.ndarray | None
) -> list[Epoch]:
    """Every epoch by the ``greedy`` batcher (see the module doc)."""
    base = held["rows"]
    orule = order_rule(cfg, _sorted_micro(comm, base, cfg, _view(base, cfg, lengths)))
    del base
    epochs = []
    for epoch in range(cfg.epochs):
        rows = _draw(comm, held, cfg, epoch)
        weight = np.ones(count(rows), np.int64) if orule.by_samples else rows["lens"]
        before, _ = _prefix(comm, weight)
        rows["_window"] = (before + np.cumsum(weight) - weight) // (orule.window * orule.step)
        rows, window = _whole_windows(comm, rows)
        del window, weight
        rows, off = _pack_epoch(comm, rows, cfg, orule, lengths)
        rows, off = complete_tail(comm, rows, off, cfg, f"epoch {epoch}")
        rows, off = whole_units(comm, rows, off, cfg.micro_per_step)
        epochs.append(_numbered(comm, rows, off))
    return epochs


def _pack_epoch(
    comm: Any, rows: Rows, cfg: PlanConfig, orule: OrderRule, lengths: np.ndarray | None
) -> tuple[Rows, np.ndarray]:
    """This rank's windows regrouped into steps and packed, the overflow relayed."""
    weight = np.ones(count(rows), np.int64) if orule.by_samples else rows["lens"]
    cum0, _ = _prefix(comm, weight)
    idx, bounds = regroup(np.arange(count(rows)), rows["lens"], orule, cum0)
    rows = take_index(rows, idx)
    final = _holds_end(comm, count(rows))
    rule, cap = cfg.pack_rule(), cfg.micro_per_step

    def work(before: Rows | None) -> tuple[tuple[Rows, np.ndarray], Rows]:
        carried = 0 if before is None else count(before)
        mine = rows if before is None else join_into([before, rows], rows)
        perm, off, carry = pack_steps(_view(mine, cfg, lengths), bounds + carried, mine["alone"],
                                      rule, cap, mine.get("group"), carried, final)  # fmt: skip
        return (take_index(mine, perm), off.copy()), take_index(mine, carry)

    return relayed(comm, work, None)


def _holds_end(comm: Any, n: int) -> bool:
    """Does this rank hold the stream's last position (the last rank with any)?"""
    holding = [r for r, c in enumerate(comm.allgather(n)) if c]
    return bool(holding) and holding[-1] == comm.Get_rank()


def take_index(rows: Rows, idx: np.ndarray) -> Rows:
    """Rows ``idx`` of every column."""
    return {k: v[idx] for k, v in rows.items()}


def _numbered(comm: Any, rows: Rows, off: np.ndarray) -> Epoch:
    """An epoch's micro-batches with the global number of this rank's first, and the count."""
    counts = comm.allgather(len(off) - 1)
    return rows, off, sum(counts[: comm.Get_rank()]), sum(counts)


def _costed(
    comm: Any, held: dict[str, Rows], cfg: PlanConfig
) -> tuple[list[Epoch], list[Tally] | None] | None:
    """Every epoch by the ``costed`` batcher; None where an epoch's last window could not be
    composed (the plan is composed by tokens then, as one process does)."""
    base = held["rows"]
    orule = order_rule(cfg, _sorted_micro(comm, base, cfg, base["lens"]))
    how: Composing | EngineRule  # the one-process planner's rule
    if cfg.compose == "engine":
        how = engine_rule(cfg, orule, comm.allreduce(int(base["lens"].max(initial=0)), op=_max()))
    else:
        how = composing(cfg, orule, blend=False)
    del base
    epochs, tallies = [], []
    for epoch in range(cfg.epochs):
        rows = _draw(comm, held, cfg, epoch)
        rows["_window"] = _cost_windows(comm, rows["lens"], how.window_tokens, how.tail_tokens,
                                        how.per_step)  # fmt: skip
        rows, window = _whole_windows(comm, rows)
        starts = _starts(window)
        del window
        got = compose_share(comm, rows, starts, how)
        if not comm.allreduce(got is not None, op=_land(comm)):
            return None
        assert got is not None
        rows, off = got
        if how.cut:  # slots (steps at grad-accum 1) cut by cost, as the one process does
            rows, off = _cut_slots(comm, rows, off, cfg, epoch, how)
        del rows["_wide"]
        epochs.append(_numbered(comm, rows, off))
        tallies.append(moved_tally(comm, epochs[-1], cfg.micro_per_step))
    return epochs, [t for t in tallies if t is not None]  # rank 0's; empty elsewhere


def _starts(window: np.ndarray) -> list[int]:
    """Where each run of equal labels starts, and the end (``[0]``: none)."""
    if len(window) == 0:
        return [0]
    return [0, *(np.flatnonzero(window[1:] != window[:-1]) + 1).tolist(), len(window)]


def _land(comm: Any) -> Any:
    from mpi4py import MPI

    return MPI.LAND


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _cut_slots(
    comm: Any,
    rows: Rows,
    off: np.ndarray,
    cfg: PlanConfig,
    epoch: int,
    how: Composing | EngineRule,
) -> tuple[Rows, np.ndarray]:
    """Slots cut by cost, as :func:`~varpack.plan.stages.batching.costed.build` cuts them, under
    MPI: the count completed on the last rank, then every rank holds whole blocks of
    ``--shuffle-window`` steps (a block goes to the rank holding its first micro-batch) and cuts
    its blocks into slots."""
    rows, off = complete_tail(comm, rows, off, cfg, f"epoch {epoch}")
    rows, off = whole_units(comm, rows, off, cfg.shuffle_window * cfg.micro_per_step)
    if isinstance(how, EngineRule):
        order = how.slot_cut(rows["lens"], off)
    else:
        cost = summarize(off, rows["lens"], cfg.micro_rule()).cost
        order = slot_cut(cost, rows["_wide"][off[:-1]], cfg, epoch)
    (idx,), off = move_micro((np.arange(count(rows), dtype=np.int64),), off, order)
    return take_index(rows, idx), off


def _cost_windows(
    comm: Any, lens: np.ndarray, window_tok: int, step_tok: int, per_step: int
) -> np.ndarray:
    """Each position's window, as the composing kernel cuts them: by tokens before it, and the
    first window after which a short tail is left (fewer tokens than a step, or positions than
    two steps' micro-batches) takes that tail."""
    n = len(lens)
    before, total = _prefix(comm, lens)
    at, size = _prefix(comm, np.ones(n, np.int64))
    tok = np.cumsum(lens, dtype=np.int64)
    tok -= lens
    tok += before  # tokens before each position
    window = tok // max(window_tok, 1)
    lasts = comm.allgather(int(window[-1]) if n else None)
    prev = next((w for w in reversed(lasts[: comm.Get_rank()]) if w is not None), None)
    cut = np.zeros(n, dtype=bool)
    if n:
        cut[1:] = window[1:] != window[:-1]
        cut[0] = prev is None or int(window[0]) != prev
    starts = np.flatnonzero(cut)
    del cut
    gpos, starts_tok = at + starts, tok[starts]
    del tok
    short = (total - starts_tok < max(step_tok, 1)) | (size - gpos < 2 * per_step)
    short &= gpos > 0
    first = int(gpos[short][0]) if short.any() else size
    where = min(comm.allgather(first))
    if where < size:
        label = [w for w in comm.allgather(_label_before(window, at, where)) if w is not None][0]
        window[max(where - at, 0) :] = label
    return window


def _label_before(window: np.ndarray, at: int, where: int) -> int | None:
    """The window label of global position ``where - 1`` if this rank holds it."""
    if at <= where - 1 < at + len(window):
        return int(window[where - 1 - at])
    return None
