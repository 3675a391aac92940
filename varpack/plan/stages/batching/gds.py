"""Global data scheduling (``--cp`` with ``--cp-batching gds``): each step's micro-batches formed
across the data-parallel ranks, Skrull's GDS.

The greedy batcher (:mod:`.greedy`) first cuts the stream into steps of ``dp x grad_accum``
micro-batches under the memory budget (``C x cp`` tokens each, so a step holds as much as
memory allows). Then, per step, a numba kernel re-forms its micro-batches:

1. the step's samples go to the DP ranks costliest first, each to the least loaded rank that
   still has room for it (``grad_accum x C x cp`` tokens): compute balanced between DP ranks
   first (Skrull's bin packing by FLOPs);
2. each rank's subset is dealt the same way into its ``grad_accum`` micro-batches (room: the
   memory, ``C x cp`` tokens): the long samples spread one per micro-batch first, the short
   ones then fill the lightest, so every micro-batch pairs long with short and the CP placement
   has short samples to balance the long ones with.

Every step keeps exactly ``grad_accum`` micro-batches per rank (one group per rank, which the
assign stage moves whole). With ``--sync micro`` the step's samples go straight to its
``dp x grad_accum`` micro-batches the same way, and the assign stage cuts them into slots. A step where this fails (no room left for a sample, a rank with fewer
samples than micro-batches) keeps its greedy micro-batches, which always fit, grouped per rank by
the same costliest-first rule. A ``--max-tokens`` below ``C x cp`` leaves GDS room to pair.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from varpack.plan.arrays import Batches
from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import cp_model
from varpack.plan.kernels.assign import deal_ranks
from varpack.plan.kernels.inputs import frozen
from varpack.plan.stages.batching import greedy
from varpack.plan.sync import slotted


@njit(cache=True)
def _lpt(items, f, tok, bins, cap, owner):  # type: ignore[no-untyped-def]
    """``items`` (costliest first) to ``bins`` bins: each to the least loaded bin with room for
    its tokens (``cap``); False when one has no room."""
    load = np.zeros(bins)
    tokens = np.zeros(bins, dtype=np.int64)
    for i in items:
        best = -1
        for r in range(bins):
            if tokens[r] + tok[i] <= cap and (best < 0 or load[r] < load[best]):
                best = r
        if best < 0:
            return False
        owner[i] = best
        load[best] += f[i]
        tokens[best] += tok[i]
    return True


@njit(cache=True)
def _step(seg, base, dp, k, cap, lin, quad, perm, sizes):  # type: ignore[no-untyped-def]
    """Re-form one step (``seg``: its lengths); fills ``perm`` and ``sizes``; False on failure."""
    n = len(seg)
    f = np.empty(n)
    for i in range(n):
        s = float(seg[i])
        f[i] = lin * s + quad * s * s
    order = np.argsort(-f, kind="mergesort")
    rank = np.empty(n, dtype=np.int64)
    if not _lpt(order, f, seg, dp, k * cap, rank):
        return False
    micro = np.empty(n, dtype=np.int64)
    at = 0
    for r in range(dp):
        mine = order[rank[order] == r]  # costliest first
        if len(mine) < k or not _lpt(mine, f, seg, k, cap, micro):
            return False
        for j in range(k):
            size = 0
            for i in mine[::-1]:  # shortest first inside a micro-batch
                if micro[i] == j:
                    perm[at + size] = base + i
                    size += 1
            if size == 0:
                return False
            sizes[r * k + j] = size
            at += size
    return True


@njit(cache=True)
def _keep(cost, dp, k, first, order):  # type: ignore[no-untyped-def]
    """A step kept greedy: its micro-batches grouped ``k`` per rank, costliest first to the
    least loaded rank with room (``order`` gets the micro-batches in rank-group order)."""
    w = dp * k
    idx = np.argsort(-cost, kind="mergesort")
    rank = np.empty(w, dtype=np.int64)
    fill = np.empty(w, dtype=np.int64)
    deal_ranks(cost[idx], dp, k, rank, fill)
    for q in range(w):
        order[rank[q] * k + fill[q]] = first + idx[q]


@njit(cache=True)
def _regroup(lens, offsets, dp, k, cap, lin, quad):  # type: ignore[no-untyped-def]
    """Stream permutation and new offsets of every step; the number of steps kept greedy."""
    width = dp * k
    steps = (len(offsets) - 1) // width
    perm = np.arange(len(lens))
    new_off = offsets.copy()
    kept = 0
    sizes = np.empty(width, dtype=np.int64)
    mb_order = np.empty(width, dtype=np.int64)
    for s in range(steps):
        a = offsets[s * width]
        b = offsets[(s + 1) * width]
        if not _step(lens[a:b], a, dp, k, cap, lin, quad, perm[a:b], sizes):
            kept += 1
            cost = np.zeros(width)
            for i in range(width):
                for p in range(offsets[s * width + i], offsets[s * width + i + 1]):
                    x = float(lens[p])
                    cost[i] += lin * x + quad * x * x
            _keep(cost, dp, k, s * width, mb_order)
            at = a
            for i in range(width):
                m = mb_order[i]
                sizes[i] = offsets[m + 1] - offsets[m]
                for p in range(offsets[m], offsets[m + 1]):
                    perm[at] = p
                    at += 1
        pos = a
        for i in range(width):
            new_off[s * width + i] = pos
            pos += sizes[i]
    return perm, new_off, kept


def regroup_steps(
    lens: np.ndarray, offsets: np.ndarray, cfg: PlanConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Every whole step of micro-batches ``offsets`` over ``lens`` (in stream order) re-formed
    by GDS: ``(permutation of the stream, new offsets)``."""
    model = cp_model(cfg)
    cap = model.bucket * model.n  # memory, not --max-tokens: a lower budget leaves GDS room
    # --sync micro: every micro-batch of the step levelled alike (the assign stage cuts slots)
    dp, k = (
        (cfg.micro_per_step, 1) if slotted(cfg.sync, cfg.grad_accum) else (cfg.dp, cfg.grad_accum)
    )
    perm, new_off, _ = _regroup(
        frozen(lens, np.int64), frozen(offsets, np.int64), dp, k, cap,
        model.lin, model.quad,
    )  # fmt: skip
    return perm, new_off


def build(
    lens: np.ndarray,
    alone: np.ndarray,
    cfg: PlanConfig,
    lengths: np.ndarray | None,
    group: np.ndarray | None = None,  # always None: --oversize split is refused here
) -> Batches:
    """Greedy steps, each re-formed by GDS (module doc); micro-batches grouped per rank."""
    batches = greedy.build(lens, alone, cfg, lengths)
    assert batches.stream_lens is not None and cfg.max_tokens is not None
    perm, offsets = regroup_steps(batches.stream_lens, batches.offsets, cfg)
    batches.stream = batches.stream[perm]
    batches.stream_lens = batches.stream_lens[perm]
    batches.offsets = offsets
    batches.group = 0 if slotted(cfg.sync, cfg.grad_accum) else cfg.grad_accum
    return batches
