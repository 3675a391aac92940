"""A plan's figures recomputed from its rows: step totals, plan.json's stats, tokens, CP figures.

With every rank read (:class:`~varpack.planfile.rankrows.RankRows`), the micro-batches of all
ranks are put together (:class:`AllRanks`) and each step's global samples and tokens recomputed,
with its LR factor (:func:`varpack.plan.lr.lr_factors`) and each rank's distinct shapes
(:func:`varpack.plan.figures.stats.rank_shapes`); plan.json's stats are the ones the planner's own
assembler (:func:`varpack.plan.figures.plan_json.plan_figures`) gives on them
(:func:`recompute_stats`), its ``stats.tokens`` the ones the pieces and the dropped samples give
(:func:`recompute_tokens`) and its ``cp`` figures the ones the placements give
(:func:`recompute_cp`). ``validate`` compares a plan's figures with these; ``replan`` writes a
child's figures with them, so the two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.cp.cost import CPLoad, CPModel, cp_load, cp_model
from varpack.plan.cp.stage import cp_figures
from varpack.plan.figures.plan_json import plan_figures
from varpack.plan.figures.stats import rank_shapes
from varpack.plan.kernels.micro import Micro
from varpack.plan.kernels.order import input_rows
from varpack.plan.kernels.split import token_figures
from varpack.plan.lr import lr_factors
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import Report


@dataclass
class AllRanks:
    """The plan's micro-batches of all ranks, concatenated, with the recomputed step totals."""

    step: np.ndarray  # per micro-batch
    rank_of: np.ndarray
    micro_index: np.ndarray  # its place on its rank in its step
    micro: Micro
    ids: np.ndarray  # per planned sample
    lens: np.ndarray
    sample_step: np.ndarray
    step_samples: np.ndarray  # per step
    step_tokens: np.ndarray
    lr: np.ndarray
    shapes: list[Any]  # per rank: distinct [rows, pad_to], largest first
    num_steps: int
    offsets: np.ndarray | None = None  # per planned sample (--oversize split)


@dataclass
class Steps:
    """Each step's global samples and tokens, and its LR factor, recomputed."""

    samples: np.ndarray
    tokens: np.ndarray
    lr: np.ndarray


def step_figures(step: np.ndarray, micro: Micro, num_steps: int, cfg: PlanConfig) -> Steps:
    """Each step's samples and tokens summed over the micro-batches given (all of them, or one
    rank's part: the parts' sums add up), and the LR factor of the totals."""
    samples = step_sums(step, micro.samples, num_steps)
    tokens = step_sums(step, micro.tokens, num_steps)
    return Steps(samples, tokens, step_lr(samples, tokens, cfg))


def step_sums(step: np.ndarray, values: np.ndarray, num_steps: int) -> np.ndarray:
    """``values`` summed per step (integers)."""
    return np.bincount(step, weights=values, minlength=num_steps).astype(np.int64)


