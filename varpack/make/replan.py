"""``varpack replan``: continue a plan from one of its steps on another number of ranks.

A run that is preempted at step ``S`` and resumes on another world size needs the steps it has
not trained, laid out for the new ranks. :func:`replan` reads the parent plan (every checksum),
keeps its micro-batches of steps ``>= S`` whole and deals each step's micro-batches again to the
new ranks (:func:`varpack.plan.reshard.reshard`): the global batch ``dp x grad_accum`` stays the
same, so every step keeps its samples, its tokens and its LR factor, and the resumed run draws the
loss curve the uninterrupted one would have. With the same ``dp`` and ``grad_accum`` the child's
rows are the parent's rows from ``S`` on.

The child is a plan of its own (format version 3): its manifests number the run's steps from
``S``, ``plan.json`` records its ``parent`` (path, plan fingerprint, ``from_step``), its figures
are recomputed on its own rows by the functions ``validate`` checks with
(:mod:`varpack.planfile.recompute`, so ``validate`` agrees with them), and ``validate`` checks it
against its parent: the parent's steps before ``S`` and the child's steps hold every sample
exactly once per epoch (a ``--mix`` blend: by the blend's rules).
Otherwise (another global batch, another option, ``--rebalance``) what is left is planned again
(:mod:`varpack.make.remaining`). What the path taken cannot carry over is refused in one
line by :func:`refusal` before any row is read (``--rebalance`` takes the second path, and
applies its refusals); what depends on the rows (a remaining sample that fits no micro-batch)
before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from varpack.errors import ConfigError, VarpackError
from varpack.make.remaining import data_config, epoch_streams, plan_streams
from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import cp_load, cp_model
from varpack.plan.kernels.micro import Micro, summarize
from varpack.plan.model_choice import model_options
from varpack.plan.reshard import reshard
from varpack.planfile.format import (
    MAX_DEPTH,
    Plan,
    carried_columns,
    load_plan,
    read_meta,
    write_plan,
)
from varpack.planfile.rankrows import RankRows, rank_rows
from varpack.planfile.recompute import (
    combine,
    read_placement,
    recompute_cp,
    recompute_stats,
    recompute_tokens,
)
from varpack.planfile.report import Report
from varpack.planfile.schema import FINGERPRINT_KEY, config_of, plan_fingerprint

T = TypeVar("T")

#: options that make a run what it is: a replan keeps them (the epochs' samples and order)
FIXED = ("order", "seed", "epochs", "oversize", "split_len", "split_positions", "cp")


def child_config(cfg: PlanConfig, options: Mapping[str, Any]) -> PlanConfig:
    """The child's config: the parent's with ``options`` (plan options) changed. ``--dp`` alone
    keeps the global batch ``dp x grad_accum`` where the new dp divides it (grad-accum follows),
    else keeps grad-accum. The options in :data:`FIXED` cannot change, and the compile warm-up
    prefix is not carried over (it belongs to the start of the plan it was ordered for).

    >>> cfg = PlanConfig(dp=2, grad_accum=3, max_tokens=64)
    >>> [(c.dp, c.grad_accum) for c in (child_config(cfg, {"dp": 3}), child_config(cfg, {"dp": 4}))]
    [(3, 2), (4, 3)]
    """
    for key in FIXED:
        if key in options and options[key] != getattr(cfg, key):
            raise ConfigError(
                f"--{key.replace('_', '-')} {options[key]}: a replan continues the run, so "
                f"--{key.replace('_', '-')} stays {getattr(cfg, key)}; plan the input again for "
                "another run"
            )
    if options.get("warmup") == "reorder":
        raise ConfigError(
            "--warmup reorder: a replanned plan holds no warm-up prefix; warm up at run time "
            "(varpack.torch.warmup.compile_warmup reads the new plan's shapes per rank)"
        )
    values = {**model_options(cfg.to_dict(), options), **options, "warmup": "none"}
    dp = options.get("dp", cfg.dp)
    total = cfg.dp * cfg.grad_accum
    if "grad_accum" not in options:
        values["grad_accum"] = total // dp if total % dp == 0 else cfg.grad_accum
    return PlanConfig.from_mapping(values, where="replan").resolved()


def refusal(meta: dict[str, Any], cfg: PlanConfig, child: PlanConfig, kept: bool) -> None:
    """One line for what the path taken (``kept``: every step keeps its micro-batches, else
    what is left is planned again, ``--rebalance`` included) cannot carry over."""
    if "mix" in meta and not kept:
        raise ConfigError(
            "replan: a --mix plan is replanned only keeping dp x grad-accum and its options, "
            "without --rebalance (each step keeps its samples, so every step keeps its share "
            "of the sources); planned again, the steps would not hold the blend"
        )
    if cfg.pp > 1 and child.grad_accum != cfg.grad_accum and kept:
        raise ConfigError(
            f"replan: a --pp plan keeps one shape per pipeline step of {cfg.grad_accum} "
            f"micro-batches; keep --grad-accum {cfg.grad_accum}"
        )
    if not kept and child.max_shapes is not None:
        raise ConfigError(
            "replan: --max-shapes chooses its lengths from the whole plan; a replan that plans "
            "what is left again does not choose them yet: keep dp x grad-accum and the options "
            "(each step keeps its micro-batches), or use --pack-to"
        )


def reordered_run(meta: dict[str, Any]) -> bool:
    """Whether the run's first plan moved micro-batches across its epochs' steps (``--warmup
    reorder``; a replanned plan never does), walking up the parents plan.json records. A parent
    that cannot be read counts as one that did (the epochs are then checked by their rows)."""
    for _ in range(MAX_DEPTH):
        if "parent" not in meta:
            return bool((meta.get("config") or {}).get("warmup") == "reorder")
        try:
            meta = read_meta(meta["parent"]["plan"])
        except (OSError, VarpackError):
            return True
    return True


def keeps_steps(cfg: PlanConfig, child: PlanConfig) -> bool:
    """Every step can keep its micro-batches: only dp and grad-accum change, and not their
    product (the resharding case; else what is left is planned again)."""
    same = dataclasses.replace(child, dp=cfg.dp, grad_accum=cfg.grad_accum, warmup=cfg.warmup)
    return same == cfg and cfg.dp * cfg.grad_accum == child.dp * child.grad_accum


def _rows_from(plan: Plan, step: int) -> tuple[pa.Table, np.ndarray]:
    """Every rank's rows of steps ``>= step``, concatenated, and each row's rank."""
    tables, ranks = [], []
    for r in range(plan.dp):
        t = plan.rank_table(r, verify=False)  # load_plan(verify=True) checked every file
        t = t.filter(pc.greater_equal(t.column("step"), step))
        tables.append(t)
        ranks.append(np.full(t.num_rows, r, dtype=np.int64))
    return pa.concat_tables(tables).combine_chunks(), np.concatenate(ranks)


def _micro(rows: RankRows, cfg: PlanConfig) -> Micro:
    """Each micro-batch's summary (cost, shape) as the manifest gives its shape."""
    pad_to = rows.table.column("pad_to").to_numpy().astype(np.int64)
    return summarize(
        rows.offsets, rows.lens, cfg.micro_rule(), pad_to=pad_to, pad_rows=rows.pad_rows
    )


