"""Pieces (``--oversize split``): every document's pieces tile it, and none share a micro-batch.

For a split plan, checks that no two pieces of one document sit in one micro-batch; that, in
every epoch, the pieces of each document tile ``[0, length)`` exactly once (the first starts at
0, each next one where the one before ends: no gap, no overlap); and that no piece is longer
than ``--split-len``. It then reduces the pieces to documents (id, summed length), which
:mod:`.coverage` checks like any plan's samples: against the fingerprint of the input and, with
``--metadata``, its ids and lengths. With ``--warmup reorder`` (a few micro-batches of a later
epoch in the warm-up prefix) each piece must appear once per epoch over the whole plan instead.
Each violation is one line naming the sample id and the offset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.plan.config import PlanConfig
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import SHOW, Report


def check_apart(ranks: list[RankRows], report: Report, copies: bool = False) -> None:
    """No two pieces of one document in one micro-batch (one line per case, the first few);
    ``copies``: two copies of one piece may (``--mix`` draws a document more than once)."""
    found: list[str] = []
    total = 0
    for r, rk in enumerate(ranks):
        row = np.repeat(np.arange(len(rk.step)), np.diff(rk.offsets))
        offs = rk.sample_offsets if rk.sample_offsets is not None else np.zeros_like(rk.ids)
        order = np.lexsort((offs, rk.ids, row))
        same = (row[order][1:] == row[order][:-1]) & (rk.ids[order][1:] == rk.ids[order][:-1])
        if copies:
            same &= offs[order][1:] != offs[order][:-1]
        same = np.flatnonzero(same)
        total += len(same)
        for k in same[: SHOW - len(found)]:
            a, b = order[k], order[k + 1]
            found.append(
                f"rank {r} step {rk.step[row[a]]} row {row[a]}: pieces of sample_id {rk.ids[a]} "
                f"at offsets {offs[a]} and {offs[b]} share a micro-batch"
            )
    for line in found:
        report.add(line)
    if total > len(found):
        report.add(f"(and {total - len(found)} more pieces sharing a micro-batch)")


def tile(
    ids: np.ndarray, offs: np.ndarray, lens: np.ndarray, where: str, report: Report
) -> tuple[np.ndarray, np.ndarray]:
    """Check that the pieces tile their documents; the documents ``(ids, lengths)``."""
    o = np.lexsort((offs, ids))
    i, f, n = ids[o], offs[o], lens[o]
    new = np.ones(len(i), dtype=bool)
    new[1:] = i[1:] != i[:-1]
    expect = np.zeros(len(i), dtype=np.int64)
    expect[1:] = (f + n)[:-1]
    expect[new] = 0
    bad = np.flatnonzero(f != expect)
    for k in bad[:SHOW]:
        what = (
            f"a gap: tokens {expect[k]}..{f[k]} are in no piece"
            if f[k] > expect[k]
            else f"overlaps the piece before it, which ends at token {expect[k]}"
        )
        report.add(f"{where}: sample_id {i[k]} offset {f[k]}: {what}")
    if len(bad) > SHOW:
        report.add(f"{where}: (and {len(bad) - SHOW} more pieces that do not tile their document)")
    starts = np.flatnonzero(new)
    return i[starts], np.add.reduceat(n, starts) if len(n) else n


def documents(
    meta: dict[str, Any],
    cfg: PlanConfig,
    ranks: list[RankRows],
    steps: np.ndarray,
    whole: bool,
    report: Report,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plan's documents ``(ids, lengths, steps)`` from its pieces, each check reported.

    ``steps`` is each planned piece's step; a document gets its epoch's first step.
    """
    ids = np.concatenate([rk.ids for rk in ranks])
    lens = np.concatenate([rk.lens for rk in ranks])
    offs = np.concatenate(
        [
            rk.sample_offsets if rk.sample_offsets is not None else np.zeros_like(rk.ids)
            for rk in ranks
        ]
    )
    check_apart(ranks, report)
    long = np.flatnonzero(lens > (cfg.split_len or 0))
    if len(long):
        report.examples(
            f"pieces longer than --split-len {cfg.split_len} (sample_id@offset)",
            [f"{ids[k]}@{offs[k]}" for k in long[:SHOW]],
            len(long),
        )
    epochs = meta.get("epochs") or [{"epoch": 0, "first_step": 0, "num_steps": len(steps)}]
    if whole and len(epochs) > 1:
        key = np.lexsort((offs, ids))
        i, f, n = ids[key], offs[key], lens[key]
        first = np.ones(len(i), dtype=bool)
        first[1:] = (i[1:] != i[:-1]) | (f[1:] != f[:-1])
        starts = np.flatnonzero(first)
        times = np.diff(np.append(starts, len(i)))
        off = np.flatnonzero(times != len(epochs))
        if len(off):
            report.examples(
                f"pieces not planned exactly {len(epochs)} times (once per epoch; sample_id@offset)",
                [f"{i[starts[k]]}@{f[starts[k]]}" for k in off[:SHOW]],
                len(off),
            )
        d_ids, d_lens = tile(i[starts], f[starts], n[starts], "whole plan", report)
        reps = len(epochs)
        return (
            np.repeat(d_ids, reps),
            np.repeat(d_lens, reps),
            np.zeros(len(d_ids) * reps, np.int64),
        )
    out_ids, out_lens, out_steps = [], [], []
    for e in epochs:
        lo = int(e["first_step"])
        sel = (steps >= lo) & (steps < lo + int(e["num_steps"]))
        d_ids, d_lens = tile(ids[sel], offs[sel], lens[sel], f"epoch {e['epoch']}", report)
        out_ids.append(d_ids)
        out_lens.append(d_lens)
        out_steps.append(np.full(len(d_ids), lo, dtype=np.int64))
    return np.concatenate(out_ids), np.concatenate(out_lens), np.concatenate(out_steps)
