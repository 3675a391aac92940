"""Mixtures (``varpack plan --mix``): each source's use of its samples, and its share of the steps.

A blend repeats or subsamples each source, so a sample may appear several times in the run, and
coverage is checked per source instead of once per epoch (:func:`check_mix`): every planned
sample keeps one length and one source (the carried ``carry.COL`` of the source column); within
a source no sample is used twice more than another (whole passes first, then a seeded subset);
each source's planned samples and tokens are plan.json's; the planned ids are input samples
(with ``--metadata``: with their lengths); and each source's share of the steps, recomputed with
the planner's function (:func:`varpack.plan.mix.share_figures`), is plan.json's.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from varpack.manifest.carry import name_codes
from varpack.manifest.validate.files import RankRows
from varpack.manifest.validate.report import Report
from varpack.plan.mix import SHARE_TOLERANCE, share_figures


class Planned(Protocol):
    """The planned samples a blend is checked on: a plan's (``AllRanks``), or a run's over the
    plans of a replan's lineage."""

    ids: np.ndarray
    lens: np.ndarray
    sample_step: np.ndarray


def _codes(ranks: list[RankRows], column: str, names: list[str]) -> np.ndarray | None:
    """Each planned sample's source, as its position in ``names`` (-1: another), from the
    carried source column."""
    if any(column not in rk.carry for rk in ranks):
        return None
    return name_codes(pa.concat_arrays([rk.carry[column] for rk in ranks]), names)


def check_mix(
    meta: dict[str, Any],
    ranks: list[RankRows],
    whole: Planned,
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
) -> None:
    """Every rule of the module doc, one line per violation."""
    mix = meta["mix"]
    sources = list(mix["sources"])
    code = _codes(ranks, mix["column"], sources)
    if code is None:
        report.add(f"mix: the manifests do not carry the source column '{mix['column']}'")
        return
    ids, lens = whole.ids, whole.lens
    order = np.lexsort((lens, ids))
    s_ids, s_lens, s_code = ids[order], lens[order], code[order]
    same = s_ids[1:] == s_ids[:-1]
    bad = np.flatnonzero(same & ((s_lens[1:] != s_lens[:-1]) | (s_code[1:] != s_code[:-1])))
    if len(bad):
        report.examples("mix: sample ids planned with two lengths or sources", s_ids[bad], len(bad))
    uniq, first, counts = np.unique(s_ids, return_index=True, return_counts=True)
    for k, (name, fig) in enumerate(mix["sources"].items()):
        mine = code == k
        planned = (int(mine.sum()), int(lens[mine].sum()))
        if planned != (fig["planned_samples"], fig["planned_tokens"]):
            report.add(
                f"mix: source {name}: {planned[0]:,} samples, {planned[1]:,} tokens planned; "
                f"plan.json says {fig['planned_samples']:,}, {fig['planned_tokens']:,}"
            )
        used = counts[s_code[first] == k]
        if len(used) and used.max() - used.min() > 1:
            report.add(
                f"mix: source {name}: a sample used {int(used.max())} times and another "
                f"{int(used.min())}; a source's samples are used alike (whole passes, then a subset)"
            )
    outside = int((code < 0).sum())
    if outside:
        report.add(f"mix: {outside:,} planned samples of sources outside the mix")
    if len(uniq) > int(meta["input"]["num_samples"]):
        report.add(f"mix: {len(uniq):,} distinct samples planned, the input holds fewer")
    if metadata is not None:
        _check_known(uniq, s_lens[first], metadata, report)
    _check_shares(mix, whole, code, report)


def _check_known(
    ids: np.ndarray, lens: np.ndarray, metadata: tuple[np.ndarray, np.ndarray], report: Report
) -> None:
    """Every planned id is the metadata's, with its length."""
    ref_ids, ref_lens = metadata
    order = np.argsort(ref_ids, kind="stable")
    pos = np.minimum(np.searchsorted(ref_ids[order], ids), len(order) - 1)
    found = ref_ids[order][pos] == ids
    if not found.all():
        report.examples(
            "mix: planned sample ids not in the metadata", ids[~found], int((~found).sum())
        )
    wrong = found & (ref_lens[order][pos] != lens)
    if wrong.any():
        report.examples(
            "mix: sample ids planned with another length than the metadata's",
            ids[wrong],
            int(wrong.sum()),
        )


def _check_shares(mix: dict[str, Any], whole: Planned, code: np.ndarray, report: Report) -> None:
    """Each source's share of the steps' tokens, recomputed (floats within 1e-6)."""
    sources = list(mix["sources"])
    figs = mix["sources"]
    targets = [float(figs[s].get("target", figs[s]["weight"])) for s in sources]
    tolerance = float(mix.get("tolerance", SHARE_TOLERANCE))
    got = share_figures(whole.sample_step, code, whole.lens.astype(np.float64),
                        list(range(len(sources))), sources, targets, tolerance)  # fmt: skip
    for name, want in mix["shares"].items():
        have = got.get(name, {})
        if any(
            not math.isclose(have.get(k, math.nan), v, rel_tol=1e-6, abs_tol=1e-9)
            for k, v in want.items()
        ):
            report.add(f"mix: source {name}: share of the steps {have}, plan.json says {want}")
