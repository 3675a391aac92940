"""The figures of a plan: plan.json's content and its stats.

:func:`plan_figures` computes the stats from a plan's arrays; the planner writes them, and
``varpack validate`` recomputes them from the manifests with this same function, so every stat
written is a stat checked. :func:`plan_meta` assembles plan.json (without format, version and
the rank entries, which the artifact's writer adds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.fingerprint import Fingerprint, fingerprint
from varpack.plan.arrays import PlanArrays
from varpack.plan.config import PlanConfig
from varpack.plan.cost import bound_pricing, sample_cost
from varpack.plan.cp.cost import cp_load, cp_model
from varpack.plan.cp.stage import cp_figures
from varpack.plan.figures.bound import time_bound
from varpack.plan.figures.merge import WHOLE, Merge
from varpack.plan.figures.stats import (
    budget_fill,
    chunked_sum,
    fill_given_up,
    mixing,
    plan_stats,
    rank_shapes,
    shape_stats,
)
from varpack.plan.kernels.micro import Micro, shape_rule
from varpack.plan.kernels.order import moved
from varpack.plan.kernels.split import token_figures
from varpack.plan.rules import capacity
from varpack.plan.sync import slotted

_PIECE = 1 << 20  # samples per piece of the input fingerprint


def plan_meta(
    p: PlanArrays,
    input_info: dict[str, Any],
    moved: bool = True,
    shared: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """plan.json's content (without format/version/ranks) and each rank's extra entry (shapes);
    ``moved``: a shuffled plan's moved_* figures (against its drawn permutation). ``shared``:
    the per-sample figures (``ideal_cost``, ``samples`` of :func:`sample_figures`, ``tokens``,
    and with ``--cp`` the ``cp`` block) where the ranks of ``plan`` under MPI computed them;
    ``p`` then holds no samples."""
    cfg = p.cfg
    m = p.micro
    model = cfg.cost_model()
    shapes_of = rank_shapes(p.rank, m.rows, m.pad_to, cfg.dp)
    none = np.zeros(0, np.int64)
    stats = plan_figures(
        step=p.step,
        rank=p.rank,
        micro_index=p.micro_index,
        micro=m,
        pad_rows=p.pad_rows,
        warm=p.warmup,
        sample_step=none if shared else sample_steps(p.step, m.samples, p.num_steps),
        sample_len=none if shared else p.lens[p.stream] if p.stream_lens is None else p.stream_lens,
        ideal_cost=shared["ideal_cost"] if shared else ideal_cost(p.lens, model, cfg.epochs),
        lr=p.lr,
        step_samples=p.step_samples,
        step_tokens=p.step_tokens,
        num_steps=p.num_steps,
        lengths=p.lengths,
        shapes=shapes_of,
        cfg=cfg,
        rows=p.stream if moved else None,
        epochs=p.epochs,
        row_lens=p.lens,
        moved_stats=p.moved,
        samples=shared["samples"] if shared else None,
    )
    stats["cost"] = cfg.cost
    stats["dropped"] = len(p.dropped)
    stats["oversize_alone"] = p.oversize_alone
    stats["tokens"] = (
        shared["tokens"] if shared else plan_token_figures(p, int(input_info["total_tokens"]))
    )
    meta = {
        "config": cfg.to_dict(),
        "input": input_info,
        "layout": {"dp": cfg.dp, "pp": cfg.pp, "cp": cfg.cp, "grad_accum": cfg.grad_accum},
        "num_steps": p.num_steps,
        "epochs": p.epochs,
        "shape_lengths": None if p.lengths is None else p.lengths.tolist(),
        "stats": stats,
        "dropped": p.dropped,
    }
    if shared and "cp" in shared:
        meta["cp"] = shared["cp"]
    elif p.cp_placement is not None:
        meta["cp"] = _cp_block(p)
    return meta, [{"shapes": s} for s in shapes_of]


def sample_steps(step: np.ndarray, samples: np.ndarray, num_steps: int) -> np.ndarray:
    """Each sample's step (int32 while steps fit), from its micro-batch's."""
    return np.repeat(step.astype(np.int32 if num_steps < 2**31 else np.int64), samples)


def ideal_cost(lens: np.ndarray, model: Any, epochs: int, merge: Merge = WHOLE) -> float:
    """The samples' cost over every epoch (``dp`` times the ideal time); with a ``merge``, of
    every share's samples (each epoch plans every sample once)."""
    return chunked_sum(lens, lambda x: sample_cost(x, model), merge) * epochs


def sample_figures(
    *,
    sample_step: np.ndarray,
    sample_len: np.ndarray,
    step_tokens: np.ndarray,
    epochs: list[dict[str, int]] | None,
    ideal_cost: float,
    cfg: PlanConfig,
    merge: Merge = WHOLE,
) -> dict[str, float]:
    """The figures that read every sample: ``mixing``, and ``bound`` (the time bound) where it
    applies; with a ``merge``, over every share's samples (the root's figures)."""
    out = {"mixing": mixing(sample_step, sample_len, len(step_tokens), merge)}
    if cfg.batching == "budget" and cfg.max_tokens is not None and cfg.cp == 1:
        spans = [(e["first_step"], e["num_steps"]) for e in epochs] if epochs else None
        out["bound"] = time_bound(
            sample_step=sample_step,
            sample_len=sample_len,
            step_tokens=step_tokens,
            epochs=spans or [(0, len(step_tokens))],
            window=cfg.shuffle_window,
            dp=cfg.dp,
            k=1 if slotted(cfg.sync, cfg.grad_accum) else cfg.grad_accum,  # slots: K = 1 steps
            cap=capacity(cfg.pad_multiple, cfg.max_tokens),
            ideal_cost=ideal_cost,
            merge=merge,
            **bound_pricing(cfg.cost_model()),
        )
    return out


