"""Coverage: every sample exactly once per epoch, or listed as dropped, and nothing else.

Checks that plan.json's epochs tile the steps; that within each epoch no sample is planned twice
and none is both planned and dropped; with ``--metadata``, that the planned + dropped samples are
exactly the input's, with its lengths (naming the missing, extra and changed ids); and always
that they match the input fingerprint recorded in plan.json (:func:`varpack.fingerprint.fingerprint`).
With ``--warmup reorder`` a few micro-batches of a later epoch may sit in the warm-up prefix, so
the count is over the whole plan: each sample once per epoch, wherever it sits.

The check is a scan (:func:`scan`) that finds what each violation names, and a rendering
(:func:`render_coverage`) that words it. A scan of any share of the samples that holds every
occurrence of its ids (and their dropped and metadata entries) finds the part of each violation
that lies in it, and the parts merge (:func:`merge_found`): so under MPI each rank scans the ids
it owns and rank 0 words the merged result, line for line what one process prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varpack.fingerprint import Fingerprint, fingerprint
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import SHOW, Report

_MOD = 1 << 64
_SHOWN = ("twice", "both", "missing", "extra", "wrong")


@dataclass
class Locator:
    """Where a planned sample sits in the manifests: its rank, step and row.

    Positions index the whole plan's samples, rank 0's first (as :func:`varpack.planfile.recompute.combine` puts
    them together); only the few positions a violation names are ever located.
    """

    ranks: list[RankRows]

    def __call__(self, positions: np.ndarray, count: int | None = None) -> str:
        """The places of the first few ``positions`` (``count``: how many there are in all)."""
        count = len(positions) if count is None else count
        starts = np.cumsum([0] + [len(rk.lens) for rk in self.ranks])
        places = []
        for pos in positions[:SHOW]:
            r = int(np.searchsorted(starts, pos, side="right") - 1)
            rk = self.ranks[r]
            row = int(np.searchsorted(rk.offsets, pos - starts[r], side="right") - 1)
            places.append(f"rank {r} step {rk.step[row]} row {row}")
        more = f" and {count - SHOW} more places" if count > SHOW else ""
        return " and ".join(places) + more


@dataclass
class Shown:
    """What one violation names: its first few items by key, and how many there are in all.

    ``keys`` orders the items across shares (``(group, value)`` rows: the id, or the position in
    the epoch's planned + dropped samples); ``places``: per item, its first few positions in the
    plan and how many it has (for samples planned more than once)."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    items: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    total: int = 0
    places: list[tuple[np.ndarray, int]] = field(default_factory=list)


def _by_id(
    ids: np.ndarray, total: int, places: list[tuple[np.ndarray, int]] | None = None
) -> Shown:
    """Items ordered by id (``ids`` sorted, the first few of ``total``)."""
    ids = ids[:SHOW]
    keys = np.stack((np.zeros(len(ids), np.int64), ids.astype(np.int64)), axis=1)
    return Shown(keys, ids, total, places or [])


@dataclass
class EpochFound:
    """One epoch's findings: twice planned, planned and dropped, against the metadata, and the
    fingerprint of its planned + dropped samples (count, tokens as summed and as fingerprinted)."""

    twice: Shown
    both: Shown
    missing: Shown
    extra: Shown
    wrong: Shown
    count: int
    tokens: int
    fp_tokens: int
    digest: int


@dataclass
class Found:
    """Everything :func:`render_coverage` words: samples not once per epoch over the whole plan
    (``--warmup reorder``; ``once_each``: that count was made), then each epoch's findings."""

    off: Shown
    epochs: list[EpochFound]
    once_each: bool
    metadata: bool


def epoch_ranges(meta: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """plan.json's epochs (one spanning the plan if it has none) and the step bounds they give."""
    epochs = meta.get("epochs") or [
        {"epoch": 0, "first_step": 0, "num_steps": int(meta["num_steps"])}
    ]
    bounds = [0] + [int(e["first_step"]) + int(e["num_steps"]) for e in epochs]
    return epochs, bounds


def check_epochs(meta: dict[str, Any], report: Report) -> None:
    """plan.json's epochs tile the steps."""
    epochs, bounds = epoch_ranges(meta)
    for e, before in zip(epochs, bounds, strict=False):
        if int(e["first_step"]) != before:
            report.add(
                f"plan.json epochs: epoch {e['epoch']} starts at step {e['first_step']}, expected {before}"
            )
    if bounds[-1] != int(meta["num_steps"]):
        report.add(f"plan.json epochs cover {bounds[-1]} steps, num_steps is {meta['num_steps']}")


def dropped_of(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """plan.json's dropped samples: ids, lengths, and their places in its list."""
    dropped = meta.get("dropped") or []
    d_ids = np.array([int(d["sample_id"]) for d in dropped], dtype=np.int64)
    d_lens = np.array([int(d["seq_len"]) for d in dropped], dtype=np.int64)
    return d_ids, d_lens, np.arange(len(dropped), dtype=np.int64)


def check_coverage(
    meta: dict[str, Any],
    ids: np.ndarray,
    lens: np.ndarray,
    steps: np.ndarray,
    metadata: tuple[np.ndarray, np.ndarray] | None,
    report: Report,
    whole: bool = False,
    locate: Callable[..., str] | None = None,
) -> None:
    """Every sample exactly once per epoch (or dropped). ``whole``: ``--warmup reorder`` may move a
    few micro-batches of a later epoch into the prefix, so count over the whole plan instead.
    ``locate`` names where positions of ``ids`` sit (rank, step, row), for samples planned twice."""
    check_epochs(meta, report)
    found = scan(meta, ids, lens, steps, None, dropped_of(meta), metadata, whole)
    render_coverage(meta, found, locate, report)


def scan(
    meta: dict[str, Any],
    ids: np.ndarray,
    lens: np.ndarray,
    steps: np.ndarray,
    positions: np.ndarray | None,
    dropped: tuple[np.ndarray, np.ndarray, np.ndarray],
    metadata: tuple[np.ndarray, np.ndarray] | None,
    whole: bool = False,
) -> Found:
    """The findings over these samples (``positions``: theirs in the plan, ascending; ``None``:
    their indices, the samples being the whole plan's)."""
    epochs, bounds = epoch_ranges(meta)
    ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
    off, once_each = Shown(), whole and len(epochs) > 1
    if once_each:
        off, ids, lens, positions = _once_each(ids, lens, positions, len(epochs))
        steps, ranges = np.zeros(len(ids), np.int64), [(0, 1)]
    found = []
    for lo, hi in ranges:
        sel: np.ndarray | None = (steps >= lo) & (steps < hi)
        if sel is not None and sel.all():
            sel = None  # the whole array: no copies
        e_ids, e_lens = (ids, lens) if sel is None else (ids[sel], lens[sel])
        where = _Where(sel, positions)
        keys = (lambda idx, e_ids=e_ids: e_ids[idx]) if once_each else where
        found.append(_scan_epoch(e_ids, e_lens, where, keys, dropped, metadata))
    return Found(off, found, once_each, metadata is not None)


class _Where:
    """Plan positions of an epoch's samples, by their indices in the epoch (computed for the
    few a violation names)."""

    def __init__(self, sel: np.ndarray | None, positions: np.ndarray | None) -> None:
        self.sel, self.positions = sel, positions
        self.at: np.ndarray | None = None

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        if self.sel is not None and self.at is None:
            self.at = np.flatnonzero(self.sel)
        at = idx if self.at is None else self.at[idx]
        return at if self.positions is None else self.positions[at]


def _once_each(
    ids: np.ndarray, lens: np.ndarray, positions: np.ndarray | None, times_wanted: int
) -> tuple[Shown, np.ndarray, np.ndarray, np.ndarray]:
    """Ids not planned ``times_wanted`` times; then each id once, with its first length."""
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, np.int64)
    times = np.diff(np.r_[starts, len(s)])
    bad = np.flatnonzero(times != times_wanted)
    where = _Where(None, positions)
    places = [(where(order[starts[k] : starts[k] + times[k]][:SHOW]), int(times[k]))
              for k in bad[:SHOW]]  # fmt: skip
    first = order[starts]
    return _by_id(s[starts[bad]], len(bad), places), s[starts], lens[first], where(first)


def _scan_epoch(
    e_ids: np.ndarray,
    e_lens: np.ndarray,
    where: Callable[[np.ndarray], np.ndarray],
    keys: Callable[[np.ndarray], np.ndarray],
    dropped: tuple[np.ndarray, np.ndarray, np.ndarray],
    metadata: tuple[np.ndarray, np.ndarray] | None,
) -> EpochFound:
    """One epoch's findings (``where``: the plan positions of samples given by their indices;
    ``keys``: their order in the epoch)."""
    d_ids, d_lens, d_keys = dropped
    order = np.argsort(e_ids, kind="stable")
    s_ids = e_ids[order]
    dup = s_ids[1:][s_ids[1:] == s_ids[:-1]]
    dup = dup[np.r_[True, dup[1:] != dup[:-1]]] if len(dup) else dup
    places = []
    for i in dup[:SHOW]:
        lo, hi = np.searchsorted(s_ids, i, side="left"), np.searchsorted(s_ids, i, side="right")
        places.append((where(order[lo:hi][:SHOW]), int(hi - lo)))
    u_dropped = np.unique(d_ids)
    both = u_dropped[_isin_sorted(s_ids, u_dropped)]
    del order, s_ids
    all_ids = np.concatenate((e_ids, d_ids))
    all_lens = np.concatenate((e_lens, d_lens))
    missing, extra, wrong = Shown(), Shown(), Shown()
    if metadata is not None:
        missing, extra, bad = _against(all_ids, all_lens, metadata)
        n = len(e_ids)
        first = bad[:SHOW]
        planned = first[first < n]
        key = np.concatenate((keys(planned), d_keys[first[first >= n] - n])).astype(np.int64)
        wrong = Shown(
            np.stack(((first >= n).astype(np.int64), key), axis=1), all_ids[first], len(bad)
        )
    fp = fingerprint(all_ids, all_lens)
    return EpochFound(
        twice=_by_id(dup, len(dup), places),
        both=_by_id(both, len(both)),
        missing=missing,
        extra=extra,
        wrong=wrong,
        count=len(all_ids),
        tokens=int(all_lens.sum()),
        fp_tokens=fp.tokens,
        digest=fp.digest,
    )


def _against(
    all_ids: np.ndarray, all_lens: np.ndarray, metadata: tuple[np.ndarray, np.ndarray]
) -> tuple[Shown, Shown, np.ndarray]:
    """The metadata's samples missing from the plan and the plan's not in it; the indices of
    the samples whose length differs from the metadata's (its first entry of their id)."""
    ref_ids, ref_lens = metadata
    q = np.argsort(all_ids, kind="stable")
    s_all = all_ids[q]
    r_order = np.argsort(ref_ids, kind="stable")
    s_ref, s_rlens = ref_ids[r_order], ref_lens[r_order]
    del r_order
    missing, extra = _only_in(s_ref, s_all), _only_in(s_all, s_ref)
    wrong = np.zeros(0, np.int64)
    if len(s_ref):  # sorted queries: each lookup near the last one
        pos = np.minimum(np.searchsorted(s_ref, s_all), len(s_ref) - 1)
        bad = s_ref[pos] == s_all
        del s_all
        bad &= s_rlens[pos] != all_lens[q]
        wrong = np.sort(q[bad])
    return _by_id(missing, len(missing)), _by_id(extra, len(extra)), wrong


def _only_in(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct values of the sorted ``a`` that the sorted ``b`` does not hold (what
    ``np.setdiff1d`` gives, without sorting again)."""
    distinct = a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a
    return distinct[~_isin_sorted(b, distinct)]


def _isin_sorted(hay: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """Which ``needles`` occur in the sorted ``hay``."""
    if len(hay) == 0:
        return np.zeros(len(needles), dtype=bool)
    at = np.minimum(np.searchsorted(hay, needles), len(hay) - 1)
    return np.asarray(hay[at] == needles)


def merge_shown(parts: list[Shown]) -> Shown:
    """One violation's items over all shares: the first few by key, and the count."""
    keys = np.concatenate([p.keys for p in parts]).reshape(-1, 2)
    items = np.concatenate([p.items for p in parts])
    order = np.lexsort((keys[:, 1], keys[:, 0]))[:SHOW]
    places = [pl for p in parts for pl in p.places]
    return Shown(
        keys[order],
        items[order],
        sum(p.total for p in parts),
        [places[k] for k in order] if places else [],
    )


def merge_found(parts: list[Found]) -> Found:
    """The findings of shares holding disjoint sets of ids, as one scan of them all gives."""
    epochs = []
    for share in zip(*(p.epochs for p in parts), strict=True):
        shown = {name: merge_shown([getattr(s, name) for s in share]) for name in _SHOWN}
        epochs.append(
            EpochFound(
                **shown,
                count=sum(s.count for s in share),
                tokens=sum(s.tokens for s in share),
                fp_tokens=sum(s.fp_tokens for s in share) % _MOD,
                digest=sum(s.digest for s in share) % _MOD,
            )
        )
    first = parts[0]
    return Found(merge_shown([p.off for p in parts]), epochs, first.once_each, first.metadata)


def _placed(sample: Any, place: tuple[np.ndarray, int], locate: Callable[..., str] | None) -> str:
    """``sample 12 at rank 0 step 3 row 5 and rank 1 step 7 row 2`` (or its count of places)."""
    positions, count = place
    if locate is None:
        return f"sample {sample} ({count} times)"
    return f"sample {sample} at {locate(positions, count)}"


def render_coverage(
    meta: dict[str, Any], found: Found, locate: Callable[..., str] | None, report: Report
) -> None:
    """The findings, worded: one line per violation."""
    epochs, _ = epoch_ranges(meta)
    off = found.off
    if off.total:
        report.examples(
            f"{off.total} sample ids not planned exactly {len(epochs)} times (once per epoch)",
            [_placed(i, p, locate) for i, p in zip(off.items, off.places, strict=True)],
            off.total,
        )
    if found.once_each:
        locate = None  # positions now index the unique ids, not the manifests
    info = meta.get("input", {})
    for e, ep in enumerate(found.epochs):
        if ep.twice.total:
            report.examples(
                f"epoch {e}: {ep.twice.total} sample ids planned more than once",
                [
                    _placed(i, p, locate)
                    for i, p in zip(ep.twice.items, ep.twice.places, strict=True)
                ],
                ep.twice.total,
            )
        if ep.both.total:
            report.examples(f"epoch {e}: samples both planned and listed as dropped", ep.both.items)
        if found.metadata:
            _render_against(e, ep, report)
        if Fingerprint(ep.count, ep.fp_tokens, ep.digest).hex != info.get("fingerprint"):
            report.add(
                f"epoch {e}: planned + dropped samples ({ep.count}, {ep.tokens} tokens) do not match "
                f"the input fingerprint {info.get('fingerprint')} ({info.get('num_samples')} samples): "
                "samples missing, duplicated or changed"
            )


def _render_against(e: int, ep: EpochFound, report: Report) -> None:
    """The lines comparing an epoch with the metadata."""
    if ep.missing.total:
        report.examples(
            f"epoch {e}: samples of the metadata missing from the plan (not dropped)",
            ep.missing.items,
        )
    if ep.extra.total:
        report.examples(f"epoch {e}: sample ids not in the metadata", ep.extra.items)
    if ep.wrong.total:
        report.examples(
            f"epoch {e}: seq_len differs from the metadata for sample ids",
            ep.wrong.items,
            ep.wrong.total,
        )
