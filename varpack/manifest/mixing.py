"""The I/O edge of ``varpack plan --mix``: each sample's source read, the blend planned.

The source of every sample is the metadata's ``--source-column`` (strings, or integers named by
their value), read where ``--carry`` columns are read and joined by sample id. The blend is made
by :mod:`varpack.plan.mix` (which samples, how often, in which order); the planner then plans it
as one epoch whose order is given (:func:`varpack.plan.kernels.permute.given_orders`; a
curriculum blend is passed in its interleaved order). The source column is carried into the
manifests (``carry.COL``), so the reader, ``train.py --log-by`` and ``validate`` see each
sample's source; plan.json's ``mix`` records the weights, each source's samples, tokens and
repeat factor, its share of the blend's tokens (its *target*), and its share of every step's
tokens against it (:func:`varpack.plan.mix.share_figures`, with the tolerance).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from varpack.errors import ConfigError, InputError
from varpack.manifest.carry import name_codes, read_carry_source, rows_of
from varpack.manifest.remaining import given_input
from varpack.plan import PlanArrays, PlanConfig, plan_arrays
from varpack.plan.arrays import Selection
from varpack.plan.figures.plan_json import input_info, plan_meta
from varpack.plan.kernels.permute import given_orders
from varpack.plan.mix import (
    Mix,
    blending,
    copy_number,
    default_tolerance,
    interleave,
    mix_units,
    share_figures,
)
from varpack.plan.stages.select import select


def source_codes(
    ids: np.ndarray, column: str, path: str, read: tuple[np.ndarray, pa.Table] | None = None
) -> tuple[np.ndarray, list[str]]:
    """Each sample's source (an index into the returned names) from ``column`` at ``path``
    (``read``: its ids and columns, when the caller has read them already)."""
    meta_ids, table = read if read is not None else read_carry_source(path, [column])
    col = table.column(column).combine_chunks()
    if pat.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not (pat.is_string(col.type) or pat.is_large_string(col.type) or pat.is_integer(col.type)):
        raise ConfigError(
            f"--source-column {column}: type {col.type} in {path}; a source column holds names "
            "(strings) or integers"
        )
    # names sorted, so codes do not depend on row order
    names = sorted(pc.unique(pc.cast(col, pa.string())).to_pylist())
    meta_codes = name_codes(col, names)
    row = rows_of(meta_ids, ids)
    if (row < 0).any():
        raise InputError(
            f"{path}: sample id {int(ids[row < 0][0])} has no row there; --source-column reads "
            "the metadata the input came from"
        )
    return meta_codes[row], names


def plan_mixed(
    ids: np.ndarray,
    lens: np.ndarray,
    cfg: PlanConfig,
    mix: Mix,
    column: str,
    path: str,
    source: str,
    read: tuple[np.ndarray, pa.Table] | None = None,
) -> tuple[PlanArrays, dict[str, Any], list[dict[str, Any]]]:
    """The blend of ``ids``/``lens`` (curriculum order) planned: ``(arrays, meta, rank_extra)``;
    ``read``: the metadata's ids and columns at ``path``, if read already (the carried ones)."""
    if cfg.epochs != 1:
        raise ConfigError(
            f"--epochs {cfg.epochs} with --mix: the mix's total sets how long the run is; give "
            "--total-tokens (or --total-samples) instead"
        )
    chosen = _selected(ids, lens, cfg)
    info = input_info(ids, lens, source)  # the input: what was given, dropped ones included
    ids, lens = chosen.ids, chosen.lens
    codes, names = source_codes(ids, column, path, read)
    absent = [s for s in mix.weights if s not in names]
    if absent:
        counts = np.bincount(codes, minlength=len(names))
        have = ", ".join(f"{n} ({c:,})" for n, c in zip(names, counts.tolist(), strict=True))
        raise ConfigError(
            f"--mix: source {absent[0]!r} is not in column '{column}' (sources: {have})"
        )
    units, figures = mix_units(codes, lens, names, mix, cfg.seed)
    u_codes, u_lens = codes[units], lens[units]
    copies = copy_number(units)
    curriculum = cfg.order == "curriculum"
    order = interleave(u_codes, u_lens, copies, mix.unit == "tokens", cfg.seed, curriculum)
    stream = units[order]
    targets = _targets(figures, names)
    tolerance = _tolerance(mix, cfg)
    srt = np.arange(len(stream))
    if not curriculum:  # the planner's input by length, the blend as its permutation
        srt, perm = given_input(ids[stream], lens[stream], True)
        with given_orders({0: perm}), blending(codes[stream[srt]], targets, tolerance):
            arrays = plan_arrays(ids[stream[srt]], lens[stream[srt]], cfg)
    else:  # a curriculum blend: the planner takes its input order as it is
        arrays = plan_arrays(ids[stream], lens[stream], cfg)
    arrays.moved = None
    arrays.dropped = chosen.dropped
    # no moved_* figures: they measure against a drawn permutation, and the blend has its own
    meta, extra = plan_meta(arrays, info, moved=False)
    # the planner kept every unit it was given, in its input order
    planned = codes[stream[srt]][arrays.stream]
    for name, fig in figures.items():
        fig["target"] = float(targets[names.index(name)])
    meta["mix"] = {
        "column": column,
        "unit": mix.unit,
        "total": int(sum(f["planned_tokens" if mix.unit == "tokens" else "planned_samples"] for f in figures.values())),
        "tolerance": tolerance,
        "sources": figures,
        "shares": share_figures(
            np.repeat(arrays.step, arrays.micro.samples), planned,
            arrays.lens[arrays.stream].astype(np.float64),
            [names.index(s) for s in mix.weights], list(mix.weights),
            [figures[s]["target"] for s in mix.weights], tolerance,
        ),
    }  # fmt: skip
    return arrays, meta, extra


def _targets(figures: dict[str, dict[str, Any]], names: list[str]) -> np.ndarray:
    """Each source's share of the blend's planned tokens, by source code: what every step's
    tokens hold of it (its weight, by tokens; by samples, what its samples weigh in tokens)."""
    out = np.zeros(len(names))
    total = sum(f["planned_tokens"] for f in figures.values())
    for name, fig in figures.items():
        out[names.index(name)] = fig["planned_tokens"] / total
    return out


def _tolerance(mix: Mix, cfg: PlanConfig) -> float:
    """``--mix-tolerance``, else the default for the plan's steps at full budget."""
    if mix.tolerance is not None:
        return mix.tolerance
    return default_tolerance(cfg.micro_per_step * (cfg.max_tokens or 0))


def _selected(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> Selection:
    """The samples a blend may draw from: the planner's own oversize rule applied first
    (``--oversize drop`` drops, ``error`` refuses, ``alone`` keeps), so it keeps all it is given
    after the blend; split pieces are not drawn yet (refused in one line)."""
    if cfg.oversize == "split":
        raise ConfigError(
            "--mix with --oversize split is not supported yet (pieces would be drawn after the "
            "blend); choose --oversize drop, alone or error"
        )
    return select(ids, lens, cfg)
