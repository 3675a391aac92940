"""Global data scheduling (``--cp`` with ``--cp-batching gds``): each step's micro-batches formed
across the data-parallel ranks, Skrull's GDS.

The greedy batcher (:mod:`.greedy`) first cuts the stream into steps of ``dp x grad_accum``
micro-batches under the memory budget (``C x cp`` tokens each, so a step holds as much as
memory allows). Then, per step, a numba kernel re-forms its micro-batches:

1. the step's samples go to the DP ranks longest-compute first, each to the least loaded rank
   that still has room for it (``grad_accum x budget`` tokens): compute balanced between DP
   ranks first (Skrull's bin packing by FLOPs);
2. each rank's subset, sorted by length, is dealt into its ``grad_accum`` micro-batches in turn
   (``subset[j::grad_accum]``): long and short samples paired in every micro-batch, so the CP
   placement has short samples to balance the long ones with.

Every step keeps exactly ``grad_accum`` micro-batches per rank (one group per rank, which the
assign stage moves whole). A step where this fails (a micro-batch over the budget, a rank with
fewer samples than micro-batches) keeps the greedy micro-batches, which always fit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.arrays import Batches
from varpack.plan.batching import greedy
from varpack.plan.config import PlanConfig
from varpack.plan.cp_cost import cp_model


@njit(cache=True)
def _step(seg, base, dp, k, budget, lin, quad, perm, sizes):  # type: ignore[no-untyped-def]
    """Re-form one step (``seg``: its lengths); fills ``perm`` and ``sizes``; False on failure."""
    n = len(seg)
    f = np.empty(n)
    for i in range(n):
        s = float(seg[i])
        f[i] = lin * s + quad * s * s
    order = np.argsort(-f, kind="mergesort")
    load = np.zeros(dp)
    tokens = np.zeros(dp, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    for i in order:
        best = -1
        for r in range(dp):
            if tokens[r] + seg[i] <= k * budget and (best < 0 or load[r] < load[best]):
                best = r
        if best < 0:
            return False
        owner[i] = best
        load[best] += f[i]
        tokens[best] += seg[i]
    by_len = np.argsort(seg, kind="mergesort")
    at = 0
    for r in range(dp):
        mine = np.empty(n, dtype=np.int64)
        c = 0
        for i in by_len:
            if owner[i] == r:
                mine[c] = i
                c += 1
        if c < k:
            return False
        for j in range(k):
            total = 0
            size = 0
            for q in range(j, c, k):
                perm[at + size] = base + mine[q]
                total += seg[mine[q]]
                size += 1
            if total > budget:
                return False
            sizes[r * k + j] = size
            at += size
    return True


@njit(cache=True)
def _regroup(lens, offsets, dp, k, budget, lin, quad):  # type: ignore[no-untyped-def]
    """Stream permutation and new offsets of every step; the number of steps kept greedy."""
    width = dp * k
    steps = (len(offsets) - 1) // width
    perm = np.arange(len(lens))
    new_off = offsets.copy()
    kept = 0
    sizes = np.empty(width, dtype=np.int64)
    for s in range(steps):
        a = offsets[s * width]
        b = offsets[(s + 1) * width]
        if _step(lens[a:b], a, dp, k, budget, lin, quad, perm[a:b], sizes):
            pos = a
            for i in range(width):
                new_off[s * width + i] = pos
                pos += sizes[i]
        else:
            for i in range(a, b):
                perm[i] = i
            kept += 1
    return perm, new_off, kept


def build(
    lens: np.ndarray, alone: np.ndarray, cfg: PlanConfig, lengths: np.ndarray | None
) -> Batches:
    """Greedy steps, each re-formed by GDS (module doc); micro-batches grouped per rank."""
    batches = greedy.build(lens, alone, cfg, lengths)
    assert batches.stream_lens is not None and cfg.max_tokens is not None
    model = cp_model(cfg)
    slens = np.ascontiguousarray(batches.stream_lens, dtype=np.int64)
    perm, offsets, _ = _regroup(
        slens, batches.offsets.astype(np.int64), cfg.dp, cfg.grad_accum, cfg.max_tokens,
        model.lin, model.quad,
    )  # fmt: skip
    batches.stream = batches.stream[perm]
    batches.stream_lens = batches.stream_lens[perm]
    batches.offsets = offsets
    batches.group = cfg.grad_accum
    return batches
