"""Orchestration: sorted lengths in, per-rank manifest tables and plan.json's content out.

Pure: arrays and a config in, arrays and dicts out; reading the input and writing the plan live in
:mod:`varpack.cli.plan` and :mod:`varpack.manifest.format`. The steps, each its own module:

1. drop / isolate / reject samples over the budget (:func:`pack.oversize_mask`);
2. per epoch, the stream order (:mod:`order`): curriculum, or shuffled and sorted in windows;
3. micro-batches (:func:`pack.pack`), completed to a multiple of ``dp x grad_accum`` by splitting
   the costliest ones (:func:`pack.complete`); or, with ``--pp`` in the padded layout, (step, rank)
   groups of ``grad_accum`` micro-batches of one shape (:func:`pipeline.step_groups`); or, with
   ``--batching blocks``, fixed-length blocks of whole samples (:mod:`blocks`);
4. steps (:mod:`assign`): consecutive micro-batches (groups) of the stream;
5. ranks: each step's micro-batches (groups) balanced over the ranks, ``grad_accum`` each;
6. shapes: chosen lengths (``--max-shapes``, :mod:`shapes`), empty rows, one shape per pipeline
   step; ``--warmup reorder`` puts one micro-batch of every shape first on each rank (:mod:`warmup`);
7. global tokens / samples and the LR factor of every step (:mod:`lr`); stats (:mod:`stats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.fingerprint import Fingerprint, fingerprint
from varpack.plan import assign, order, pack, pipeline, shapes
from varpack.plan.blocks import pack_blocks
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.lr import lr_factors
from varpack.plan.segments import gather_positions, group_max, segment_max, segment_sums
from varpack.plan.stats import chunked_sum, plan_stats, rank_shapes, shape_stats
from varpack.plan.warmup import reorder_plan

_SHOW_IDS = 5
_PIECE = 1 << 20  # samples per piece of the input fingerprint


@dataclass
class PlanArrays:
    """A plan as arrays: the sample stream and per micro-batch / per step columns."""

    cfg: PlanConfig
    ids: np.ndarray  # kept samples (input order)
    lens: np.ndarray
    stream: np.ndarray  # stream position -> row of ids/lens (all epochs)
    offsets: np.ndarray  # micro-batch i = stream[offsets[i]:offsets[i+1]]
    micro: pack.Micro
    step: np.ndarray
    rank: np.ndarray
    micro_index: np.ndarray
    step_tokens: np.ndarray
    step_samples: np.ndarray
    lr: np.ndarray
    epochs: list[dict[str, int]]
    dropped: list[dict[str, Any]] = field(default_factory=list)
    oversize_alone: list[int] = field(default_factory=list)
    lengths: np.ndarray | None = None  # the chosen shape lengths (--max-shapes / --pack-to)
    pad_rows: np.ndarray | None = None  # per micro-batch (the manifest column, where it applies)
    block_index: np.ndarray | None = None  # per stream position (--batching blocks)
    warmup: np.ndarray | None = None  # per micro-batch (--warmup reorder)
    stream_lens: np.ndarray | None = None  # lens[stream] (kept: gathering it again is costly)

    @property
    def num_steps(self) -> int:
        return len(self.lr)


@dataclass
class _Built:
    """Micro-batches of all epochs before ranks (what each way of batching produces)."""

    stream: np.ndarray
    offsets: np.ndarray
    step: np.ndarray
    epochs: list[dict[str, int]]
    pad_to: np.ndarray | None = None  # a given shape (pipeline groups) instead of the rule
    pad_rows: np.ndarray | None = None
    block_index: np.ndarray | None = None
    group: int = 0  # > 0: consecutive runs of this many micro-batches go to one rank
    stream_lens: np.ndarray | None = None  # lens[stream] where the builder has it at hand


def _check_input(ids: np.ndarray, lens: np.ndarray) -> None:
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


def _oversize(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> tuple[np.ndarray, np.ndarray]:
    """(keep mask, alone mask over kept samples); raises for ``--oversize error``."""
    if cfg.batching == "blocks":
        over = lens > (cfg.block_len or 0)
        limit = f"--block-len {cfg.block_len}"
    else:
        over = pack.oversize_mask(lens, cfg)
        limit = f"--max-tokens {cfg.max_tokens}"
    if not over.any():
        return np.ones(len(ids), dtype=bool), np.zeros(len(ids), dtype=bool)
    if cfg.oversize == "error":
        where = np.flatnonzero(over)
        shown = ", ".join(f"{int(ids[i])} ({int(lens[i])} tokens)" for i in where[:_SHOW_IDS])
        more = f" and {len(where) - _SHOW_IDS} more" if len(where) > _SHOW_IDS else ""
        raise ConfigError(
            f"{len(where)} samples do not fit {limit} even alone: sample_id {shown}{more}; "
            f"raise {limit.split()[0]}, or pass --oversize drop (skip them)"
            + (" or --oversize alone (own micro-batch)" if cfg.batching != "blocks" else "")
        )
    if cfg.oversize == "drop":
        return ~over, np.zeros(int((~over).sum()), dtype=bool)
    return np.ones(len(ids), dtype=bool), over


def shape_rows(pad_to: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Rows ``B`` of a padded shape of length ``pad_to`` under ``--max-shapes``.

    The budget fixes them (``max_tokens // T``), or ``--batch-size`` with fixed batching.

    >>> from varpack.plan.config import PlanConfig
    >>> shape_rows(np.array([512, 1000]), PlanConfig(max_tokens=4096, max_shapes=2)).tolist()
    [8, 4]
    """
    if cfg.batching == "fixed":
        return np.full(len(pad_to), cfg.batch_size or 0, dtype=np.int64)
    assert cfg.max_tokens is not None
    return shapes.shape_batch_rows(np.asarray(pad_to, np.int64), cfg.max_tokens)


