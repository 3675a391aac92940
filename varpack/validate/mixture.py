"""Mixtures (``varpack plan --mix``): each source's use of its samples, and its share of the steps.

A blend repeats or subsamples each source, so a sample may appear several times in the run, and
coverage is checked per source instead of once per epoch (:func:`check_mix`): every planned
sample keeps one length and one source (the carried ``carry.COL`` of the source column); within
a source no sample is used twice more than another (whole passes first, then a seeded subset);
each source's planned samples and tokens are plan.json's; the planned ids are input samples
(with ``--metadata``: with their lengths); and each source's share of the steps, recomputed with
the planner's function (:func:`varpack.plan.mix.share_figures`), is plan.json's, and so is how
many steps hold every source within the tolerance (:func:`varpack.plan.mix.held_figures`).

A blend of split documents (``--oversize split``) is checked as its documents: no two pieces of
one document share a micro-batch (copies of one piece, a document drawn twice, may), no piece is
longer than ``--split-len``, each piece keeps one length and source, the pieces of a document
tile it and all appear as often (a document is drawn whole), and the documents, each as often as
it was drawn, are then held to the rules above (with ``--metadata``: their lengths are the
metadata's); each source's pieces are plan.json's ``planned_pieces``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from varpack.plan.mix import SHARE_TOLERANCE, held_figures, measured_shares, share_figures
from varpack.planfile.rankrows import RankRows, name_codes
from varpack.planfile.report import SHOW, Report
from varpack.validate.pieces import check_apart, tile


class Planned(Protocol):
    """The planned samples a blend is checked on: a plan's (``AllRanks``), or a run's over the
    plans of a replan's lineage."""

    ids: np.ndarray
    lens: np.ndarray
    sample_step: np.ndarray
    offsets: np.ndarray | None  # per planned sample, a blend of split documents only


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
    ids, lens, code_of = whole.ids, whole.lens, code
    if whole.offsets is not None:  # a blend of split documents: checked as its documents
        split_len = int(meta["config"].get("split_len") or 0)
        ids, lens, code = _documents(ranks, whole, code, split_len, mix["sources"], report)
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
    _check_shares(mix, whole, code_of, report)


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


def _documents(
    ranks: list[RankRows],
    whole: Planned,
    code: np.ndarray,
    split_len: int,
    sources: dict[str, Any],
    report: Report,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The drawn documents of a blend of pieces (ids, lengths, sources; one entry per time a
    document was drawn), each rule of the module doc on pieces reported."""
    assert whole.offsets is not None
    check_apart(ranks, report, copies=True)
    if len(whole.ids) == 0:
        return whole.ids, whole.lens, code
    long = np.flatnonzero(whole.lens > split_len)
    if len(long):
        report.examples(f"pieces longer than --split-len {split_len} (sample_id@offset)",
                        [f"{whole.ids[k]}@{whole.offsets[k]}" for k in long[:SHOW]], len(long))  # fmt: skip
    for k, (name, fig) in enumerate(sources.items()):
        have = int((code == k).sum())
        if "planned_pieces" in fig and have != fig["planned_pieces"]:
            report.add(f"mix: source {name}: {have:,} pieces planned; plan.json says "
                       f"{fig['planned_pieces']:,}")  # fmt: skip
    key = np.lexsort((whole.offsets, whole.ids))
    i, f, n, c = whole.ids[key], whole.offsets[key], whole.lens[key], code[key]
    new = np.r_[True, (i[1:] != i[:-1]) | (f[1:] != f[:-1])]  # a piece's first copy
    start = np.flatnonzero(new)
    differ = np.flatnonzero(~new & ((n != np.r_[n[:1], n[:-1]]) | (c != np.r_[c[:1], c[:-1]])))
    if len(differ):
        report.examples("mix: pieces planned with two lengths or sources (sample_id@offset)",
                        [f"{i[k]}@{f[k]}" for k in differ[:SHOW]], len(differ))  # fmt: skip
    times = np.diff(np.r_[start, len(i)])
    p_ids = i[start]
    d_ids, d_lens = tile(p_ids, f[start], n[start], "mix", report)
    first = np.flatnonzero(np.r_[True, p_ids[1:] != p_ids[:-1]])  # each document's first piece
    most, least = np.maximum.reduceat(times, first), np.minimum.reduceat(times, first)
    uneven = np.flatnonzero(most != least)
    if len(uneven):
        report.examples("mix: documents whose pieces are planned unlike often (a document is "
                        "drawn whole)", d_ids[uneven], len(uneven))  # fmt: skip
    d_code = c[start][first]
    mixed = np.flatnonzero(
        np.minimum.reduceat(c[start], first) != np.maximum.reduceat(c[start], first)
    )
    if len(mixed):
        report.examples("mix: documents whose pieces have two sources", d_ids[mixed], len(mixed))
    return np.repeat(d_ids, most), np.repeat(d_lens, most), np.repeat(d_code, most)


def _check_shares(mix: dict[str, Any], whole: Planned, code: np.ndarray, report: Report) -> None:
    """Each source's share of the steps' tokens, recomputed (floats within 1e-6), and the steps
    that hold every source within the tolerance."""
    sources = list(mix["sources"])
    figs = mix["sources"]
    targets = [float(figs[s].get("target", figs[s]["weight"])) for s in sources]
    tolerance = float(mix.get("tolerance", SHARE_TOLERANCE))
    shares = measured_shares(whole.sample_step, code, whole.lens.astype(np.float64),
                             list(range(len(sources))))  # fmt: skip
    got = share_figures(shares, sources, targets, tolerance)
    wanted = [(f"source {name}: share of the steps", got.get(name, {}), want)
              for name, want in mix["shares"].items()]  # fmt: skip
    if "steps" in mix:  # plans made before these figures lack them
        wanted.append(("the steps within the tolerance", held_figures(shares, targets, tolerance),
                       mix["steps"]))  # fmt: skip
    for what, have, want in wanted:
        if not isinstance(want, dict) or any(
            not isinstance(v, int | float)
            or not math.isclose(have.get(k, math.nan), v, rel_tol=1e-6, abs_tol=1e-9)
            for k, v in want.items()
        ):
            report.add(f"mix: {what} {have}, plan.json says {want}")
