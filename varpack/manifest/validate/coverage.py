"""Coverage: every sample exactly once per epoch, or listed as dropped, and nothing else.

Checks that plan.json's epochs tile the steps; that within each epoch no sample is planned twice
and none is both planned and dropped; with ``--metadata``, that the planned + dropped samples are
exactly the input's, with its lengths (naming the missing, extra and changed ids); and always
that they match the input fingerprint recorded in plan.json (:func:`varpack.fingerprint.fingerprint`).
With ``--warmup reorder`` a few micro-batches of a later epoch may sit in the warm-up prefix, so
the count is over the whole plan: each sample once per epoch, wherever it sits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.fingerprint import fingerprint
from varpack.manifest.validate.files import RankRows
from varpack.manifest.validate.report import SHOW, Report


@dataclass
class Locator:
    """Where a planned sample sits in the manifests: its rank, step and row.

    Positions index the whole plan's samples, rank 0's first (as :func:`.figures.combine` puts
    them together); only the few positions a violation names are ever located.
    """

    ranks: list[RankRows]

    def __call__(self, positions: np.ndarray) -> str:
        starts = np.cumsum([0] + [len(rk.ids) for rk in self.ranks])
        places = []
        for pos in positions[:SHOW]:
            r = int(np.searchsorted(starts, pos, side="right") - 1)
            rk = self.ranks[r]
            row = int(np.searchsorted(rk.offsets, pos - starts[r], side="right") - 1)
            places.append(f"rank {r} step {rk.step[row]} row {row}")
        more = f" and {len(positions) - SHOW} more places" if len(positions) > SHOW else ""
        return " and ".join(places) + more


def _placed(sample: int, mask: np.ndarray, locate: Callable[[np.ndarray], str] | None) -> str:
    """``sample 12 at rank 0 step 3 row 5 and rank 1 step 7 row 2`` (or its count of places)."""
    positions = np.flatnonzero(mask)
    if locate is None:
        return f"sample {sample} ({len(positions)} times)"
    return f"sample {sample} at {locate(positions)}"


def check_coverage(
    meta: dict[str, Any],
    ids: np.ndarray,
    lens: np.ndarray,
    steps: np.ndarray,
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
    whole: bool = False,
    locate: Callable[[np.ndarray], str] | None = None,
) -> None:
    """Every sample exactly once per epoch (or dropped). ``whole``: ``--warmup reorder`` may move a
    few micro-batches of a later epoch into the prefix, so count over the whole plan instead.
    ``locate`` names where positions of ``ids`` sit (rank, step, row), for samples planned twice."""
    dropped = meta.get("dropped") or []
    d_ids = np.array([int(d["sample_id"]) for d in dropped], dtype=np.int64)
    d_lens = np.array([int(d["seq_len"]) for d in dropped], dtype=np.int64)
    epochs = meta.get("epochs") or [
        {"epoch": 0, "first_step": 0, "num_steps": int(meta["num_steps"])}
    ]
    bounds = [0]
    for e in epochs:
        if int(e["first_step"]) != bounds[-1]:
            report.add(
                f"plan.json epochs: epoch {e['epoch']} starts at step {e['first_step']}, expected {bounds[-1]}"
            )
        bounds.append(int(e["first_step"]) + int(e["num_steps"]))
    if bounds[-1] != int(meta["num_steps"]):
        report.add(f"plan.json epochs cover {bounds[-1]} steps, num_steps is {meta['num_steps']}")
    info = meta.get("input", {})
    ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
    if whole and len(epochs) > 1:
        uniq, first, times = np.unique(ids, return_index=True, return_counts=True)
        off = np.flatnonzero(times != len(epochs))
        if len(off):
            report.examples(
                f"{len(off)} sample ids not planned exactly {len(epochs)} times (once per epoch)",
                [_placed(i, ids == i, locate) for i in uniq[off[:SHOW]]],
                len(off),
            )
        ids, lens, steps = uniq, lens[first], np.zeros(len(uniq), np.int64)
        ranges = [(0, 1)]
        locate = None  # positions now index the unique ids, not the manifests
    for e, (lo, hi) in enumerate(ranges):
        sel = (steps >= lo) & (steps < hi)
        e_ids, e_lens = ids[sel], lens[sel]
        order = np.argsort(e_ids, kind="stable")
        s_ids = e_ids[order]
        twice = np.unique(s_ids[np.flatnonzero(s_ids[1:] == s_ids[:-1])])
        if len(twice):
            report.examples(
                f"epoch {e}: {len(twice)} sample ids planned more than once",
                [_placed(i, sel & (ids == i), locate) for i in twice[:SHOW]],
                len(twice),
            )
        both = np.intersect1d(s_ids, d_ids)
        if len(both):
            report.examples(f"epoch {e}: samples both planned and listed as dropped", both)
        all_ids = np.concatenate((e_ids, d_ids))
        all_lens = np.concatenate((e_lens, d_lens))
        if metadata is not None:
            ref_ids, ref_lens = metadata
            missing = np.setdiff1d(ref_ids, all_ids)
            if len(missing):
                report.examples(
                    f"epoch {e}: samples of the metadata missing from the plan (not dropped)",
                    missing,
                )
            extra = np.setdiff1d(all_ids, ref_ids)
            if len(extra):
                report.examples(f"epoch {e}: sample ids not in the metadata", extra)
            order = np.argsort(ref_ids, kind="stable")
            pos = np.clip(np.searchsorted(ref_ids, all_ids, sorter=order), 0, len(ref_ids) - 1)
            ref_len = ref_lens[order[pos]]
            known = ref_ids[order[pos]] == all_ids
            wrong = np.flatnonzero(known & (ref_len != all_lens))
            if len(wrong):
                report.examples(
                    f"epoch {e}: seq_len differs from the metadata for sample ids",
                    all_ids[wrong],
                    len(wrong),
                )
        if fingerprint(all_ids, all_lens).hex != info.get("fingerprint"):
            report.add(
                f"epoch {e}: planned + dropped samples ({len(all_ids)}, {int(all_lens.sum())} tokens) do not match "
                f"the input fingerprint {info.get('fingerprint')} ({info.get('num_samples')} samples): "
                "samples missing, duplicated or changed"
            )
