"""The planner: sorted lengths in, a plan as arrays and plan.json's content out.

Pure (arrays and a config in, arrays and dicts out); reading the input and writing the plan are
the plan artifact's job (:mod:`varpack.make`). :func:`plan_arrays` runs the stages in
order, each a function in its own module, passing small dataclasses (:mod:`.arrays`) between:

1. **select** (:mod:`.stages.select`): input checks, oversize samples dropped, kept alone, split
   into pieces (:mod:`.kernels.split`) or refused;
2. **order + pack** (:mod:`.stages.batching`): per epoch, the stream in ``--order`` (curriculum or
   windowed shuffle, :mod:`.kernels.order`) cut into micro-batches by a batching strategy (greedy
   budget or count, pipeline groups, blocks) and numbered into steps;
3. **shapes** (:mod:`.stages.shaping`): each micro-batch's ``(rows, pad_to)``, chosen lengths,
   empty rows;
3b. **CP placement** (:mod:`.cp.stage`, ``--cp``): each sample local to a CP rank or distributed;
4. **assign** (:mod:`.stages.placement`): each step's micro-batches balanced over the ranks by cost;
5. **warm-up** (:mod:`.stages.warmup`): one micro-batch of every shape first on each rank (reorder);
6. **LR** (:mod:`.lr`): each step's global tokens and samples, and its LR factor;

then :func:`varpack.plan.figures.plan_json.plan_meta` scores the result (plan.json's stats). A new
feature is a new stage here, or a new strategy chosen by name inside one of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.plan.arrays import Batches, Placement, PlanArrays, Selection, Shapes
from varpack.plan.config import PlanConfig
from varpack.plan.cp.stage import CPPlan, place_cp
from varpack.plan.figures.plan_json import input_info, plan_meta
from varpack.plan.lr import lr_factors, step_totals
from varpack.plan.stages.batching import build_batches
from varpack.plan.stages.placement import assign
from varpack.plan.stages.select import select
from varpack.plan.stages.shaping import input_lengths, shape
from varpack.plan.stages.warmup import warm_up


def plan_arrays(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> PlanArrays:
    """Plan samples given in curriculum order (sorted by length, ties by id)."""
    return plan_selected(select(ids, lens, cfg.resolved()))


def plan_selected(chosen: Selection) -> PlanArrays:
    """Stages 2 to 6 over units selected already: a replan gives the pieces of split
    documents it has left, with their offsets (:mod:`varpack.make.remaining`)."""
    cfg = chosen.cfg
    lengths = input_lengths(chosen.lens, cfg)
    batches = build_batches(chosen, lengths)
    shaped = shape(batches, chosen.lens, cfg, lengths)
    cp = place_cp(batches, shaped, cfg)
    placed = warm_up(assign(batches, shaped, cfg, None if cp is None else cp.load.cost), cfg)
    return _finish(chosen, batches, shaped, placed, cp)


def _finish(
    chosen: Selection, batches: Batches, shaped: Shapes, placed: Placement, cp: CPPlan | None
) -> PlanArrays:
    """The LR stage, and the plan as one set of arrays."""
    cfg, micro = chosen.cfg, placed.micro
    num_steps = batches.epochs[-1]["first_step"] + batches.epochs[-1]["num_steps"]
    step_samples, step_tokens = step_totals(placed.step, micro.samples, micro.tokens, num_steps)
    lr = lr_factors(step_samples, step_tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit)
    return PlanArrays(
        cfg=cfg,
        ids=chosen.ids,
        lens=chosen.lens,
        stream=batches.stream,
        offsets=batches.offsets,
        micro=micro,
        step=placed.step,
        rank=placed.rank,
        micro_index=placed.micro_index,
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=lr,
        epochs=batches.epochs,
        dropped=chosen.dropped,
        oversize_alone=chosen.oversize_alone,
        lengths=shaped.lengths,
        pad_rows=shaped.pad_rows,
        block_index=batches.block_index,
        warmup=placed.warmup,
        stream_lens=shaped.stream_lens,
        moved=batches.moved if placed.warmup is None else None,  # reorder moves steps
        cp_placement=None if cp is None else cp.placement,
        cp_cost=None if cp is None else cp.load.cost,
        sample_offsets=chosen.offsets,
        group=chosen.group,
        notes=chosen.notes,
    )


def make_plan(
    ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig, source: str = ""
) -> tuple[PlanArrays, dict[str, Any], list[dict[str, Any]]]:
    """Plan and describe: ``(arrays, meta, rank_extra)``; write with ``manifest.write_plan``."""
    arrays = plan_arrays(ids, lens, cfg)
    meta, extra = plan_meta(arrays, input_info(ids, lens, source))
    return arrays, meta, extra
