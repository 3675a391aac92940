"""``varpack validate`` on several MPI ranks: each reads its share of the plan, one verdict.

MPI rank ``k`` of ``P`` takes the plan's rank files ``dp*k//P .. dp*(k+1)//P - 1`` (contiguous,
so the shares in MPI rank order are the plan in order) and runs, on those alone, everything that
looks at one rank file: checksums and row counts, schema, numbering, micro-batches
(:func:`varpack.validate.read_one`). The checks over the whole plan are combined:

- each step's global samples and tokens: per-step sums reduced with ``Allreduce``; each rank then
  checks its rows' ``step_tokens``, ``step_samples`` and ``lr_factor`` against them;
- coverage (every sample once per epoch or dropped, against the fingerprint and ``--metadata``):
  each planned sample ``(id, length, step, position)`` and each metadata row goes to the rank
  owning its id (a hash of it; one ``Alltoallv`` per column, the metadata from rank 0, which
  reads it), each rank takes the dropped samples it owns from plan.json; every rank scans its
  ids (:func:`.coverage.scan`) and rank 0 merges the findings (:func:`.coverage.merge_found`);
- the rest (shape lengths, shapes, plan.json's stats, context parallelism, carried values; with
  ``--oversize split``, ``--mix`` or a replanned plan, coverage too) runs on rank 0 with the
  planner's own functions, over the compact columns every rank sends it: per micro-batch its
  step and figures, per sample its length (ids, offsets, carried values only where a check
  needs them), never the manifests themselves.

Rank 0 words the report from the parts, in the order one process gives it, so its lines are the
same. Every rank's local work runs under :func:`varpack.sort.agree.agree`: an error on any rank
(an unreadable ``--metadata``, a directory that is not a plan) stops every rank, and the first
failing rank's error is the one reported, as one process reports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.plan.config import PlanConfig
from varpack.plan.kernels.micro import Micro
from varpack.planfile.format import Plan, carried_columns
from varpack.planfile.opened import share
from varpack.planfile.rankrows import RankRows
from varpack.planfile.recompute import Steps, combine, step_lr, step_sums
from varpack.planfile.report import Report
from varpack.sort.agree import agree, unlink_shared_memory
from varpack.sort.exchange import alltoallv
from varpack.validate import (
    Inputs,
    alone_ids,
    check_recorded,
    check_whole,
    open_checked,
    read_one,
)
from varpack.validate.coverage import Found, dropped_of, merge_found, scan
from varpack.validate.figures import check_step_columns

#: what a metadata row carries to the rank owning its id
_ROW = np.dtype([("id", "<i8"), ("len", "<i8")])
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

Read = list[tuple[list[str], tuple[RankRows, Micro] | None]]


def owner(ids: np.ndarray, size: int) -> np.ndarray:
    """The rank owning each id: a multiplicative hash, so that strided ids spread too."""
    with np.errstate(over="ignore"):
        h = np.asarray(ids).astype(np.uint64) * _GOLDEN
    return ((h >> np.uint64(32)) % np.uint64(size)).astype(np.int64)


def validate_ranks(
    comm: Any, path: str | os.PathLike[str], read_inputs: Callable[[], Inputs]
) -> Report | None:
    """Validate the plan at ``path`` on every rank of ``comm``; the report on rank 0 (``None``
    elsewhere). ``read_inputs`` runs on rank 0 first (reading ``--metadata``). Raises
    :class:`~varpack.sort.agree.Agreed` on every rank when any rank failed."""
    root = comm.Get_rank() == 0
    comm.Barrier()  # every local rank has attached MPI's shared memory by now
    unlink_shared_memory()
    inputs = agree(comm, lambda: read_inputs() if root else Inputs())
    report = Report()
    head = agree(comm, lambda: open_checked(path, False, report) if root else None)
    opened = comm.bcast(None if head is None else (head[0].meta, head[1], head[2]))
    if opened is None:
        return report if root else None
    meta, cfg, lengths = opened
    plan = Plan(Path(path), meta)
    light = comm.bcast(replace(inputs, metadata=None) if root else None)
    ref = None
    if _plain(meta, cfg) and comm.bcast(inputs.metadata is not None):  # the metadata, to its owners
        ref = _route(comm, inputs.metadata)
        inputs = replace(inputs, metadata=None)
    mine = share(cfg.dp, comm.Get_size(), comm.Get_rank())
    read = _read(comm, plan, cfg, lengths, mine, report)
    if read is not None:
        found, rows = _combine(comm, plan, cfg, read, mine, ref, light, report)
        del read
        agree(
            comm, lambda: _finish(plan, cfg, lengths, rows, inputs, report, found) if root else None
        )
    return report if root else None


def _combine(
    comm: Any,
    plan: Plan,
    cfg: PlanConfig,
    read: list[tuple[RankRows, Micro]],
    mine: range,
    ref: tuple[np.ndarray, np.ndarray] | None,
    inputs: Inputs,
    report: Report,
) -> tuple[Found | None, list[tuple[RankRows, Micro]]]:
    """The checks over the whole plan that every rank takes part in: the step columns, and
    coverage where the ids' owners scan it; then every rank's compact rows, sent to rank 0.
    ``read`` is slimmed in place (the manifest tables dropped as soon as they are checked)."""
    meta = plan.meta
    steps = _steps(comm, read, plan.num_steps, cfg)
    lines = Report()
    check_step_columns([rk for rk, _ in read], steps, lines, first=mine.start)
    _to_root(comm, [lines.problems], report)
    plain = _plain(meta, cfg)
    ids, carry = _keep(meta, cfg, inputs, plain)
    read[:] = [(_slim(rk, carry, cfg.cp > 1), micro) for rk, micro in read]  # tables dropped
    pa.default_memory_pool().release_unused()  # their buffers, back to the system
    found = _coverage(comm, meta, read, ref, cfg.warmup == "reorder") if plain else None
    if not ids:
        read[:] = [(replace(rk, ids=np.zeros(0, rk.ids.dtype)), micro) for rk, micro in read]
    return found, _gather_rows(comm, read, cfg.dp)


def _plain(meta: dict[str, Any], cfg: PlanConfig) -> bool:
    """Coverage counts the planned samples themselves (not pieces, a blend or a lineage): the
    ranks owning the ids scan it."""
    return cfg.oversize != "split" and "parent" not in meta and "mix" not in meta


def _read(
    comm: Any,
    plan: Plan,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    mine: range,
    report: Report,
) -> list[tuple[RankRows, Micro]] | None:
    """This rank's share checked and read (``None`` on every rank when some rank file cannot
    be used); rank 0 adds every violation, in plan order, to ``report``."""
    files = agree(comm, lambda: [plan.verify_rank(r) for r in mine])
    bad = {r for r, problems in zip(mine, files, strict=True) if problems}
    _to_root(comm, files, report)
    files_ok = comm.allreduce(len(bad)) == 0
    if comm.Get_rank() == 0:
        check_recorded(plan.meta, files_ok, False, report)
    alone = alone_ids(plan.meta)

    def read_mine() -> Read:
        out: Read = []
        for r in mine:
            lines = Report()
            got = read_one(plan, r, cfg, lengths, alone, r in bad, lines)
            out.append((lines.problems, got))
            if got is None:  # one process stops at this rank: the later ones are not shown
                break
        return out

    got = agree(comm, read_mine)
    parts = comm.gather([(lines, rows is not None) for lines, rows in got], root=0)
    for lines, fine in (p for part in parts or [] for p in part):
        report.problems.extend(lines)
        if not fine:
            break
    read = [rows for _, rows in got if rows is not None]
    return read if all(comm.allgather(len(read) == len(mine))) else None


def _to_root(comm: Any, groups: list[list[str]], report: Report) -> None:
    """Every rank's violation lines, in rank order, added to rank 0's ``report``."""
    parts = comm.gather(groups, root=0)
    if parts is not None:
        for group in (g for part in parts for g in part):
            report.problems.extend(group)


def _steps(comm: Any, read: list[tuple[RankRows, Micro]], num_steps: int, cfg: PlanConfig) -> Steps:
    """Each step's global samples and tokens (``Allreduce``) and its LR factor."""
    from mpi4py import MPI

    sums = np.zeros((2, num_steps), np.int64)
    for rk, micro in read:
        sums[0] += step_sums(rk.step, micro.samples, num_steps)
        sums[1] += step_sums(rk.step, micro.tokens, num_steps)
    total = np.empty_like(sums)
    comm.Allreduce(sums, total, op=MPI.SUM)
    return Steps(total[0], total[1], step_lr(total[0], total[1], cfg))


