"""Figures: each step's totals and LR factor, each rank's shapes, and plan.json's stats.

With every rank read, the micro-batches of all ranks are put together (:class:`AllRanks`) and each
step's global samples and tokens recomputed, with its LR factor (:func:`varpack.plan.lr.lr_factors`)
and each rank's distinct shapes (:func:`varpack.plan.figures.stats.rank_shapes`). Checks that every
row carries its step's ``step_tokens``, ``step_samples`` and ``lr_factor``; that plan.json's
per-rank shapes are the manifests'; and that plan.json's stats are the ones the planner's own
assembler (:func:`varpack.plan.figures.plan_json.plan_figures`) gives on the manifests (floats
within 1e-6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.manifest.validate.files import RankRows
from varpack.manifest.validate.report import SHOW, Report
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.figures.plan_json import plan_figures
from varpack.plan.figures.stats import rank_shapes
from varpack.plan.kernels.micro import Micro
from varpack.plan.kernels.order import input_rows
from varpack.plan.lr import lr_factors


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


def check_step_columns(
    ranks: list[RankRows], steps: Steps | AllRanks, report: Report, first: int = 0
) -> None:
    """Every row carries its step's global tokens, samples and LR factor (``ranks``: the plan's
    ranks from ``first`` on)."""
    if isinstance(steps, AllRanks):
        steps = Steps(steps.step_samples, steps.step_tokens, steps.lr)
    for r, rk in enumerate(ranks, start=first):
        for col, want in (
            ("step_tokens", steps.tokens),
            ("step_samples", steps.samples),
            ("lr_factor", steps.lr),
        ):
            have = rk.table.column(col).to_numpy()
            bad = np.flatnonzero(have != want[rk.step])
            if len(bad):
                report.examples(
                    f"rank {r}: {col} differs from the recomputed value at rows",
                    [
                        f"{i} (step {rk.step[i]}: {have[i]} vs {want[rk.step[i]]})"
                        for i in bad[:SHOW]
                    ],
                    len(bad),
                )


def check_rank_shapes(meta: dict[str, Any], whole: AllRanks, report: Report) -> None:
    """plan.json's per-rank shapes are the manifests' distinct shapes."""
    for r, want in enumerate(whole.shapes):
        if meta["ranks"][r].get("shapes") != want:
            report.add(
                f"rank {r}: plan.json shapes are not the manifest's {len(want)} distinct "
                "shapes [rows, pad_to], largest first"
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


def compare_stats(saved: dict[str, Any], stats: dict[str, Any], report: Report) -> None:
    """One violation per recomputed stat that plan.json does not hold (floats within 1e-6)."""
    for key, value in stats.items():
        have = saved.get(key)
        same = (
            have == value
            if not isinstance(value, float)
            else isinstance(have, int | float) and _close(have, value)
        )
        if isinstance(value, dict) and isinstance(have, dict):
            same = _same_tree(have, value)
        if not same:
            report.add(f"plan.json stats {key} = {have!r}, recomputed {value!r}")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _same_tree(a: Any, b: Any) -> bool:
    """Equal JSON values, floats compared with :func:`_close`."""
    if isinstance(b, float):
        return isinstance(a, int | float) and _close(a, b)
    if isinstance(b, dict):
        return (
            isinstance(a, dict) and a.keys() == b.keys() and all(_same_tree(a[x], b[x]) for x in b)
        )
    return bool(a == b)
