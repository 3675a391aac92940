"""plan.json's content under MPI: rank 0 scores the plan from compact columns of every rank.

The stats are :func:`varpack.plan.figures.plan_json.plan_meta`'s, computed by the same function
on the same values in the same order as one process, so they match to the last bit: each rank
sends its micro-batches' figures (step, rank, shape, cost) epoch by epoch, rank 0 lays them out
epoch-major in rank order (the one process's order), takes the kept samples' lengths (the
curriculum stream is the input order); the per-step columns every rank holds whole
(:func:`.warmup.global_totals`). The input's count, tokens and fingerprint are summed over the
ranks' shares.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.fingerprint import Fingerprint, fingerprint
from varpack.manifest.mpi.local import epoch_slices
from varpack.plan import PlanArrays
from varpack.plan.figures.plan_json import plan_meta
from varpack.plan.kernels.micro import Micro

_PIECE = 1 << 20  # samples per piece of the input fingerprint (as one process)


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


def whole_plan(comm: Any, p: PlanArrays, dropped: list[dict[str, Any]]) -> PlanArrays | None:
    """On rank 0, the plan's arrays that plan.json's stats read (no sample ids); ``None``
    elsewhere."""
    per_micro = ("step", "rank", "micro_index") + (() if p.warmup is None else ("warmup",))
    mine = [
        {
            **{k: getattr(p, k)[s] for k in per_micro},
            **{f: getattr(p.micro, f)[s] for f in Micro._fields},
        }
        for s in epoch_slices(p)
    ]
    got = comm.gather((mine, p.lens, p.oversize_alone, p.group), root=0)
    if got is None:
        return None
    order = [part[0][e] for e in range(len(p.epochs)) for part in got]

    def column(name: str) -> np.ndarray:
        return np.concatenate([o[name] for o in order])

    lens = np.concatenate([part[1] for part in got])
    group = None if p.group is None else np.concatenate([part[3] for part in got])
    step = column("step")
    return PlanArrays(
        cfg=p.cfg,
        ids=np.zeros(0, np.int64),
        lens=lens,
        stream=np.zeros(0, np.int64),
        offsets=np.concatenate(([0], np.cumsum(column("samples")))),
        micro=Micro(*(column(f) for f in Micro._fields)),
        step=step,
        rank=column("rank"),
        micro_index=column("micro_index"),
        step_tokens=p.step_tokens,
        step_samples=p.step_samples,
        lr=p.lr,
        warmup=None if p.warmup is None else column("warmup"),
        epochs=p.epochs,
        dropped=dropped,
        oversize_alone=[i for part in got for i in part[2]],
        group=group,
        stream_lens=np.tile(lens, len(p.epochs)),
        notes=p.notes,
    )


def plan_json_meta(
    whole: PlanArrays, info: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """plan.json's content and each rank's extra entry, from rank 0's :func:`whole_plan`."""
    return plan_meta(whole, info, moved=False)
