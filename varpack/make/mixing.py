"""The I/O edge of ``varpack plan --mix``: each sample's source read, the blend planned.

The source of every sample is the metadata's ``--source-column`` (strings, or integers named by
their value), read where ``--carry`` columns are read and joined by sample id. The blend is made
by :mod:`varpack.plan.mix` (which samples, how often, in which order); the planner then plans it
as one epoch whose order is given (:func:`varpack.plan.kernels.permute.given_orders`; a
curriculum blend is passed in its interleaved order). The source column is carried into the
manifests (``carry.COL``), so the reader, ``train.py --log-by`` and ``validate`` see each
sample's source; plan.json's ``mix`` records the weights, each source's samples, tokens and
repeat factor, its share of the blend's tokens (its *target*), its share of every step's
tokens against it (:func:`varpack.plan.mix.share_figures`, with the tolerance) and how many
steps hold every source within it (:func:`varpack.plan.mix.held_figures`).

The oversize rule applies before the blend: ``--oversize split`` cuts the long documents into
pieces first (:func:`varpack.plan.stages.select.select`), the blend draws whole documents
(:func:`varpack.plan.kernels.split.documents`) and the planner is given their pieces as they
are (:func:`varpack.plan.stages.select.given_pieces`). The blend's rows are estimated, and
refused if they would not fit in memory, before anything is drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from varpack.errors import ConfigError, InputError
from varpack.make.carry import read_carry_source, rows_of
from varpack.make.remaining import given_input
from varpack.plan import PlanArrays, PlanConfig, plan_arrays
from varpack.plan.arrays import Selection
from varpack.plan.figures.plan_json import input_info, plan_meta
from varpack.plan.kernels.permute import given_orders
from varpack.plan.kernels.split import Documents, documents, token_figures
from varpack.plan.mix import (
    SHARE_TOLERANCE,
    Mix,
    blend_rows,
    blending,
    copy_number,
    held_figures,
    interleave,
    measured_shares,
    mix_units,
    share_figures,
)
from varpack.plan.stages.select import given_pieces, select
from varpack.planfile.rankrows import name_codes


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
    too_big: Callable[[int, int], tuple[float, float] | None] | None = None,
) -> tuple[PlanArrays, dict[str, Any], list[dict[str, Any]]]:
    """The blend of ``ids``/``lens`` (curriculum order) planned: ``(arrays, meta, rank_extra)``;
    ``read``: the metadata's ids and columns at ``path``, if read already (the carried ones);
    ``too_big(rows, extra)``: the GiB needed and available where planning ``rows`` rows (and
    ``extra`` bytes beside: the blend's own arrays) would not fit in memory, else ``None``;
    asked before the blend is drawn."""
    if cfg.epochs != 1:
        raise ConfigError(
            f"--epochs {cfg.epochs} with --mix: the mix's total sets how long the run is; give "
            "--total-tokens (or --total-samples) instead"
        )
    chosen = select(ids, lens, cfg)  # oversize treated first: drop, alone, error or split
    info = input_info(ids, lens, source)  # the input: what was given, dropped ones included
    docs = documents(chosen.ids, chosen.lens, chosen.offsets, chosen.group)
    codes, names = source_codes(docs.ids, column, path, read)
    _check_sources(codes, names, mix, column)
    _check_rows(blend_rows(codes, docs.lens, docs.count, names, mix), mix, too_big)
    drawn, figures = mix_units(codes, docs.lens, names, mix, cfg.seed)
    units, which = docs.expand(drawn)  # every piece of every drawn document
    _check_fills(len(drawn), len(units), mix, cfg)
    u_codes = codes[docs.of_unit[units]]
    order = interleave(u_codes, chosen.lens[units], copy_number(drawn)[which],
                       mix.unit == "tokens", cfg.seed, cfg.order == "curriculum",
                       1.0 / docs.count[drawn][which])  # fmt: skip
    targets = _targets(figures, names)
    tolerance = SHARE_TOLERANCE if mix.tolerance is None else mix.tolerance
    arrays, s_codes = _plan_stream(chosen, units[order], u_codes[order], cfg, targets, tolerance)
    arrays.moved = None
    arrays.dropped = chosen.dropped
    # no moved_* figures: they measure against a drawn permutation, and the blend has its own
    meta, extra = plan_meta(arrays, info, moved=False)
    if chosen.offsets is not None:  # each source's pieces; the split documents drawn, once
        per = np.bincount(u_codes, minlength=len(names))
        for name, fig in figures.items():
            fig["planned_pieces"] = int(per[names.index(name)])
        meta["stats"]["tokens"] = _token_figures(docs, drawn, int(info["total_tokens"]))
    for name, fig in figures.items():
        fig["target"] = float(targets[names.index(name)])
    # the planner kept every unit it was given, in its input order
    meta["mix"] = _mix_entry(arrays, s_codes[arrays.stream], names, mix, column, figures, tolerance)
    return arrays, meta, extra


def _check_sources(codes: np.ndarray, names: list[str], mix: Mix, column: str) -> None:
    """Every weighed source is one the column names."""
    absent = [s for s in mix.weights if s not in names]
    if absent:
        counts = np.bincount(codes, minlength=len(names))
        have = ", ".join(f"{n} ({c:,})" for n, c in zip(names, counts.tolist(), strict=True))
        raise ConfigError(
            f"--mix: source {absent[0]!r} is not in column '{column}' (sources: {have})"
        )


def _plan_stream(
    chosen: Selection,
    stream: np.ndarray,
    codes: np.ndarray,
    cfg: PlanConfig,
    targets: np.ndarray,
    tolerance: float,
) -> tuple[PlanArrays, np.ndarray]:
    """The blend's ``stream`` (units of the selection, with repeats; ``codes``: their sources)
    planned as one epoch in its order, and the planner's input's sources. Shuffled: the input
    by length, the stream as its permutation, each step composed to hold the ``targets``; a
    curriculum blend: the planner takes its input order as it is."""
    curriculum = cfg.order == "curriculum"
    srt, perm = (np.arange(len(stream)), None) if curriculum else given_input(
        chosen.ids[stream], chosen.lens[stream], True)  # fmt: skip
    rows, s_codes = stream[srt], codes[srt]
    with _pieces(chosen, rows), given_orders({} if perm is None else {0: perm}):
        with nullcontext() if curriculum else blending(s_codes, targets, tolerance):
            return plan_arrays(chosen.ids[rows], chosen.lens[rows], cfg), s_codes


def _mix_entry(arrays: PlanArrays, planned: np.ndarray, names: list[str], mix: Mix, column: str,
               figures: dict[str, dict[str, Any]], tolerance: float) -> dict[str, Any]:  # fmt: skip
    """plan.json's ``mix`` (``planned``: each planned sample's source code, in stream order)."""
    shares = measured_shares(np.repeat(arrays.step, arrays.micro.samples), planned,
                             arrays.lens[arrays.stream].astype(np.float64),
                             [names.index(s) for s in mix.weights])  # fmt: skip
    goals = [figures[s]["target"] for s in mix.weights]
    unit = "planned_tokens" if mix.unit == "tokens" else "planned_samples"
    return {
        "column": column,
        "unit": mix.unit,
        "total": int(sum(f[unit] for f in figures.values())),
        "tolerance": tolerance,
        "sources": figures,
        "shares": share_figures(shares, list(mix.weights), goals, tolerance),
        "steps": held_figures(shares, goals, tolerance),
    }


def _pieces(chosen: Selection, rows: np.ndarray) -> AbstractContextManager[None]:
    """The planner's input (``rows`` of the selection) as units already: their offsets and
    documents (a split selection's), else nothing to give."""
    if chosen.offsets is None or chosen.group is None:
        return nullcontext()
    return given_pieces(chosen.offsets[rows], chosen.group[rows])


#: Bytes per planned row the blend holds while the planner runs (its draw, order, codes,
#: pieces and the planner's input; measured: 191 bytes a row beside the input at 3.7 M rows,
#: of which the planner's estimate is 88)
BLEND_BYTES_PER_ROW = 120


def _check_rows(
    rows: int, mix: Mix, too_big: Callable[[int, int], tuple[float, float] | None] | None
) -> None:
    """Refuse, before drawing it, a blend whose planned rows would not fit in memory."""
    over = None if too_big is None else too_big(rows, rows * BLEND_BYTES_PER_ROW)
    if over is not None:
        flag = f"--total-{mix.unit}"
        given = f"{flag} {mix.total:,}" if mix.total is not None else "--mix"
        raise ConfigError(
            f"{given}: the blend would plan about {rows:,} rows, which need about "
            f"{over[0]:,.1f} GiB to plan, and {over[1]:,.1f} GiB are available; lower {flag} "
            "(left out: the largest total that repeats no source), or plan on a machine with "
            "more memory"
        )


def _check_fills(drawn: int, units: int, mix: Mix, cfg: PlanConfig) -> None:
    """Refuse a blend too small to fill one step (``drawn`` samples, ``units`` pieces)."""
    if units < cfg.micro_per_step:
        given = f"--total-{mix.unit} {mix.total:,}" if mix.total is not None else "--mix"
        pieces = f" ({units:,} pieces)" if units != drawn else ""
        raise ConfigError(
            f"{given}: the blend draws {drawn:,} samples{pieces}, fewer than one step's dp x "
            f"grad_accum = {cfg.micro_per_step} micro-batches; give a larger total (left out: "
            "the largest that repeats no source)"
        )


def _token_figures(docs: Documents, drawn: np.ndarray, total: int) -> dict[str, Any]:
    """stats.tokens of a blend of split documents: the documents split among those drawn, each
    once (what ``validate`` recomputes from the manifests); none is dropped."""
    once = np.unique(drawn)
    split = once[docs.count[once] > 1]
    return token_figures(total, 0, int(docs.lens[split].sum()), len(split),
                         int(docs.count[split].sum()))  # fmt: skip


def _targets(figures: dict[str, dict[str, Any]], names: list[str]) -> np.ndarray:
    """Each source's share of the blend's planned tokens, by source code: what every step's
    tokens hold of it (its weight, by tokens; by samples, what its samples weigh in tokens)."""
    out = np.zeros(len(names))
    total = sum(f["planned_tokens"] for f in figures.values())
    for name, fig in figures.items():
        out[names.index(name)] = fig["planned_tokens"] / total
    return out