def _effective(lens: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None) -> np.ndarray:
    """Each sample's padded length in the padded layout (pad multiple, then chosen lengths)."""
    e = shapes.round_up(lens, cfg.pad_multiple)
    return e if lengths is None else shapes.round_up_to(e, lengths)


def _per_micro(lens: np.ndarray, alone: np.ndarray, cfg: PlanConfig) -> float | None:
    """Real tokens per micro-batch of sorted packing (sizes shuffled steps); None if unused."""
    if cfg.order != "shuffle" or cfg.batching != "budget":
        return None
    _, sorted_off = pack.pack(lens, np.array([0, len(lens)]), alone, cfg)
    return float(lens.sum()) / (len(sorted_off) - 1)


def _build_core(
    lens: np.ndarray, alone: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> _Built:
    per_step = cfg.micro_per_step
    view = lens if lengths is None or cfg.layout == "packed" else _effective(lens, cfg, lengths)
    joined, slens = _Epochs(), []
    per_micro = _per_micro(view, alone, cfg)
    shuffled = cfg.order == "shuffle"
    any_alone = bool(alone.any())
    for epoch in range(cfg.epochs):
        idx, bounds = order.epoch_stream(lens, cfg, epoch, per_micro)
        # Each random gather over the stream costs about a second at 100 M samples: do it once
        # (curriculum: the stream is the input order, no gather at all).
        sview = view[idx] if shuffled else view
        salone = alone if not shuffled else alone[idx] if any_alone else np.zeros(len(idx), bool)
        perm, off = pack.pack(sview, bounds, salone, cfg, per_step if shuffled else 0)
        del salone
        if perm is not None:  # close to the identity: cheap gathers
            idx, sview = idx[perm], sview[perm]
        del perm
        epoch_lens = sview if view is lens else lens[idx]
        del sview
        off = pack.complete(
            off,
            epoch_lens,
            per_step,
            lambda o, v: pack.summarize(o, v, cfg).cost,
            f"epoch {epoch}",
        )
        joined.add(epoch, idx, off, per_step)
        slens.append(epoch_lens)
    built = _Built(*joined.join(), joined.epochs)
    built.stream_lens = slens[0] if len(slens) == 1 else np.concatenate(slens)
    return built


class _Epochs:
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


def _build_pipeline(lens: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None) -> _Built:
    """``--pp`` in the padded layout: (step, rank) groups of K micro-batches of one shape."""
    k, dp = cfg.grad_accum, cfg.dp
    eff = _effective(lens, cfg, lengths)
    fixed = cfg.batching == "fixed"
    joined = _Epochs()
    per_micro = _per_micro(eff, np.zeros(len(lens), bool), cfg)
    for epoch in range(cfg.epochs):
        idx, bounds = order.epoch_windows(lens, cfg, epoch, per_micro)
        perm, starts, bounds = pipeline.step_groups(
            eff[idx],
            bounds,
            k,
            None if fixed else cfg.max_tokens,
            cfg.batch_size if fixed else None,
        )
        if perm is not None:
            idx = idx[perm]
        if cfg.order == "shuffle":
            idx, starts = _deal_groups(idx, starts, bounds, dp)
        starts = pack.complete(
            starts,
            lens[idx],
            dp,
            lambda o, v: segment_sums(o, v).astype(np.float64),
            f"epoch {epoch}",
            min_size=k,
        )
        joined.add(epoch, idx, starts, dp)  # a (step, rank) group per rank and step
    stream, goff, gstep = joined.join()
    t = segment_max(goff, eff[stream])
    rows_of = shape_rows(t, cfg) if cfg.max_shapes is not None else None
    offsets, pad_to, pad_rows = pipeline.expand_groups(goff, t, k, rows_of)
    return _Built(stream, offsets, np.repeat(gstep, k), joined.epochs, pad_to, pad_rows, None, k)


def _deal_groups(
    idx: np.ndarray, starts: np.ndarray, bounds: np.ndarray, dp: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deal each window's groups (cut in length order) to its steps in a snake, ``dp`` per step.

    Groups keep their samples; only their order changes, so consecutive ``dp`` groups (a step)
    come from across the window's lengths.
    """
    g = len(starts) - 1
    win = np.searchsorted(bounds, starts[:-1], side="right") - 1
    j = np.arange(g) - np.searchsorted(win, win, side="left")
    per_win = np.bincount(win)[win]
    slot = order.snake(j, np.maximum(1, (per_win + dp // 2) // dp))
    go = np.lexsort((j, slot, win))
    pos, new_starts = gather_positions(starts[go], np.diff(starts)[go])
    return idx[pos], new_starts


def _build_blocks(lens: np.ndarray, cfg: PlanConfig) -> _Built:
    """``--batching blocks``: best-fit blocks of whole samples, ``blocks_per_batch`` per row."""
    t, per = cfg.block_len, cfg.blocks_per_batch
    assert t is not None and per is not None
    per_step = cfg.micro_per_step
    joined, bidx, prows = _Epochs(), [], []
    for epoch in range(cfg.epochs):
        if cfg.order == "shuffle":
            idx = order.epoch_rng(cfg.seed, epoch).permutation(len(lens)).astype(np.int64)
        else:
            idx = np.arange(len(lens), dtype=np.int64)
        packing = pack_blocks(lens[idx], t, cfg.block_window)
        blk = packing.block_of_sample[packing.order]
        fill = packing.block_fill
        if cfg.order == "shuffle":  # a window's blocks in random order (best fit sorts them)
            blk, fill, moved = _shuffle_blocks(blk, fill, packing.order, cfg, epoch)
            idx = idx[packing.order[moved]]
        else:
            idx = idx[packing.order]
        soff, b_index, b_rows = _block_micro_batches(
            lens[idx], blk, fill, per, per_step, f"epoch {epoch}"
        )
        joined.add(epoch, idx, soff, per_step)
        bidx.append(b_index)
        prows.append(b_rows)
    stream, offsets, step = joined.join()
    return _Built(
        stream, offsets, step, joined.epochs, None, np.concatenate(prows), np.concatenate(bidx), 0
    )


def _shuffle_blocks(
    blk: np.ndarray, fill: np.ndarray, pos: np.ndarray, cfg: PlanConfig, epoch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renumber blocks in a random order within each window of the stream (seeded per epoch).

    ``blk``: block of each packed sample in block order, ``pos`` its stream position. Returns the
    new block ids (non-decreasing after re-ordering), block fills, and the re-ordering of samples.
    """
    nb = len(fill)
    first = np.flatnonzero(np.r_[True, blk[1:] != blk[:-1]])
    window = pos[first] // cfg.block_window
    key = np.random.default_rng([cfg.seed, epoch, 1]).random(nb)
    new_order = np.lexsort((key, window))
    new_id = np.empty(nb, np.int64)
    new_id[new_order] = np.arange(nb)
    moved = np.lexsort((np.arange(len(blk)), new_id[blk]))
    return new_id[blk][moved], fill[new_order], moved


def _block_micro_batches(
    lens: np.ndarray, blk: np.ndarray, fill: np.ndarray, per: int, per_step: int, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (samples in block order) to micro-batches of ``per`` blocks, a multiple of
    ``per_step`` of them: ``(sample offsets, block_index, pad_rows)``.

    The count is completed by splitting the fullest micro-batches at a block boundary (two
    micro-batches with fewer blocks, the rest empty blocks: ``pad_rows``). If that is not enough
    (one block per micro-batch), blocks themselves are split at a token midpoint, one block each.
    """
    nb = len(fill)
    boff = np.append(np.arange(0, nb, per, dtype=np.int64), nb)
    sums = lambda o, v: segment_sums(o, v).astype(np.float64)  # noqa: E731
    try:
        boff = pack.complete(boff, fill, per_step, sums, where)
    except ConfigError:
        # One block per micro-batch, and split blocks (two lighter blocks, both within T).
        starts = np.searchsorted(blk, np.arange(nb + 1), side="left")
        soff = pack.complete(starts, lens, per_step, sums, where)
        return soff, np.zeros(len(lens), np.int32), np.full(len(soff) - 1, per - 1, np.int32)
    soff = np.searchsorted(blk, boff, side="left")
    first_block = np.repeat(boff[:-1], np.diff(soff))
    return soff, (blk - first_block).astype(np.int32), (per - np.diff(boff)).astype(np.int32)


def plan_arrays(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> PlanArrays:
    """Plan samples given in curriculum order (sorted); see the module doc."""
    cfg = cfg.resolved()
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    _check_input(ids, lens)
    cfg = cfg.with_block_len(int(lens.max()))
    keep, alone = _oversize(ids, lens, cfg)
    ids, lens, dropped = _drop(ids, lens, keep, cfg)
    _check_fills_step(len(ids), cfg)
    lengths = _input_lengths(lens, cfg)
    built = _build(lens, alone, cfg, lengths)
    slens = lens[built.stream] if built.stream_lens is None else built.stream_lens
    if cfg.max_shapes is not None and cfg.layout == "packed":  # chosen over micro-batch totals
        lengths = shapes.choose_lengths(
            segment_sums(built.offsets, slens), cfg.max_shapes, cfg.pad_multiple
        )
    micro, pad_rows = _shape(built, slens, cfg, lengths)
    rank, micro_index = _ranks(built, micro, cfg)
    if cfg.pp > 1 and cfg.layout == "packed":  # one shape per (step, rank): its largest pad_to
        micro = pack.summarize(
            built.offsets, slens, cfg, pad_to=group_max(built.step, rank, micro.pad_to, cfg.dp)
        )
    step, warm = built.step, None
    if cfg.warmup == "reorder":
        step, micro_index, warm = reorder_plan(
            step, rank, micro_index, micro.rows, micro.pad_to, cfg.dp, cfg.grad_accum, cfg.pp > 1
        )
    step_samples, step_tokens = _step_totals(step, micro, built.epochs)
    kept_alone = ids[alone].tolist() if alone.any() else []
    return PlanArrays(
        cfg=cfg,
        ids=ids,
        lens=lens,
        stream=built.stream,
        offsets=built.offsets,
        micro=micro,
        step=step,
        rank=rank,
        micro_index=micro_index,
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=lr_factors(step_samples, step_tokens, cfg),
        epochs=built.epochs,
        dropped=dropped,
        oversize_alone=[int(i) for i in kept_alone],
        lengths=lengths,
        pad_rows=pad_rows,
        block_index=built.block_index,
        warmup=warm,
        stream_lens=slens,
    )


def _drop(
    ids: np.ndarray, lens: np.ndarray, keep: np.ndarray, cfg: PlanConfig
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """The kept samples and plan.json's ``dropped`` list (no copy when all are kept)."""
    if keep.all():
        return ids, lens, []
    gone = np.flatnonzero(~keep)
    limit = "--block-len" if cfg.batching == "blocks" else "--max-tokens"
    reason = f"oversize: longer than {limit} {cfg.block_len or cfg.max_tokens}"
    dropped = [{"sample_id": int(ids[i]), "seq_len": int(lens[i]), "reason": reason} for i in gone]
    return ids[keep], lens[keep], dropped


def _check_fills_step(n: int, cfg: PlanConfig) -> None:
    per_step = cfg.micro_per_step
    if n < per_step:
        raise ConfigError(
            f"{n} samples cannot fill one step of dp x grad_accum = {per_step} micro-batches "
            "(every rank needs grad_accum micro-batches per step); lower --dp or --grad-accum"
        )


def _input_lengths(lens: np.ndarray, cfg: PlanConfig) -> np.ndarray | None:
    """Shape lengths known before batching: ``--pack-to``, or ``--max-shapes`` chosen over the
    samples in the padded layout (packed: over the micro-batch totals, after batching)."""
    if cfg.pack_to is not None:
        return np.array([cfg.pack_to], dtype=np.int64)
    if cfg.max_shapes is not None and cfg.layout == "padded" and cfg.batching != "blocks":
        return shapes.choose_lengths(lens, cfg.max_shapes, cfg.pad_multiple)
    return None


def _build(
    lens: np.ndarray, alone: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> _Built:
    """Micro-batches and steps of all epochs, by the way of batching the config asks for."""
    if cfg.batching == "blocks":
        return _build_blocks(lens, cfg)
    if cfg.pp > 1 and cfg.layout == "padded":
        return _build_pipeline(lens, cfg, lengths)
    return _build_core(lens, alone, cfg, lengths)


def _shape(
    built: _Built, slens: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> tuple[pack.Micro, np.ndarray | None]:
    """Each micro-batch's shape and ``pad_rows`` (where the manifest has that column)."""
    offsets = built.offsets
    micro = pack.summarize(
        offsets, slens, cfg, lengths=lengths, pad_to=built.pad_to, pad_rows=built.pad_rows
    )
    pad_rows = built.pad_rows
    if pad_rows is None and cfg.uses_pad_rows:  # --max-shapes, padded: B fixed by T
        pad_rows = (shape_rows(micro.pad_to, cfg) - micro.samples).astype(np.int32)
        micro = pack.summarize(offsets, slens, cfg, lengths=lengths, pad_rows=pad_rows)
    return micro, pad_rows


def _ranks(built: _Built, micro: pack.Micro, cfg: PlanConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(rank, micro index)`` of each micro-batch: each step's micro-batches balanced over the
    ranks by cost; pipeline groups move whole, so a rank gets one group per step."""
    if not built.group:
        return assign.balance_ranks(built.step, micro.cost, cfg.dp, cfg.grad_accum)
    k = built.group
    gcost = micro.cost.reshape(-1, k).sum(axis=1)
    grank, _ = assign.balance_ranks(built.step[::k], gcost, cfg.dp, 1)
    return np.repeat(grank, k), np.tile(np.arange(k, dtype=np.int64), len(gcost))


def _step_totals(
    step: np.ndarray, micro: pack.Micro, epochs: list[dict[str, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Global samples and tokens of every step (the LR factor's inputs, repeated on each row)."""
    n_steps = epochs[-1]["first_step"] + epochs[-1]["num_steps"]
    step_samples = np.bincount(step, weights=micro.samples, minlength=n_steps).astype(np.int64)
    step_tokens = np.bincount(step, weights=micro.tokens, minlength=n_steps).astype(np.int64)
    return step_samples, step_tokens


def plan_meta(
    p: PlanArrays, input_info: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """plan.json's content (without format/version/ranks) and each rank's extra entry (shapes)."""
    cfg = p.cfg
    m = p.micro
    shapes_of = rank_shapes(p.rank, m.rows, m.pad_to, cfg.dp)
    stats = plan_figures(
        step=p.step,
        rank=p.rank,
        micro=m,
        pad_rows=p.pad_rows,
        warm=p.warmup,
        sample_step=np.repeat(
            p.step.astype(np.int32 if p.num_steps < 2**31 else np.int64), m.samples
        ),
        sample_len=p.lens[p.stream] if p.stream_lens is None else p.stream_lens,
        ideal_cost=chunked_sum(p.lens, lambda x: sample_cost(x, cfg)) * cfg.epochs,
        lr=p.lr,
        step_samples=p.step_samples,
        step_tokens=p.step_tokens,
        num_steps=p.num_steps,
        lengths=p.lengths,
        shapes=shapes_of,
        cfg=cfg,
    )
    stats["cost"] = cfg.cost
    stats["dropped"] = len(p.dropped)
    stats["oversize_alone"] = p.oversize_alone
    meta = {
        "config": cfg.to_dict(),
        "input": input_info,
        "layout": {"dp": cfg.dp, "pp": cfg.pp, "cp": 1, "grad_accum": cfg.grad_accum},
        "num_steps": p.num_steps,
        "epochs": p.epochs,
        "shape_lengths": None if p.lengths is None else p.lengths.tolist(),
        "stats": stats,
        "dropped": p.dropped,
    }
    return meta, [{"shapes": s} for s in shapes_of]


def plan_figures(
    *,
    step: np.ndarray,
    rank: np.ndarray,
    micro: pack.Micro,
    pad_rows: np.ndarray | None,
    warm: np.ndarray | None,
    sample_step: np.ndarray,
    sample_len: np.ndarray,
    ideal_cost: float,
    lr: np.ndarray,
    step_samples: np.ndarray,
    step_tokens: np.ndarray,
    num_steps: int,
    lengths: np.ndarray | None,
    shapes: list[Any],
    cfg: PlanConfig,
) -> dict[str, Any]:
    """plan.json's stats from a plan's arrays: the planner writes them, validate recomputes them
    from the manifests with this same function, so every stat written is a stat checked."""
    stats = plan_stats(
        step=step,
        rank=rank,
        count=micro.rows,
        tokens=micro.tokens,
        padded_len=micro.pad_to,
        cost=micro.cost,
        sample_step=sample_step,
        sample_len=sample_len,
        ideal_cost=ideal_cost,
        lr=lr,
        step_samples=step_samples,
        step_tokens=step_tokens,
        num_steps=num_steps,
        dp=cfg.dp,
        layout=cfg.layout,
        shapes=shapes,
    )
    stats.update(plan_shape_stats(micro, pad_rows, lengths, cfg))
    stats["warmup_rows"] = warmup_rows(rank, warm, cfg.dp)
    return stats


def plan_shape_stats(
    m: pack.Micro, pad_rows: np.ndarray | None, lengths: np.ndarray | None, cfg: PlanConfig
) -> dict[str, Any]:
    """:func:`stats.shape_stats` of a plan's micro-batches (the planner and validate share it)."""
    own = pack.shape_rule(m.samples, m.tokens, m.max_len, cfg, lengths)
    return shape_stats(
        rows=m.rows,
        pad_to=m.pad_to,
        samples=m.samples,
        tokens=m.tokens,
        pad_rows=np.zeros(len(m.rows), np.int64) if pad_rows is None else pad_rows,
        own_pad_to=own,
        layout=cfg.layout,
        pp=cfg.pp,
        blocks=(cfg.block_len, cfg.blocks_per_batch)  # type: ignore[arg-type]
        if cfg.batching == "blocks"
        else None,
    )


def warmup_rows(rank: np.ndarray, warm: np.ndarray | None, dp: int) -> list[int]:
    """Warm-up rows (the compile prefix) of each rank.

    >>> warmup_rows(np.array([0, 0, 1]), np.array([True, False, True]), 2)
    [1, 1]
    """
    if warm is None:
        return [0] * dp
    return np.bincount(rank[warm], minlength=dp).astype(int).tolist()


def input_info(ids: np.ndarray, lens: np.ndarray, source: str) -> dict[str, Any]:
    """plan.json ``input``: count, tokens and fingerprint of ALL input samples (dropped included)."""
    # The fingerprint is additive: computed in pieces, it needs no full-size temporaries.
    fp = sum(
        (
            fingerprint(ids[a : a + _PIECE], lens[a : a + _PIECE])
            for a in range(0, len(ids), _PIECE)
        ),
        Fingerprint(),
    )
    return {
        "num_samples": int(len(ids)),
        "total_tokens": int(np.asarray(lens, dtype=np.int64).sum()),
        "fingerprint": fp.hex,
        "source": source,
    }


def make_plan(
    ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig, source: str = ""
) -> tuple[PlanArrays, dict[str, Any], list[dict[str, Any]]]:
    """Plan and describe: ``(arrays, meta, rank_extra)``; write with ``manifest.write_plan``."""
    arrays = plan_arrays(ids, lens, cfg)
    meta, extra = plan_meta(arrays, input_info(ids, lens, source))
    return arrays, meta, extra
