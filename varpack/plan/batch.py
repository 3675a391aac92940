"""One batch planned in memory: a rollout batch cut into a given number of steps (RL).

An RL trainer gets a new batch every iteration, after generation, and trains it in a fixed number
of optimizer steps (the PPO / GRPO mini-batches). :func:`plan_batch_arrays` plans such a batch
with the planner's stages, as a run of one epoch cut into ``steps`` steps, nothing carried across
batches and nothing written:

1. **select** (:mod:`.stages.select`): the input checks; a sample longer than the budget gets a
   micro-batch of its own (``oversize="alone"``), is split into pieces or refused;
2. **steps** (:func:`deal_steps`): the units (a sample; a group the caller keeps in one step; the
   pieces of a split sample) are dealt to the steps at random, stratified by cost: of every
   ``steps`` consecutive units in cost order each step draws one, which at random. Every step is
   a random draw of the batch with the same number of units and the batch's length mix;
3. **deal + pack**, per step: packed (no ``pp``, no split pieces), its samples, costliest first,
   each to the least loaded (by cost) of ``dp x K`` micro-batches with room
   (:func:`varpack.plan.kernels.lpt.lpt_window`), ``K`` the fewest a rank needs for the fullest
   step's tokens, one more while some step's samples do not fit (:func:`_dealt`); else, in a
   random order, composed by cost into *slots* of ``dp`` micro-batches of equal cost
   (:func:`varpack.plan.kernels.compose.compose_run` at grad-accum 1, in windows of
   :data:`WINDOW_SLOTS` slots), or in the padded layout sorted and cut under the budget
   (:func:`varpack.plan.kernels.pack.pack`), every rank of every step then running ``K``
   micro-batches, the most any step needs, rounded up to a multiple of ``pp`` (the other steps
   split their costliest, :func:`varpack.plan.kernels.pack.complete`). Each step's micro-batches
   are cut into slots by cost (:func:`varpack.plan.kernels.slots.slot_order`) and, with
   ``sync="micro"``, each slot's costliest lowered by moves and swaps
   (:func:`varpack.plan.kernels.steplevel.level_slots`);
4. **shapes** and **assign** (:mod:`.stages.shaping`, :mod:`.stages.placement`) at grad-accum
   ``K``, as for a plan from files; with ``sync="micro"`` the ranks of each slot are then dealt so
   that each rank's sum over its step is level too (:mod:`.kernels.lanes`);
5. **totals** (:func:`varpack.plan.lr.step_totals`): each step's global tokens and samples.

What the offline planner adds for a plan on disk (plan.json's figures, fingerprints, shuffle
windows, warm-up, LR factors) is left out: :func:`batch_figures` scores a batch when asked.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.arrays import Batches, PlanArrays, Selection
from varpack.plan.config import PlanConfig
from varpack.plan.cost import bound_pricing, cost_coefficients, sample_cost
from varpack.plan.figures.bound import time_bound
from varpack.plan.kernels import assign as algo
from varpack.plan.kernels.compose import compose_run
from varpack.plan.kernels.lanes import level_lanes
from varpack.plan.kernels.lpt import lpt_window
from varpack.plan.kernels.micro import summarize
from varpack.plan.kernels.pack import complete, oversize_mask, pack
from varpack.plan.kernels.slots import move_micro, slot_order
from varpack.plan.kernels.split import alone_volume, fit_len, unit_count
from varpack.plan.kernels.steplevel import level_slots
from varpack.plan.lr import step_totals
from varpack.plan.oversize import ALONE_BOUND, alone_bound
from varpack.plan.rules import capacity
from varpack.plan.stages.batching import engine
from varpack.plan.stages.batching.costed import step_fill
from varpack.plan.stages.placement import assign
from varpack.plan.stages.select import SHOW_IDS, select
from varpack.plan.stages.shaping import shape
from varpack.plan.sync import SYNC_MODELS, slotted
from varpack.plan.tuning import MORE_MICRO, STEP_SHARE, WINDOW_SLOTS

#: Most pieces ``oversize="split"`` may cut a batch's samples into. A batch is planned in memory
#: at about 230 bytes and 0.6 us of CPU a unit (1 M pieces: 226 MB traced, 0.6 s), so 16.8 M
#: pieces take about 4 GB and 10 s: beyond any rollout batch, and a budget far below the
#: samples' lengths (1e9 pieces raised MemoryError before this bound). Whole samples are not
#: bounded here: the caller holds them already.
MAX_PIECES = 1 << 24
_STREAM = 0x6F6E6C696E65  # the batch planner's random stream, apart from the offline orders'


@lru_cache(maxsize=256)
def batch_config(**options: Any) -> PlanConfig:
    """The resolved config of a batch (cached: an RL loop plans with the same options each
    iteration, and resolving checks every option). The micro-batches per rank and step are
    chosen per batch, a multiple of ``pp``: ``pp`` stands for them while resolving."""
    return PlanConfig(order="shuffle", grad_accum=options.get("pp", 1), **options).resolved()


def deal_steps(unit_cost: np.ndarray, steps: int, rng: np.random.Generator) -> np.ndarray:
    """The step of every unit: units sorted by cost (ties at random) in strata of ``steps``,
    each stratum's units to the steps in a random order (a short last stratum to as many
    steps, drawn at random). Every step gets the same number of units, give or take one.

    Strata {5, 3} and {2, 1}: each step draws one unit of each.

    >>> deal_steps(np.array([5.0, 1, 3, 2]), 2, np.random.default_rng(0)).tolist()
    [1, 1, 0, 0]
    """
    u = len(unit_cost)
    shuffled = rng.permutation(u)
    order = shuffled[np.argsort(-np.asarray(unit_cost, np.float64)[shuffled], kind="stable")]
    strata = -(-u // steps)
    draw = np.argsort(rng.random((strata, steps)), axis=1, kind="stable").ravel()[:u]
    out = np.empty(u, dtype=np.int64)
    out[order] = draw
    return out


def plan_batch_arrays(
    lens: np.ndarray, cfg: PlanConfig, steps: int, groups: np.ndarray | None = None
) -> PlanArrays:
    """A batch of samples ``lens`` (any order) planned into ``steps`` steps: the plan's arrays,
    ``ids`` holding each planned unit's index into ``lens``. ``cfg``: resolved, shuffled order;
    its ``grad_accum`` is replaced by the micro-batches per rank the batch needs. ``groups``:
    a group number per sample; a group's samples go to one step."""
    # Every step needs dp x pp units at least: refused before anything is allocated per step.
    units = unit_count(lens, cfg.split_len if cfg.oversize == "split" else None)
    if cfg.oversize == "split":
        _check_pieces(lens, cfg)
    else:
        _check_fit(lens, cfg)
    if units < cfg.dp * cfg.pp * steps:
        raise _too_few(len(lens), cfg, steps, f"{units} units" if units > len(lens) else None)
    chosen = select(np.arange(len(lens), dtype=np.int64), lens, cfg)
    rng = np.random.default_rng([cfg.seed, _STREAM])
    unit_step = _unit_steps(chosen, steps, groups, rng)
    per_step = np.bincount(unit_step, minlength=steps)
    if per_step.min() < cfg.dp * cfg.pp:
        held = f"a step holds {int(per_step.min())}"
        if groups is not None:
            held += ": each group goes whole to one step"
        raise _too_few(len(lens), cfg, steps, held)
    perm = rng.permutation(len(unit_step))  # each step's samples in a random order
    rows = perm[np.argsort(unit_step[perm], kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(per_step)))
    step_rows = [rows[bounds[s] : bounds[s + 1]] for s in range(steps)]
    if cfg.compose == "engine":
        cfg, batches = _by_engine(step_rows, chosen, cfg, steps)
    else:
        dealt = _dealt(step_rows, chosen, cfg)
        if dealt is not None:
            parts, k = dealt
        else:
            slot = int(STEP_SHARE * cfg.dp * _tokens_per_micro(chosen))  # tokens of a slot
            parts = [_compose(r, chosen, cfg, slot) for r in step_rows]
            k = max(-(-(len(starts) - 1) // cfg.dp) for _, starts in parts)
            k = -(-k // cfg.pp) * cfg.pp
        cfg = dataclasses.replace(cfg, grad_accum=k)
        batches = _whole_steps(parts, chosen, cfg, steps)
    shaped = shape(batches, chosen.lens, cfg, None)
    placed = assign(batches, shaped, cfg)
    rank = placed.rank
    k = cfg.grad_accum
    micro = placed.micro
    step_samples, step_tokens = step_totals(placed.step, micro.samples, micro.tokens, steps)
    if slotted(cfg.sync, k):  # each slot's ranks: level sums over the step too
        # counted from a rank the step's tokens pick (the same on every rank, another each
        # step and batch): the deal's order would make the last rank the slowest slot after slot
        rank = level_lanes(placed.step, placed.micro_index, micro.cost, cfg.dp, k,
                           step_tokens % cfg.dp)  # fmt: skip
    return PlanArrays(
        cfg=cfg,
        ids=chosen.ids,
        lens=chosen.lens,
        stream=batches.stream,
        offsets=batches.offsets,
        micro=micro,
        step=placed.step,
        rank=rank,
        micro_index=placed.micro_index,
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=np.ones(steps),
        epochs=batches.epochs,
        oversize_alone=chosen.oversize_alone,
        stream_lens=shaped.stream_lens,
        sample_offsets=chosen.offsets,
        group=chosen.group,
        notes=chosen.notes,
    )


def _check_fit(lens: np.ndarray, cfg: PlanConfig) -> None:
    """``oversize="error"``: every sample fits the budget alone; ``"alone"``: every lone one
    within :func:`~varpack.plan.oversize.alone_bound` (said here in the API's words, before
    :func:`~varpack.plan.stages.select.select` would say it in the command line's)."""
    assert cfg.max_tokens is not None
    over = np.flatnonzero(oversize_mask(lens, cfg.pack_rule()))
    if cfg.oversize == "alone":
        bound = alone_bound(cfg)
        over = over[alone_volume(lens[over], cfg.pad_multiple) > bound]
    if not len(over):
        return
    shown = ", ".join(f"{int(i)} ({int(lens[i]):,} tokens)" for i in over[:SHOW_IDS])
    more = f" and {len(over) - SHOW_IDS} more" if len(over) > SHOW_IDS else ""
    if cfg.oversize == "alone":
        raise ConfigError(
            f"oversize='alone': {len(over)} samples would make micro-batches above "
            f"{ALONE_BOUND} x max_tokens={cfg.max_tokens} ({bound:,} tokens): sample {shown}"
            f"{more}; pass oversize='split' (pieces of the budget) or raise max_tokens"
        )
    alone = cfg.pp == 1 and cfg.max_shapes is None  # else a lone sample needs its own shape
    raise ConfigError(
        f"{len(over)} samples do not fit max_tokens={cfg.max_tokens} even alone: sample "
        f"{shown}{more}; raise max_tokens, or pass oversize='split' (pieces of the budget)"
        + (" or oversize='alone' (a micro-batch of its own)" if alone else "")
    )


def _check_pieces(lens: np.ndarray, cfg: PlanConfig) -> None:
    """Refuse a split into more than :data:`MAX_PIECES` pieces, from its exact count (a sum
    of ``ceil(length / split length)`` over the long samples), before any piece exists."""
    assert cfg.split_len is not None
    long = lens[lens > cfg.split_len]
    pieces = int((-(-long // cfg.split_len)).sum())
    if pieces > MAX_PIECES:
        raise ConfigError(
            f"oversize='split' would cut {len(long):,} samples into {pieces:,} pieces of at most "
            f"{cfg.split_len:,} token{'s' * (cfg.split_len > 1)} (max_tokens={cfg.max_tokens}), more than the "
            f"{MAX_PIECES:,} a batch is planned with (about 4 GB); raise max_tokens, or shorten "
            "or leave out the longest samples"
        )


def _too_few(n: int, cfg: PlanConfig, steps: int, held: str | None) -> ConfigError:
    """``n`` samples cannot give every rank ``pp`` micro-batches in each of ``steps`` steps."""
    each = "a micro-batch" if cfg.pp == 1 else f"pp = {cfg.pp} micro-batches"
    where = "" if steps == 1 else f" in each of {steps} steps"
    lower = ("dp" if cfg.pp == 1 else "dp or pp") + ("" if steps == 1 else " or mini_batches")
    return ConfigError(
        f"{n} samples cannot give each of {cfg.dp} rank{'s' * (cfg.dp > 1)} {each}{where}"
        f"{'' if held is None else f' ({held})'}; lower {lower}"
    )


def _unit_steps(
    chosen: Selection, steps: int, groups: np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    """The step of every selected unit: units of one group, or pieces of one sample, together."""
    if steps == 1:
        return np.zeros(len(chosen.ids), dtype=np.int64)
    cost = sample_cost(chosen.lens, chosen.cfg.cost_model())
    if groups is None and chosen.group is None:
        return deal_steps(cost, steps, rng)
    key = chosen.ids if groups is None else groups[chosen.ids]
    _, unit = np.unique(key, return_inverse=True)
    unit = unit.ravel()
    return deal_steps(np.bincount(unit, weights=cost), steps, rng)[unit]


def _by_engine(
    step_rows: list[np.ndarray], chosen: Selection, cfg: PlanConfig, steps: int
) -> tuple[PlanConfig, Batches]:
    """The steps composed by the balance engine (``compose="engine"``), each on its own
    (:func:`~varpack.plan.stages.batching.engine.batch_steps`): the config at the micro-batches
    per rank they take, and their micro-batches, a rank's share of a step one group (under
    ``sync="micro"`` one micro-batch, the slots of each step cut by cost)."""
    got = engine.batch_steps([(chosen.lens[r], chosen.alone[r]) for r in step_rows], cfg)
    if got is None:
        raise ConfigError(
            f"compose='engine' cannot compose every step of this batch into the same number "
            f"of micro-batches for {cfg.dp} ranks (some steps hold too few samples for the "
            "micro-batches the fullest one needs); lower dp or mini_batches, or raise max_tokens"
        )
    parts, k = got
    cfg = dataclasses.replace(cfg, grad_accum=k)
    kb, _ = engine.regime(cfg)
    stream = np.concatenate([r[pos] for r, (pos, _) in zip(step_rows, parts, strict=True)])
    offs, at = [], 0
    for pos, starts in parts:
        offs.append(starts[:-1] + at)
        at += len(pos)
    starts = np.append(np.concatenate(offs), at)
    slens = chosen.lens[stream]
    if kb == 1:  # the ranks meet at every micro-batch: each step's slots of alike cost
        cost = np.add.reduceat(sample_cost(slens, cfg.cost_model()), starts[:-1])
        (pos,), starts = move_micro(
            (np.arange(len(stream), dtype=np.int64),), starts, slot_order(cost, cfg.dp, k, 1)
        )
        stream, slens = stream[pos], slens[pos]
    step = algo.steps_in_order(len(starts) - 1, cfg.micro_per_step)
    epochs = [{"epoch": 0, "first_step": 0, "num_steps": steps}]
    return cfg, Batches(stream, starts, step, epochs, group=kb, stream_lens=slens)


def _dealt(
    step_rows: list[np.ndarray], chosen: Selection, cfg: PlanConfig
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int] | None:
    """Each step's samples dealt, costliest first, to the least loaded of ``dp x K``
    micro-batches with room (:func:`~varpack.plan.kernels.lpt.lpt_window`): ``K`` the fewest a
    rank needs for the fullest step's tokens, one more while some step's samples do not all fit
    (at most :data:`MORE_MICRO` of them, and one). Every micro-batch of a step then costs about
    the same, so the slots cut from them by cost (and under ``sync="micro"`` levelled) wait on
    little. None where it does not apply (the padded layout, ``pp``, split pieces) or no ``K``
    fits."""
    if cfg.layout != "packed" or cfg.pp > 1 or chosen.group is not None:
        return None
    cap = capacity(cfg.pad_multiple, cfg.max_tokens or 0)
    lin, quad = cost_coefficients(cfg.cost_model())
    fewest = max(-(-int(chosen.lens[r].sum()) // (cfg.dp * cap)) for r in step_rows)
    for k in range(fewest, fewest + int(MORE_MICRO * fewest) + 2):
        parts = [_lpt(r, chosen, cfg.dp * k, cap, lin, quad) for r in step_rows]
        if all(p is not None for p in parts):
            return parts, k  # type: ignore[return-value]
    return None


def _lpt(rows: np.ndarray, chosen: Selection, nbins: int, cap: int, lin: float,
         quad: float) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """One step's ``rows`` dealt to ``nbins`` micro-batches (``(stream, starts)``), or None."""
    m = len(rows)
    if m < nbins:
        return None
    lens, alone = chosen.lens[rows], chosen.alone[rows]
    order = np.lexsort((np.arange(m), -lens))  # costliest first, ties in the step's order
    where = np.empty(m, dtype=np.int64)
    if not lpt_window(np.arange(m, dtype=np.int64), order, np.zeros(m, np.bool_),
                      np.ascontiguousarray(lens, np.int64), alone, lin, quad, nbins, cap, where,
                      True):  # fmt: skip
        return None
    pos = np.argsort(where, kind="stable")
    return rows[pos], np.concatenate(([0], np.cumsum(np.bincount(where, minlength=nbins))))


def _compose(
    rows: np.ndarray, chosen: Selection, cfg: PlanConfig, slot: int
) -> tuple[np.ndarray, np.ndarray]:
    """One step's samples (``rows`` of the selection) as ``(stream, starts)``: slots of ``dp``
    micro-batches of ``slot`` tokens composed by cost (packed; split pieces only where they fill
    the budget, so two of a sample never fit together), or sorted and cut under the budget."""
    lens, alone = chosen.lens[rows], chosen.alone[rows]
    assert cfg.max_tokens is not None
    whole = chosen.group is None or cfg.split_len == fit_len(cfg.max_tokens, cfg.pad_multiple)
    if cfg.layout == "packed" and whole:
        total = int(lens.sum())
        windows = -(-total // (WINDOW_SLOTS * slot))  # equal windows, the whole step where it can
        # not levelled by swaps: milliseconds count here, not the last tenth of a percent
        got = compose_run(lens, alone, cost_coefficients(cfg.cost_model()), total // windows + 1,
                          slot, cfg.dp, 1, cfg.pad_multiple, cfg.max_tokens, step_fill(cfg),
                          level=False)  # fmt: skip
        if got is not None:
            return rows[got.stream], got.starts
    order = np.lexsort((np.arange(len(rows)), lens))  # sorted, ties in the step's random order
    group = None if chosen.group is None else chosen.group[rows[order]]
    _, starts = pack(lens[order], np.array([0, len(rows)]), alone[order], cfg.pack_rule(), 0, group)
    return rows[order], starts


def _tokens_per_micro(chosen: Selection) -> float:
    """Real tokens a micro-batch holds when the batch is packed sorted (sizes the slots)."""
    lens = np.sort(chosen.lens)
    rule = chosen.cfg.pack_rule()
    alone = oversize_mask(lens, rule) if chosen.alone.any() else np.zeros(len(lens), np.bool_)
    _, starts = pack(lens, np.array([0, len(lens)]), alone, rule)
    return float(lens.sum()) / (len(starts) - 1)


def _whole_steps(
    parts: list[tuple[np.ndarray, np.ndarray]], chosen: Selection, cfg: PlanConfig, steps: int
) -> Batches:
    """The steps' micro-batches, each step completed to ``dp x K`` (its costliest split) and
    cut into slots by cost, as one stream numbered into steps."""
    rule = cfg.micro_rule()
    per_step = cfg.micro_per_step
    streams, offs, at = [], [], 0
    for s, (rows, starts) in enumerate(parts):
        try:
            starts = complete(starts, chosen.lens[rows], per_step,
                              lambda o, v: summarize(o, v, rule).cost, f"step {s}")  # fmt: skip
        except ConfigError:
            raise ConfigError(
                f"step {s} holds {len(rows)} samples, too few for {cfg.dp} ranks x "
                f"{cfg.grad_accum} micro-batches (the most a step's samples need, rounded up to "
                "a multiple of pp; none may be empty); lower dp or mini_batches, or raise "
                "max_tokens"
            ) from None
        streams.append(rows)
        offs.append(starts[:-1] + at)
        at += len(rows)
    stream = np.concatenate(streams)
    starts = np.append(np.concatenate(offs), at)
    slens = chosen.lens[stream]
    cost = summarize(starts, slens, rule).cost
    (pos,), starts = move_micro(
        (np.arange(len(stream), dtype=np.int64),),
        starts,
        slot_order(cost, cfg.dp, cfg.grad_accum, 1),
    )
    stream, slens = stream[pos], slens[pos]
    if slotted(cfg.sync, cfg.grad_accum) and chosen.group is None and cfg.layout == "packed":
        pos, starts = level_slots(slens, starts, chosen.alone[stream], cfg.dp,
                                  capacity(cfg.pad_multiple, cfg.max_tokens or 0),
                                  cost_coefficients(cfg.cost_model()))  # fmt: skip
        stream, slens = stream[pos], slens[pos]
    step = algo.steps_in_order(len(starts) - 1, per_step)
    epochs = [{"epoch": 0, "first_step": 0, "num_steps": steps}]
    return Batches(stream, starts, step, epochs, stream_lens=slens)


def batch_figures(p: PlanArrays) -> dict[str, Any]:
    """A batch's time against the ideal under each sync model (``time_vs_ideal``: the plan's
    own), and the lower bound no composition of its steps' samples can beat (``bound``)."""
    cfg = p.cfg
    ideal_cost = float(sample_cost(p.lens, cfg.cost_model()).sum())
    ideal = ideal_cost / cfg.dp
    n = p.num_steps
    times = {
        name: float(
            fn(p.step, p.rank, p.micro_index, p.micro.cost, n, cfg.dp, cfg.grad_accum).sum()
        )
        for name, fn in SYNC_MODELS.items()
    }
    by_sync = {name: t / ideal if ideal else 1.0 for name, t in times.items()}
    assert cfg.max_tokens is not None
    bound = time_bound(
        sample_step=np.repeat(p.step, p.micro.samples),
        sample_len=p.stream_lens if p.stream_lens is not None else p.lens[p.stream],
        step_tokens=p.step_tokens,
        epochs=[(0, n)],
        window=1,  # each step's samples are its own (dealt before composing)
        dp=cfg.dp,
        k=1 if slotted(cfg.sync, cfg.grad_accum) else cfg.grad_accum,
        cap=capacity(cfg.pad_multiple, cfg.max_tokens),
        ideal_cost=ideal_cost,
        **bound_pricing(cfg.cost_model()),
    )
    return {
        "time_vs_ideal": by_sync[str(cfg.sync)],
        "time_vs_ideal_by_sync": by_sync,
        "bound": bound,
        "ideal_time": ideal,
        "est_time": times[str(cfg.sync)],
    }