def _check(got: T | None, what: str) -> T:
    if got is None:
        raise ConfigError(f"replan: the parent's {what} could not be read as manifest rows")
    return got


def replan(
    parent: str | os.PathLike[str],
    out: str | os.PathLike[str],
    from_step: int,
    options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    rebalance: bool = False,
) -> tuple[dict[str, Any], bool]:
    """Write the child plan ``out`` of ``parent`` from step ``from_step`` with the plan
    ``options`` changed (atomically); returns its plan.json content (without ranks) and whether
    every step kept its samples (resharded) or what is left was planned again (always with
    ``rebalance``: a step's micro-batches, composed for ``grad_accum`` per rank, may not level
    over fewer per rank). See the module doc."""
    # every rank file's sha256 and plan.json's checksum verified (its content is varpack's)
    plan = load_plan(parent, verify=True)
    meta = plan.meta
    cfg = config_of(meta, where=f"{parent}/plan.json config")
    first, end = plan.first_step, plan.first_step + plan.num_steps
    if not first <= from_step < end:
        raise ConfigError(
            f"--from-step {from_step}: {parent} holds steps {first} to {end - 1}; a run that "
            f"finished step {end - 1} has nothing left to replan"
        )
    child_cfg = child_config(cfg, options or {})
    kept = keeps_steps(cfg, child_cfg) and not rebalance
    refusal(meta, cfg, child_cfg, kept)
    table, old_rank = _rows_from(plan, from_step)
    epochs = clip_epochs(meta.get("epochs") or [], from_step)
    alone = (meta.get("stats") or {}).get("oversize_alone", [])
    if kept:
        tables = _reshard(table, old_rank, cfg, child_cfg, meta)
    else:
        streams = epoch_streams(table, old_rank, epochs, reordered_run(meta))
        child_cfg = data_config(streams, child_cfg)
        left = plan_streams(streams, child_cfg, from_step, table, str(parent))
        tables, epochs, alone = left.tables, left.epochs, left.alone
    del table
    child = _child_meta(plan, child_cfg, from_step, epochs)
    child["_alone"] = alone
    child["stats"], shapes = _figures(child, child_cfg, tables)
    write_plan(out, child, tables, overwrite, [{"shapes": s} for s in shapes], [Path(parent)])
    return child, kept