def step_lr(samples: np.ndarray, tokens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """The LR factor of each step, from its global samples and tokens."""
    return lr_factors(samples, tokens, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit)


def combine(
    ranks: list[RankRows], micros: list[Micro], num_steps: int, cfg: PlanConfig
) -> AllRanks:
    """All ranks together, and each step's global samples, tokens and LR factor recomputed."""
    step = np.concatenate([rk.step for rk in ranks])
    rank_of = np.repeat(np.arange(cfg.dp), [len(rk.step) for rk in ranks])
    allm = Micro(*(np.concatenate([getattr(m, f) for m in micros]) for f in Micro._fields))
    steps = step_figures(step, allm, num_steps, cfg)
    return AllRanks(
        step=step,
        rank_of=rank_of,
        micro_index=np.concatenate([rk.micro for rk in ranks]),
        micro=allm,
        ids=np.concatenate([rk.ids for rk in ranks]),
        lens=np.concatenate([rk.lens for rk in ranks]),
        sample_step=np.concatenate([np.repeat(rk.step, np.diff(rk.offsets)) for rk in ranks]),
        step_samples=steps.samples,
        step_tokens=steps.tokens,
        lr=steps.lr,
        shapes=rank_shapes(rank_of, allm.rows, allm.pad_to, cfg.dp),
        num_steps=num_steps,
        offsets=None
        if any(rk.sample_offsets is None for rk in ranks)
        else np.concatenate([rk.sample_offsets for rk in ranks if rk.sample_offsets is not None]),
    )


def recompute_stats(
    ranks: list[RankRows],
    whole: AllRanks,
    lengths: np.ndarray | None,
    cfg: PlanConfig,
    epochs: list[dict[str, int]] | None = None,
    moved: bool = True,
) -> dict[str, Any]:
    """plan.json's stats, recomputed from the manifests with the planner's own function
    (``moved``: how far samples moved from their drawn permutation, for a shuffled plan that
    draws one)."""
    eps = epochs or []
    shuffled = cfg.order == "shuffle" and bool(eps)
    pad_rows = np.concatenate([rk.pad_rows for rk in ranks]) if cfg.uses_pad_rows else None
    warm = np.concatenate([rk.warmup for rk in ranks])
    return plan_figures(
        step=whole.step,
        rank=whole.rank_of,
        micro_index=whole.micro_index,
        micro=whole.micro,
        pad_rows=pad_rows,
        warm=warm if warm.any() else None,
        sample_step=whole.sample_step,
        sample_len=whole.lens,
        ideal_cost=float(sample_cost(whole.lens, cfg.cost_model()).sum()),
        lr=whole.lr,
        step_samples=whole.step_samples,
        step_tokens=whole.step_tokens,
        num_steps=whole.num_steps,
        lengths=lengths,
        shapes=whole.shapes,
        cfg=cfg,
        rows=_input_rows(whole, eps) if shuffled and moved and _alike(whole, eps) else None,
        epochs=epochs,
        row_lens=_row_lens(whole, eps) if shuffled else None,
    )


def _alike(whole: AllRanks, epochs: list[dict[str, int]]) -> bool:
    """Whether every epoch plans as many samples as the first: the permutation a sample moved
    from is drawn over one epoch's samples. A plan where they differ breaks coverage, which
    reports it; its moved figures are not recomputed."""
    starts = np.array([e["first_step"] for e in epochs], dtype=np.int64)
    counts = np.bincount(np.searchsorted(starts, whole.sample_step, side="right") - 1,
                         minlength=len(epochs))  # fmt: skip
    return bool((counts == counts[0]).all())


def _row_lens(whole: AllRanks, epochs: list[dict[str, int]]) -> np.ndarray:
    """The planned samples' lengths in input order (the first epoch's; every epoch has them all)."""
    first = whole.sample_step < (epochs[1]["first_step"] if len(epochs) > 1 else whole.num_steps)
    return np.sort(whole.lens[first])


def _input_rows(whole: AllRanks, epochs: list[dict[str, int]]) -> np.ndarray:
    """Each planned sample's row in its epoch's input order (by length, ties by id)."""
    rows = np.zeros(len(whole.ids), dtype=np.int64)
    starts = np.array([e["first_step"] for e in epochs], dtype=np.int64)
    epoch_of = np.searchsorted(starts, whole.sample_step, side="right") - 1
    for e in range(len(epochs)):
        at = np.flatnonzero(epoch_of == e)
        offs = None if whole.offsets is None else whole.offsets[at]
        rows[at] = input_rows(whole.lens[at], whole.ids[at], offs)
    return rows


def recompute_tokens(
    meta: dict[str, Any], ranks: list[RankRows], epochs: int, split: bool
) -> dict[str, int | float]:
    """plan.json ``stats.tokens`` recomputed from the manifests (pieces: ids planned twice or
    more in an epoch) and the dropped samples."""
    total = int(meta["input"]["total_tokens"])
    dropped = sum(int(d["seq_len"]) for d in meta.get("dropped") or [])
    if not split:
        return token_figures(total, dropped, 0, 0, 0)
    ids = np.concatenate([rk.ids for rk in ranks])
    lens = np.concatenate([rk.lens for rk in ranks])
    if "mix" in meta:  # documents drawn any number of times: the split ones, each piece once
        offs = np.concatenate([rk.sample_offsets if rk.sample_offsets is not None
                               else np.zeros_like(rk.ids) for rk in ranks])  # fmt: skip
        return _drawn_pieces(ids, offs, lens, total, dropped)
    uniq, inverse, times = np.unique(ids, return_inverse=True, return_counts=True)
    piece = times[inverse] > epochs
    tokens = int(lens[piece].sum()) // epochs
    return token_figures(
        total, dropped, tokens, int((times > epochs).sum()), int(piece.sum()) // epochs
    )


def _drawn_pieces(
    ids: np.ndarray, offs: np.ndarray, lens: np.ndarray, total: int, dropped: int
) -> dict[str, int | float]:
    """Token figures of a blend's pieces: a document with a piece past its start is split; its
    distinct pieces (one per offset), their tokens, and the split documents, each once.

    >>> _drawn_pieces(np.array([4, 4, 4, 9]), np.array([0, 5, 0, 0]), np.array([5, 2, 5, 3]),
    ...               20, 0)["split"]
    7
    """
    split = np.unique(ids[offs > 0])
    piece = np.isin(ids, split)
    i, f, n = ids[piece], offs[piece], lens[piece]
    o = np.lexsort((f, i))
    first = np.ones(len(o), dtype=bool)  # a piece's first copy
    first[1:] = (i[o][1:] != i[o][:-1]) | (f[o][1:] != f[o][:-1])
    return token_figures(total, dropped, int(n[o][first].sum()), len(split), int(first.sum()))


def read_placement(ranks: list[RankRows], report: Report) -> np.ndarray | None:
    """Every rank's ``cp_placement`` (concatenated, parallel to the samples), or None."""
    parts = []
    for r, rk in enumerate(ranks):
        col = rk.table.column("cp_placement").combine_chunks()
        off = col.offsets.to_numpy().astype(np.int64)
        ids_off = rk.table.column("sample_ids").combine_chunks().offsets.to_numpy()
        if not np.array_equal(off - off[0], ids_off - ids_off[0]) or col.null_count:
            report.add(f"rank {r}: cp_placement lists are not parallel to sample_ids")
            return None
        values = col.flatten()
        if values.null_count:
            report.add(f"rank {r}: cp_placement holds nulls")
            return None
        parts.append(values.to_numpy().astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def recompute_cp(
    ranks: list[RankRows], whole: AllRanks, cfg: PlanConfig, report: Report
) -> tuple[CPLoad, CPModel, dict[str, Any]] | None:
    """Each micro-batch's CP load, the CP model and plan.json's ``cp`` figures, from the
    manifests' placements; ``None`` (with the violation) where they cannot be read or are out
    of range. ``varpack replan`` writes a child's ``cp`` figures with it."""
    placement = read_placement(ranks, report)
    if placement is None:
        return None
    bad = np.flatnonzero((placement < -1) | (placement >= cfg.cp))
    if len(bad):
        report.examples(
            f"cp_placement out of range (-1 or 0..{cfg.cp - 1}) for sample ids",
            whole.ids[bad],
            len(bad),
        )
        return None
    model = cp_model(cfg)
    offsets = np.concatenate([[0], np.cumsum(whole.micro.samples)]).astype(np.int64)
    load = cp_load(offsets, whole.lens, placement, model)
    figures = cp_figures(whole.step, whole.rank_of, len(placement), load, model, cfg.dp)
    return load, model, figures
