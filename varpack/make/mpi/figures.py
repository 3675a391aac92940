"""plan.json's content under MPI: the same figures as one process, from parts of every rank.

The stats are :func:`varpack.plan.figures.plan_json.plan_meta`'s, computed with the same
functions on the same values, so they match to the last bit, and no rank holds every sample:

* the figures that read every sample (mixing, the time bound, the ideal cost) run on every rank
  over its own samples, combined by :class:`Ranks` from parts that add up exactly (a length
  histogram, per-step and per-window sums of integers, the few long samples, and the ideal's
  float sum over the same chunks of lengths, each summed where it lies whole);
* the figures of micro-batches (balance, padding, shapes, warm-up) read compact columns that
  rank 0 gathers, laid out epoch-major in rank order (the one process's order);
* the per-step columns every rank holds whole (:func:`.warmup.global_totals`); the input's
  count, tokens and fingerprint are summed over the ranks' shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from varpack.fingerprint import Fingerprint, fingerprint
from varpack.make.mpi.local import RankPlan, epoch_slices
from varpack.plan import PlanArrays, PlanConfig
from varpack.plan.figures.plan_json import ideal_cost, sample_figures, sample_steps
from varpack.plan.kernels.micro import Micro
from varpack.plan.kernels.split import token_figures

_PIECE = 1 << 20  # samples per piece of the input fingerprint (as one process)


class Ranks:
    """:class:`varpack.plan.figures.merge.Merge` over the ranks of ``comm`` (rank 0 the root)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.root = comm.Get_rank() == 0

    def histogram(self, values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = self.comm.allgather((values, counts))
        every = np.concatenate([v for v, _ in parts])
        merged, at = np.unique(every, return_inverse=True)
        total = np.zeros(len(merged), dtype=np.int64)
        np.add.at(total, at, np.concatenate([c for _, c in parts]).astype(np.int64))
        return merged, total

    def total(self, a: np.ndarray) -> np.ndarray | None:
        return self.comm.reduce(a, root=0)  # type: ignore[no-any-return]

    def join(self, a: np.ndarray) -> np.ndarray | None:
        parts = self.comm.gather(a, root=0)
        return None if parts is None else np.concatenate(parts)

    def chunked(
        self, a: np.ndarray, size: int, fn: Callable[[np.ndarray], float]
    ) -> list[float] | None:
        rank, nranks = self.comm.Get_rank(), self.comm.Get_size()
        starts = np.cumsum([0, *self.comm.allgather(len(a))])
        start, total = int(starts[rank]), int(starts[-1])
        values: dict[int, float] = {}
        sends: list[dict[int, np.ndarray]] = [{} for _ in range(nranks)]
        for c, lo in enumerate(range(0, total, size)):
            hi = min(lo + size, total)
            a0, a1 = max(lo - start, 0), min(hi - start, len(a))
            if a1 <= a0:
                continue
            if a1 - a0 == hi - lo:  # this rank holds the chunk whole
                values[c] = fn(a[a0:a1])
            else:  # its pieces meet on the rank holding the chunk's first value
                sends[int(np.searchsorted(starts, lo, side="right")) - 1][c] = a[a0:a1]
        pieces: dict[int, list[np.ndarray]] = {}
        for got in self.comm.alltoall(sends):
            for c, piece in got.items():
                pieces.setdefault(c, []).append(piece)
        for c, parts in pieces.items():
            values[c] = fn(np.concatenate(parts))
        every = self.comm.gather(values, root=0)
        if every is None:
            return None
        merged = {c: v for part in every for c, v in part.items()}
        return [merged[c] for c in range(-(-total // size))]


def input_share(comm: Any, ids: np.ndarray, lens: np.ndarray, source: str) -> dict[str, Any]:
    """plan.json ``input`` from every rank's share of the input (all ranks get it)."""
    fp = sum(
        (
            fingerprint(ids[a : a + _PIECE], lens[a : a + _PIECE])
            for a in range(0, len(ids), _PIECE)
        ),
        Fingerprint(),
    )
    parts = comm.allgather((len(ids), int(lens.sum()), fp))
    total = sum((f for _, _, f in parts), Fingerprint())
    return {
        "num_samples": sum(n for n, _, _ in parts),
        "total_tokens": sum(t for _, t, _ in parts),
        "fingerprint": total.hex,
        "source": source,
    }


def input_figures(
    comm: Any,
    lens: np.ndarray,
    group: np.ndarray | None,
    cfg: PlanConfig,
    total_tokens: int,
    dropped: list[dict[str, Any]],
) -> dict[str, Any]:
    """The figures of the selected samples (this rank's ``lens`` and split ``group`` in input
    order): the ideal cost and the token counts (every rank gets them)."""
    ideal = comm.bcast(ideal_cost(lens, cfg.cost_model(), cfg.epochs, Ranks(comm)), root=0)
    piece = np.zeros(len(lens), bool) if group is None else group >= 0
    docs = max(comm.allgather(int(group.max()) + 1 if piece.any() else 0))  # type: ignore[union-attr]
    split = comm.allreduce(int(lens[piece].sum()))
    pieces = comm.allreduce(int(piece.sum()))
    gone = sum(int(d["seq_len"]) for d in dropped)
    tokens = token_figures(total_tokens, gone, split, docs, pieces)
    return {"ideal_cost": ideal, "tokens": tokens}


def shared_figures(comm: Any, p: RankPlan, inputs: dict[str, Any]) -> dict[str, Any]:
    """The per-sample figures of the whole plan from every rank's samples (valid on rank 0):
    what :func:`~varpack.plan.figures.plan_json.plan_meta` takes as ``shared``, with
    ``inputs`` (:func:`input_figures`)."""
    assert p.stream_lens is not None
    tiled = p.repeats and len(p.epochs) > 1
    samples = sample_figures(
        sample_step=sample_steps(p.step, p.micro.samples, p.num_steps),
        sample_len=np.tile(p.stream_lens, len(p.epochs)) if tiled else p.stream_lens,
        step_tokens=p.step_tokens,
        epochs=p.epochs,
        ideal_cost=inputs["ideal_cost"],
        cfg=p.cfg,
        merge=Ranks(comm),
    )
    return {**inputs, "samples": samples}


def whole_plan(comm: Any, p: RankPlan, dropped: list[dict[str, Any]]) -> PlanArrays | None:
    """On rank 0, the plan's micro-batch and step columns (no samples); ``None`` elsewhere."""
    per_micro = ("step", "rank", "micro_index") + (() if p.warmup is None else ("warmup",))
    per_micro += () if p.pad_rows is None else ("pad_rows",)
    mine = [
        {
            **{k: getattr(p, k)[s] for k in per_micro},
            **{f: getattr(p.micro, f)[s] for f in Micro._fields},
        }
        for s in epoch_slices(p)
    ]
    got = comm.gather((mine, p.oversize_alone), root=0)
    if got is None:
        return None
    order = [part[0][e] for e in range(len(p.epochs)) for part in got]

    def column(name: str) -> np.ndarray:
        return np.concatenate([o[name] for o in order])

    none = np.zeros(0, np.int64)
    return PlanArrays(
        cfg=p.cfg,
        ids=none,
        lens=none,
        stream=none,
        offsets=none,
        micro=Micro(*(column(f) for f in Micro._fields)),
        step=column("step"),
        rank=column("rank"),
        micro_index=column("micro_index"),
        step_tokens=p.step_tokens,
        step_samples=p.step_samples,
        lr=p.lr,
        warmup=None if p.warmup is None else column("warmup"),
        pad_rows=None if p.pad_rows is None else column("pad_rows"),
        lengths=p.lengths,
        epochs=p.epochs,
        dropped=dropped,
        oversize_alone=[i for part in got for i in part[1]],
        notes=p.notes,
    )