def _reshard(
    table: pa.Table, old_rank: np.ndarray, cfg: PlanConfig, child: PlanConfig, meta: dict[str, Any]
) -> list[pa.Table]:
    """The rows dealt again to the child's ranks, each step's micro-batches kept whole."""
    carry_only = {"carry": meta["carry"]} if "carry" in meta else {}
    rows = _check(rank_rows(table, 0, carry_only, Report()), "rows")
    cost = _micro(rows, cfg).cost
    if cfg.cp > 1:  # the planner balances a --cp plan's ranks by the CP groups' time
        placement = _check(read_placement([rows], Report()), "cp_placement")
        cost = cp_load(rows.offsets, rows.lens, placement, cp_model(cfg)).cost
    rank, micro = reshard(
        table.column("step").to_numpy(), old_rank,
        table.column("micro").to_numpy().astype(np.int64), cost,
        (cfg.dp, cfg.grad_accum), (child.dp, child.grad_accum), cfg.seed,
    )  # fmt: skip
    return _rank_tables(table, rank, micro, child.dp)


def _figures(
    child: dict[str, Any], cfg: PlanConfig, tables: list[pa.Table]
) -> tuple[dict[str, Any], list[Any]]:
    """The child's stats and per-rank shapes, by the functions ``validate`` recomputes them with
    (:mod:`varpack.planfile.recompute`), on its rows."""
    rk_rows = [_check(rank_rows(t, r, child, Report()), f"rank {r}") for r, t in enumerate(tables)]
    whole = combine(rk_rows, [_micro(rk, cfg) for rk in rk_rows], child["num_steps"], cfg)
    raw = child.get("shape_lengths")
    lengths = None if raw is None else np.asarray(raw, dtype=np.int64)
    stats = recompute_stats(rk_rows, whole, lengths, cfg, None)
    stats["cost"] = cfg.cost
    stats["dropped"] = len(child["dropped"])
    stats["oversize_alone"] = child.pop("_alone")
    split = cfg.oversize == "split"
    stats["tokens"] = recompute_tokens(child, rk_rows, len(child["epochs"]), split)
    if cfg.cp > 1:  # the CP groups' figures, as validate recomputes them
        child["cp"] = _check(recompute_cp(rk_rows, whole, cfg, Report()), "cp_placement")[2]
    return stats, whole.shapes


def clip_epochs(epochs: list[dict[str, Any]], from_step: int) -> list[dict[str, int]]:
    """The parent's epoch entries from ``from_step`` on (the first one cut there).

    >>> clip_epochs([{"epoch": 0, "first_step": 0, "num_steps": 5},
    ...              {"epoch": 1, "first_step": 5, "num_steps": 5}], 7)
    [{'epoch': 1, 'first_step': 7, 'num_steps': 3}]
    """
    out = []
    for e in epochs:
        lo, hi = int(e["first_step"]), int(e["first_step"]) + int(e["num_steps"])
        if hi > from_step:
            lo = max(lo, from_step)
            out.append({"epoch": int(e["epoch"]), "first_step": lo, "num_steps": hi - lo})
    return out


def _rank_tables(table: pa.Table, rank: np.ndarray, micro: np.ndarray, dp: int) -> list[pa.Table]:
    """Each new rank's rows in execution order (step, micro), with the new ``micro`` numbers
    and no warm-up rows (a warm-up prefix belongs to the plan it was ordered for)."""
    step = table.column("step").to_numpy()
    out = []
    for r in range(dp):
        mine = np.flatnonzero(rank == r)
        mine = mine[np.lexsort((micro[mine], step[mine]))]
        t = table.take(pa.array(mine))
        t = t.set_column(
            t.schema.get_field_index("micro"), "micro", pa.array(micro[mine], pa.int32())
        )
        at = t.schema.get_field_index("warmup")
        out.append(t.set_column(at, "warmup", pa.array(np.zeros(len(mine), bool))))
    return out


def _child_meta(
    plan: Plan, cfg: PlanConfig, from_step: int, epochs: list[dict[str, int]]
) -> dict[str, Any]:
    """plan.json of the child (stats and ranks are filled in later)."""
    meta = plan.meta
    num_steps = sum(e["num_steps"] for e in epochs)
    child: dict[str, Any] = {
        "config": cfg.to_dict(),
        "input": meta["input"],
        "layout": {"dp": cfg.dp, "pp": cfg.pp, "cp": cfg.cp, "grad_accum": cfg.grad_accum},
        "num_steps": num_steps,
        "epochs": epochs,
        "shape_lengths": meta.get("shape_lengths"),
        "stats": {},
        "dropped": meta.get("dropped") or [],
    }
    if carried_columns(meta):
        child["carry"] = meta["carry"]
    if "mix" in meta:  # the blend it continues (validate checks the run by the root's)
        child["mix"] = meta["mix"]
    if "selection" in meta:  # the run's samples were selected so (validate --metadata re-selects)
        child["selection"] = meta["selection"]
    child["parent"] = {
        "plan": str(plan.path.resolve()),
        "plan_fingerprint": meta.get(FINGERPRINT_KEY) or plan_fingerprint(meta),
        "from_step": from_step,
    }
    return child