def plan_token_figures(p: PlanArrays, total: int) -> dict[str, int | float]:
    """Tokens kept, split and dropped (:func:`varpack.plan.kernels.split.token_figures`) of a
    plan."""
    dropped = sum(int(d["seq_len"]) for d in p.dropped)
    if p.group is None:
        return token_figures(total, dropped, 0, 0, 0)
    piece = p.group >= 0
    docs = int(p.group.max()) + 1 if piece.any() else 0
    return token_figures(total, dropped, int(p.lens[piece].sum()), docs, int(piece.sum()))


def _cp_block(p: PlanArrays) -> dict[str, Any]:
    """plan.json's ``cp`` figures (estimated time, memory and balance of the CP groups)."""
    assert p.cp_placement is not None
    model = cp_model(p.cfg)
    lens = p.lens[p.stream] if p.stream_lens is None else p.stream_lens
    load = cp_load(p.offsets, lens, p.cp_placement, model)
    return cp_figures(p.step, p.rank, len(p.cp_placement), load, model, p.cfg.dp)


def plan_figures(
    *,
    step: np.ndarray,
    rank: np.ndarray,
    micro_index: np.ndarray,
    micro: Micro,
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
    rows: np.ndarray | None = None,
    epochs: list[dict[str, int]] | None = None,
    row_lens: np.ndarray | None = None,
    moved_stats: dict[str, float] | None = None,
    samples: dict[str, float] | None = None,
) -> dict[str, Any]:
    """plan.json's stats from a plan's arrays: the planner writes them, validate recomputes them
    from the manifests with this same function, so every stat written is a stat checked.
    ``samples``: :func:`sample_figures`, where the caller computed them (``plan`` under MPI).

    A shuffled plan also says how far samples moved from their random positions
    (:func:`varpack.plan.kernels.order.moved`; ``rows``: each sample's input row, in
    ``sample_step``'s order; ``row_lens``: the rows' lengths), or ``moved_stats`` where the batching
    stage tallied them already (the same figures, without drawing the permutation again)."""
    if samples is None:
        samples = sample_figures(sample_step=sample_step, sample_len=sample_len,
                                 step_tokens=step_tokens, epochs=epochs, ideal_cost=ideal_cost,
                                 cfg=cfg)  # fmt: skip
    stats = plan_stats(
        step=step,
        rank=rank,
        micro=micro_index,
        count=micro.rows,
        tokens=micro.tokens,
        padded_len=micro.pad_to,
        cost=micro.cost,
        mixing=samples["mixing"],
        ideal_cost=ideal_cost,
        lr=lr,
        step_samples=step_samples,
        step_tokens=step_tokens,
        num_steps=num_steps,
        dp=cfg.dp,
        grad_accum=cfg.grad_accum,
        sync=str(cfg.sync),
        layout=cfg.layout,
        shapes=shapes,
    )
    stats["budget_fill"] = budget_fill(stats["real_tokens"], len(step), budget_tokens(cfg))
    stats.update(balance_figures(step_tokens, epochs, samples.get("bound"), cfg))
    stats.update(plan_shape_stats(micro, pad_rows, lengths, cfg))
    stats["warmup_rows"] = warmup_rows(rank, warm, cfg.dp)
    # The warm-up reorder may move a micro-batch into an earlier epoch's steps: then a step no
    # longer says which epoch's permutation a sample came from.
    if cfg.order != "shuffle" or (cfg.warmup == "reorder" and cfg.epochs > 1):
        pass
    elif moved_stats is not None:
        stats.update(moved_stats)
    elif rows is not None and epochs and row_lens is not None:
        stats.update(moved(rows, sample_step, epochs, cfg.seed, cfg.shuffle_window, row_lens))
    return stats


def balance_figures(
    step_tokens: np.ndarray,
    epochs: list[dict[str, int]] | None,
    bound: float | None,
    cfg: PlanConfig,
) -> dict[str, Any]:
    """``time_vs_ideal_bound`` (``bound``, :mod:`.bound`) and ``fill_given_up`` of a plan with a
    token budget (budget batching, no ``--cp``: context parallelism has a cost model of its own).
    The fill given up is a step's tokens against the median step's under both synchronisation
    models: with ``--sync micro`` a step's slots are cut by cost, so a slot's own fill says
    nothing of what levelling gave up."""
    if cfg.batching != "budget" or cfg.max_tokens is None or cfg.cp > 1:
        return {}
    num_steps = len(step_tokens)
    spans = [(e["first_step"], e["num_steps"]) for e in epochs] if epochs else [(0, num_steps)]
    cap = capacity(cfg.pad_multiple, cfg.max_tokens)
    last = np.array([a + n - 1 for a, n in spans if n > 0], dtype=np.int64)
    fill = fill_given_up(step_tokens, cfg.micro_per_step, cap, last)
    return {"time_vs_ideal_bound": bound, "fill_given_up": fill}


def budget_tokens(cfg: PlanConfig) -> int | None:
    """The token budget of one micro-batch: ``--max-tokens``, or ``block_len x blocks_per_batch``
    with blocks; ``None`` for fixed batching without ``--max-tokens`` (no token budget)."""
    if cfg.batching == "blocks" and cfg.block_len is not None and cfg.blocks_per_batch is not None:
        return cfg.block_len * cfg.blocks_per_batch
    return cfg.max_tokens


def plan_shape_stats(
    m: Micro, pad_rows: np.ndarray | None, lengths: np.ndarray | None, cfg: PlanConfig
) -> dict[str, Any]:
    """:func:`stats.shape_stats` of a plan's micro-batches (the planner and validate share it)."""
    own = shape_rule(m.samples, m.tokens, m.max_len, cfg.micro_rule(), lengths)
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