def _route(
    comm: Any, metadata: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rank 0's metadata rows sent to the ranks owning their ids (in their order)."""
    rows = np.zeros(0, _ROW)
    counts = np.zeros(comm.Get_size(), np.int64)
    if metadata is not None:
        ids, lens = metadata
        dest = owner(ids, comm.Get_size())
        order = np.argsort(dest, kind="stable")
        rows = np.empty(len(ids), _ROW)
        rows["id"], rows["len"] = ids[order], lens[order]
        counts = np.bincount(dest, minlength=comm.Get_size())
    got = alltoallv(comm, rows, counts)
    return np.ascontiguousarray(got["id"]), np.ascontiguousarray(got["len"])


def _coverage(
    comm: Any,
    meta: dict[str, Any],
    read: list[tuple[RankRows, Micro]],
    ref: tuple[np.ndarray, np.ndarray] | None,
    whole: bool,
) -> Found | None:
    """Coverage scanned by the ranks owning the ids; the merged findings on rank 0."""
    size = comm.Get_size()
    ids = _cat([rk.ids for rk, _ in read], np.int64)
    start = comm.exscan(len(ids)) or 0
    dest = owner(ids, size)
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=size)
    del dest
    cols = [alltoallv(comm, ids[order], counts)]
    del ids
    for part in (
        lambda: _cat([rk.lens for rk, _ in read], np.int64),
        lambda: _cat([np.repeat(rk.step, np.diff(rk.offsets)) for rk, _ in read], np.int64),
    ):
        cols.append(alltoallv(comm, part()[order], counts))
    cols.append(alltoallv(comm, start + order, counts))  # positions in the plan
    del order
    d_ids, d_lens, d_keys = dropped_of(meta)
    here = owner(d_ids, size) == comm.Get_rank()
    dropped = (d_ids[here], d_lens[here], d_keys[here])
    found = scan(meta, cols[0], cols[1], cols[2], cols[3], dropped, ref, whole)
    del cols
    parts = comm.gather(found, root=0)
    return None if parts is None else merge_found(parts)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """The parts end to end, as ``dtype``."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _keep(meta: dict[str, Any], cfg: PlanConfig, inputs: Inputs, plain: bool) -> tuple[bool, bool]:
    """Whether rank 0's checks need the samples' ids, and their carried values."""
    carry = "mix" in meta or (inputs.carry_source is not None and bool(carried_columns(meta)))
    epochs = len(meta.get("epochs") or [0])
    reordered_lengths = (
        cfg.max_shapes is not None
        and cfg.layout == "padded"
        and cfg.warmup == "reorder"
        and epochs > 1
    )
    ids = not plain or carry or cfg.cp > 1 or cfg.order == "shuffle" or reordered_lengths
    return ids, carry


def _slim(rk: RankRows, carry: bool, cp: bool) -> RankRows:
    """What the later checks read of a rank's rows: no manifest table (with ``--cp`` its
    placement column alone), carried values only if ``carry``."""
    columns = ["sample_ids", "cp_placement"] if cp else []
    return replace(
        rk,
        table=rk.table.select(columns) if cp else pa.table({}),
        block_index=None,
        carry=rk.carry if carry else {},
    )


def _gather_rows(
    comm: Any, slim: list[tuple[RankRows, Micro]], dp: int
) -> list[tuple[RankRows, Micro]]:
    """Every plan rank's compact rows on rank 0, in plan order (one message per plan rank);
    elsewhere nothing."""
    size = comm.Get_size()
    if comm.Get_rank() != 0:
        for item in slim:
            comm.send(item, dest=0, tag=0)
        return []
    rows = list(slim)
    for k in range(1, size):
        rows.extend(comm.recv(source=k, tag=0) for _ in share(dp, size, k))
    return rows


def _finish(
    plan: Plan,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    rows: list[tuple[RankRows, Micro]],
    inputs: Inputs,
    report: Report,
    found: Found | None,
) -> None:
    """Rank 0: the checks over the whole plan, as one process runs them."""
    ranks = [rk for rk, _ in rows]
    whole = combine(ranks, [m for _, m in rows], plan.num_steps, cfg)
    check_whole(plan, cfg, lengths, ranks, whole, inputs, report, found)
