"""Coverage scanned in shares (by the rank owning each id, as under MPI) and merged gives the
lines one scan of the whole plan gives: duplicates with their places, dropped, missing, extra
and changed samples, epochs and the fingerprint, with and without ``--warmup reorder``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from varpack.fingerprint import fingerprint
from varpack.planfile.opened import share
from varpack.planfile.report import Report
from varpack.validate.coverage import (
    check_coverage,
    check_epochs,
    dropped_of,
    merge_found,
    render_coverage,
    scan,
)
from varpack.validate.parallel import owner


def _locate(positions: np.ndarray, count: int | None = None) -> str:
    return f"{positions.tolist()} of {count}"


def _case(rng: np.random.Generator, epochs: int) -> dict[str, Any]:
    """A plan's samples (some planned twice, some missing, some dropped) and its metadata."""
    n = int(rng.integers(1, 400))
    ref_ids = rng.choice(10 * n + 10, n, replace=False).astype(np.int64)
    ref_lens = rng.integers(1, 50, n).astype(np.int64)
    drop = rng.random(n) < 0.05
    kept = np.flatnonzero(~drop)
    ids, lens = [], []
    for _ in range(epochs):
        take = rng.permutation(kept)[: max(len(kept) - int(rng.integers(0, 3)), 0)]
        extra = rng.choice(take, int(rng.integers(0, 8))) if len(take) else take
        both = np.concatenate([take, extra, np.flatnonzero(drop)[: int(rng.integers(0, 2))]])
        ids.append(ref_ids[both])
        lens.append(ref_lens[both] + (rng.random(len(both)) < 0.02))
    steps_per = 10
    steps = np.concatenate(
        [
            np.sort(rng.integers(e * steps_per, (e + 1) * steps_per, len(i)))
            for e, i in enumerate(ids)
        ]
    )
    meta = {
        "num_steps": steps_per * epochs,
        "epochs": [{"epoch": e, "first_step": e * steps_per, "num_steps": steps_per}
                   for e in range(epochs)],
        "dropped": [{"sample_id": int(i), "seq_len": int(x)}
                    for i, x in zip(ref_ids[drop], ref_lens[drop], strict=True)],
        "input": {"fingerprint": fingerprint(ref_ids, ref_lens).hex, "num_samples": n},
    }  # fmt: skip
    extra_ref = rng.integers(10**6, 10**6 + 5, int(rng.integers(0, 3)))
    known = rng.random(n) > 0.02  # a few planned samples the metadata does not hold
    metadata = (
        np.concatenate([ref_ids[known], extra_ref]),
        np.concatenate([ref_lens[known], extra_ref % 7 + 1]),
    )
    return {"meta": meta, "ids": np.concatenate(ids), "lens": np.concatenate(lens),
            "steps": steps, "metadata": metadata}  # fmt: skip


def _in_shares(c: dict[str, Any], size: int, whole: bool, with_meta: bool) -> list[str]:
    """The lines of the owners' scans, merged: what rank 0 prints under MPI."""
    report = Report()
    check_epochs(c["meta"], report)
    parts = []
    for rank in range(size):  # each rank sends its contiguous slice to the owners of its ids
        pieces = [share(len(c["ids"]), size, src) for src in range(size)]
        pos = np.concatenate([np.arange(p.start, p.stop)[owner(c["ids"][p], size) == rank]
                              for p in pieces]).astype(np.int64)  # fmt: skip
        d_ids, d_lens, d_keys = dropped_of(c["meta"])
        here = owner(d_ids, size) == rank
        ref = None
        if with_meta:
            r_ids, r_lens = c["metadata"]
            mine = owner(r_ids, size) == rank
            ref = (r_ids[mine], r_lens[mine])
        parts.append(
            scan(
                c["meta"],
                c["ids"][pos],
                c["lens"][pos],
                c["steps"][pos],
                pos,
                (d_ids[here], d_lens[here], d_keys[here]),
                ref,
                whole,
            )  # fmt: skip
        )
    render_coverage(c["meta"], merge_found(parts), _locate, report)
    return report.problems


@pytest.mark.parametrize("seed", range(24))
def test_shares_merge_to_the_whole_scan(seed):
    rng = np.random.default_rng(seed)
    c = _case(rng, epochs=1 + seed % 3)
    for whole in (False, True):
        for with_meta in (False, True):
            one = Report()
            meta = c["metadata"] if with_meta else None
            check_coverage(c["meta"], c["ids"], c["lens"], c["steps"], meta, one, whole, _locate)
            for size in (1, 2, 3, 5):
                assert _in_shares(c, size, whole, with_meta) == one.problems, (
                    whole,
                    with_meta,
                    size,
                )
