"""``varpack plan`` under MPI: P ranks, each holding about 1/P of the samples, write the plan one
process writes, byte for byte.

``mpiexec -n P python -m mpi4py -m varpack plan SORTED OUT ...`` runs :func:`plan_ranks` on every
rank:

1. **read** (:mod:`.read`): rank ``k`` reads rows ``N*k/P .. N*(k+1)/P`` of the sort output;
2. **select** (:mod:`.select`): its rows checked and selected, the decisions that need the whole
   input taken from gathered summaries; ``--oversize split``: each rank's long documents cut and
   the pieces sent to the rank whose share they sort into (:mod:`.split`); ``--where``: the
   condition run over every rank's share of the metadata (:mod:`.where`);
3. **order and pack** (:mod:`.curriculum`): the packing relayed from rank to rank, the count
   completed by the last rank, whole steps moved to the rank holding their first micro-batch
   (:mod:`.moves`); shuffled (:mod:`.shuffle`): each epoch's permuted run drawn by the bucket
   owners (:mod:`.permute`), windows whole on one rank, packed or composed by cost
   (:mod:`.compose`) with the carry between windows relayed; ``--cp``: GDS steps (:mod:`.cp`);
4. **stages 3-6** (:mod:`.local`, :mod:`.shapes`, :mod:`.warmup`): shapes (lengths chosen over
   every rank's histogram), ranks, the warm-up reorder and LR
   factors of its own steps; ``--carry`` values joined by id over every rank's share of the
   carry source (:mod:`.carry`);
5. **write** (:mod:`.write`): every rank file written by one rank from the parts all ranks send;
   rank 0 scores the plan from compact columns (:mod:`.figures`), writes plan.json and publishes
   the directory.

Every local step runs inside an agreement (:func:`varpack.sort.agree.agree`): a failure on any
rank is one line (the one process's) and one exit code on all, and the temporary output is
removed. Options whose stage needs the whole input are refused first (:mod:`.support`).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from varpack.atomic import (
    check_output,
    drop_temp,
    make_parents,
    new_temp,
    publish,
    remove_parents,
    temp_sibling,
)
from varpack.errors import Interrupted
from varpack.make.mpi.carry import join_share, read_share
from varpack.make.mpi.cp import cp_block, gds_steps
from varpack.make.mpi.curriculum import curriculum_epoch
from varpack.make.mpi.figures import input_figures, input_share, shared_figures, whole_plan
from varpack.make.mpi.local import RankPlan, local_plan
from varpack.make.mpi.moved import moved_figures
from varpack.make.mpi.moves import Rows
from varpack.make.mpi.read import num_rows, read_run, weighted_share
from varpack.make.mpi.select import select_share
from varpack.make.mpi.shapes import lengths_after, lengths_before
from varpack.make.mpi.shuffle import shuffle_epochs
from varpack.make.mpi.support import check_supported
from varpack.make.mpi.warmup import global_totals, reorder_ranks
from varpack.make.mpi.where import where_share
from varpack.make.mpi.write import write_rank_files
from varpack.plan import PlanArrays, PlanConfig
from varpack.plan.figures.plan_json import plan_meta
from varpack.planfile.format import write_plan_json
from varpack.sort.agree import Agreed, abort_quietly, agree, unlink_shared_memory


def plan_ranks(
    comm: Any,
    input: str | os.PathLike[str],
    out: str | os.PathLike[str],
    cfg: PlanConfig,
    overwrite: bool = False,
    carry: Sequence[str] = (),
    carry_from: str | os.PathLike[str] | None = None,
    where: str | None = None,
) -> tuple[PlanArrays, dict[str, Any]] | None:
    """Plan ``input`` (a sort output) into ``out`` on every rank of ``comm`` (``where``: a
    SQL condition over ``carry_from``, :mod:`.where`); rank 0 gets
    ``(arrays, meta)`` as :func:`varpack.make.plan` returns them (its arrays hold the
    per-step columns and the figures, not the sample ids), the other ranks ``None``."""
    state: dict[str, Any] = {"tmp": None, "made": []}
    comm.Barrier()  # every local rank has attached MPI's shared memory by now
    unlink_shared_memory()  # a rank that aborts can no longer leave it in /dev/shm
    try:
        return _run(comm, state, input, out, cfg, overwrite, carry, carry_from, where)
    except Agreed:
        _clean(comm, state)
        raise
    except Interrupted as exc:
        _clean(comm, state, any_rank=True)
        if comm.Get_rank() != 0:
            time.sleep(0.5)  # rank 0, if the launcher signalled it too, speaks for all
        print(f"varpack: error: {exc} (rank {comm.Get_rank()}); the partial output was removed",
              file=sys.stderr, flush=True)  # fmt: skip
        abort_quietly(comm, exc.exit_code)
        raise


def _micro_tokens(cfg: PlanConfig) -> float:
    """About the tokens of a micro-batch (what a row's length is weighed against)."""
    if cfg.batching == "fixed":
        return float("inf")  # a micro-batch per batch_size rows, whatever their length
    return float(cfg.max_tokens or 1)


def _drop_streams(p: RankPlan) -> None:
    """Free a rank's per-sample stream columns once its rank files are written."""
    empty = np.zeros(0, np.int64)
    p.stream = p.offsets = p.ids = empty
    p.lens = empty
    p.stream_lens = p.sample_offsets = p.group = p.pos2 = p.cp_placement = None


def _clean(comm: Any, state: dict[str, Any], any_rank: bool = False) -> None:
    if (comm.Get_rank() == 0 or any_rank) and state["tmp"] is not None:
        drop_temp(state["tmp"])
        remove_parents(state["made"])
    state["tmp"] = None


def _run(
    comm: Any,
    state: dict[str, Any],
    input: str | os.PathLike[str],
    out: str | os.PathLike[str],
    cfg: PlanConfig,
    overwrite: bool,
    carry: Sequence[str],
    carry_from: str | os.PathLike[str] | None,
    where: str | None,
) -> tuple[PlanArrays, dict[str, Any]] | None:
    from varpack.errors import ConfigError
    from varpack.make import carry_source, input_paths, where_source
    from varpack.make.carry import check_names

    rank = comm.Get_rank()
    cfg = cfg.resolved()

    def prepare() -> tuple[str, str | None, str | None]:
        check_supported(cfg, input, mix=False)
        names = check_names(carry)
        source = carry_source(input, names, None if carry_from is None else str(carry_from))
        if carry_from is not None and not names and where is None:
            raise ConfigError("--carry-from needs --carry COL or --where (what to read from it)")
        wsource = None if where is None else where_source(input, carry_from)
        if rank != 0:
            return "", source, wsource
        inputs = input_paths(input) + (input_paths(carry_from) if carry_from else [])
        check_output(out, overwrite, inputs)
        token = uuid.uuid4().hex[:12]
        state["made"] = make_parents(Path(out))
        state["tmp"] = new_temp(out, token, directory=True)
        return token, source, wsource

    token, source, wsource = agree(comm, prepare)
    token = comm.bcast(token, root=0)
    tmp = state["tmp"] = temp_sibling(out, token) if rank else state["tmp"]
    names = tuple(carry)
    carried_from = None if source is None else read_share(comm, source, names)
    total = agree(comm, lambda: num_rows(input))
    a, b = weighted_share(comm, input, total, _micro_tokens(cfg))
    ids, lens = agree(comm, lambda: read_run(input, a, b, verify=True))
    kept_by = None  # what --where kept (plan.json's selection)
    if where is not None and wsource is not None:
        ids, lens, kept_by = where_share(comm, ids, lens, where, wsource)
    info = input_share(comm, ids, lens, str(input))
    given = cfg
    rows, cfg, dropped, notes = select_share(comm, ids, lens, cfg)
    del ids, lens

    def again() -> Rows:  # the selected rows once more (a shuffle that must draw again)
        ids, lens = agree(comm, lambda: read_run(input, a, b, verify=False))
        if where is not None and wsource is not None:
            ids, lens, _ = where_share(comm, ids, lens, where, wsource)
        return select_share(comm, ids, lens, given)[0]

    before = lengths_before(comm, rows["lens"], cfg)
    alone, composed, tallies, inputs, selected = None, False, None, None, 0
    held: dict[str, Any] = {"rows": rows, "again": again}
    if cfg.order == "shuffle":  # every epoch draws from the selected rows in input order
        alone = [int(i) for i in rows["ids"][rows["alone"]]]
        total = int(info["total_tokens"])
        inputs = input_figures(comm, rows["lens"], rows.get("group"), cfg, total, dropped)
        selected = comm.allreduce(int(rows["lens"].sum()))
        del rows
        parts, composed, tallies = shuffle_epochs(comm, held, cfg, before)
    else:
        del rows
        parts = [curriculum_epoch(comm, held, cfg, before)]
    if cfg.cp > 1 and cfg.cp_batching == "gds":  # each step re-formed across the DP ranks
        parts = [gds_steps(part, cfg) for part in parts]
    grouped = composed or (cfg.cp > 1 and cfg.cp_batching == "gds")  # per-rank groups of steps
    lengths = lengths_after(comm, parts, cfg, before)
    local = agree(comm, partial(local_plan, parts, cfg, notes, lengths, grouped, alone))
    del parts
    if cfg.warmup == "reorder":
        reorder_ranks(comm, local)
    global_totals(comm, local)
    moved = moved_figures(comm, local, tallies, selected)
    carried = None
    if carried_from is not None:
        assert source is not None
        carried = join_share(comm, carried_from, local.ids)
    entry = None if carried is None or source is None else carried.entry(source)
    entries = write_rank_files(comm, local, carried, tmp)
    del carried_from, carried
    if inputs is None:  # curriculum: the rank's rows are in input order
        inputs = input_figures(
            comm, local.lens, local.group, cfg, int(info["total_tokens"]), dropped
        )
    shared = shared_figures(comm, local, inputs)
    block = cp_block(comm, local)
    if block is not None:
        shared["cp"] = block
    _drop_streams(local)  # rank 0 gathers the micro-batches' figures only
    whole = whole_plan(comm, local, dropped)
    del local
    if whole is not None:
        whole.moved = moved

    def finish() -> dict[str, Any] | None:
        if whole is None:
            return None
        meta, extra = plan_meta(whole, info, moved=False, shared=shared)
        if entry is not None:
            meta["carry"] = entry
        if kept_by is not None:
            meta["selection"] = kept_by.entry()
        assert entries is not None
        write_plan_json(tmp, meta, entries, extra)
        publish(tmp, out, overwrite)
        state["tmp"] = None
        return meta

    meta = agree(comm, finish)
    state["tmp"] = None
    if whole is None or meta is None:
        return None
    return whole, meta
