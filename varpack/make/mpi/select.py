"""Stage 1 under MPI: the input checks and the oversize strategy over every rank's share.

Each rank checks and selects its own rows; what the one-process stage decides from the whole
input (the first offending sample a message names, how many there are, the lone samples' bound,
whether the kept samples fill a step) is decided from small gathered summaries, so the ranks
raise the one-process message, agreed, and keep the same samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.make.mpi.moves import Rows
from varpack.make.mpi.split import split_share
from varpack.plan import PlanConfig
from varpack.plan.oversize import check_alone
from varpack.plan.stages.select import (
    SHOW_IDS,
    check_fills_step,
    check_input,
    drop_reason,
    oversize,
    oversize_error,
)
from varpack.sort.agree import agree


def select_share(
    comm: Any, ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig
) -> tuple[Rows, PlanConfig, list[dict[str, Any]], list[str]]:
    """``(rows, cfg, dropped, notes)``: this rank's selected rows (``ids``, ``lens``, ``alone``),
    the resolved config, the dropped samples (rank 0; empty elsewhere) and the notes."""
    ends = comm.allgather(_ends(ids, lens))
    agree(comm, lambda: check_input(*_summary(ends)))
    top = max(int(e[1][-1]) for e in ends if len(e[1]))
    cfg = cfg.with_block_len(top)
    over = oversize(lens, cfg) if cfg.oversize != "split" else lens > (cfg.split_len or 0)
    firsts = comm.allgather((int(over.sum()), ids[over][:SHOW_IDS], lens[over][:SHOW_IDS]))
    count = sum(c for c, _, _ in firsts)
    alone = np.zeros(len(ids), dtype=bool)
    dropped: list[dict[str, Any]] = []
    notes: list[str] = []
    if count and cfg.oversize == "error":
        shown_ids = np.concatenate([i for _, i, _ in firsts])[:SHOW_IDS]
        shown_lens = np.concatenate([n for _, _, n in firsts])[:SHOW_IDS]

        def refuse() -> None:
            raise oversize_error(count, shown_ids, shown_lens, cfg)

        agree(comm, refuse)
    elif count and cfg.oversize == "drop":
        reason = drop_reason(cfg)
        mine = [{"sample_id": int(i), "seq_len": int(n), "reason": reason}
                for i, n in zip(ids[over], lens[over], strict=True)]  # fmt: skip
        dropped = [d for part in comm.gather(mine, root=0) or [] for d in part]
        ids, lens = ids[~over], lens[~over]
        alone = alone[~over]
    elif count and cfg.oversize == "split":
        assert cfg.split_len is not None
        rows = split_share(comm, {"ids": ids, "lens": lens, "alone": alone}, cfg.split_len)
        kept = comm.allreduce(len(rows["ids"]))
        agree(comm, lambda: check_fills_step(kept, cfg))
        return rows, cfg, dropped, notes
    elif count and cfg.oversize == "alone":
        both = comm.allgather((ids[over], lens[over]))
        lone_ids = np.concatenate([i for i, _ in both])
        lone_lens = np.concatenate([n for _, n in both])
        notes = agree(comm, lambda: check_alone(lone_ids, lone_lens, cfg))
        alone = over
    kept = comm.allreduce(len(ids))
    agree(comm, lambda: check_fills_step(kept, cfg))
    return {"ids": ids, "lens": lens, "alone": alone}, cfg, dropped, notes


def _ends(ids: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shortest and longest sample (first of each), as ``(ids, lens)``."""
    if len(lens) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(np.argmin(lens)), int(np.argmax(lens))
    return ids[[lo, hi]], lens[[lo, hi]]


def _summary(ends: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's ends in rank order: the first shortest and first longest sample of the
    whole input are the ones :func:`check_input` finds in it."""
    return np.concatenate([i for i, _ in ends]), np.concatenate([n for _, n in ends])
