"""Orchestration: sorted lengths in, per-rank manifest tables and plan.json's content out.

Pure: arrays and a config in, arrays and dicts out; reading the input and writing the plan live in
:mod:`varpack.cli.plan` and :mod:`varpack.manifest`. The steps, each its own module:

1. drop / isolate / reject samples over the budget (:func:`pack.oversize_mask`);
2. per epoch, the stream order (:mod:`order`): curriculum, or shuffled and sorted in windows;
3. micro-batches (:func:`pack.pack`), completed to a multiple of ``dp x grad_accum`` by splitting
   the costliest ones (:func:`pack.complete`);
4. steps (:mod:`assign`): consecutive micro-batches of the stream;
5. ranks: each step's micro-batches balanced over the ranks, ``grad_accum`` each;
6. global tokens / samples and the LR factor of every step (:mod:`lr`); stats (:mod:`stats`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from varpack.errors import ConfigError, InputError
from varpack.fingerprint import fingerprint
from varpack.plan import assign, order, pack
from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_cost
from varpack.plan.lr import lr_factors
from varpack.plan.stats import chunked_sum, plan_stats, rank_shapes
from varpack.plan.tables import rank_tables

_SHOW_IDS = 5


@dataclass
class PlanArrays:
    """A plan as arrays: the sample stream and per micro-batch / per step columns."""

    cfg: PlanConfig
    ids: np.ndarray  # kept samples (input order)
    lens: np.ndarray
    stream: np.ndarray  # stream position -> row of ids/lens (all epochs)
    offsets: np.ndarray  # micro-batch i = stream[offsets[i]:offsets[i+1]]
    micro: pack.Micro
    step: np.ndarray
    rank: np.ndarray
    micro_index: np.ndarray
    step_tokens: np.ndarray
    step_samples: np.ndarray
    lr: np.ndarray
    epochs: list[dict[str, int]]
    dropped: list[dict[str, Any]] = field(default_factory=list)
    oversize_alone: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.lr)

    def tables(self) -> Iterator[pa.Table]:
        return rank_tables(
            stream=self.stream,
            ids=self.ids,
            lens=self.lens,
            offsets=self.offsets,
            step=self.step,
            rank=self.rank,
            micro=self.micro_index,
            pad_to=self.micro.pad_to,
            lr=self.lr,
            step_tokens=self.step_tokens,
            step_samples=self.step_samples,
            dp=self.cfg.dp,
        )


def _check_input(ids: np.ndarray, lens: np.ndarray) -> None:
    if len(ids) == 0:
        raise InputError("the input holds no samples; nothing to plan")
    if len(ids) != len(lens):
        raise InputError(f"{len(ids)} sample ids but {len(lens)} lengths")
    if lens.min() <= 0:
        raise InputError(
            f"sample_id {int(ids[np.argmin(lens)])}: non-positive seq_len; lengths must be > 0"
        )
    if lens.max() > np.iinfo(np.int32).max:
        raise InputError(
            f"sample_id {int(ids[np.argmax(lens)])}: seq_len does not fit int32 (manifest type)"
        )


def _oversize(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> tuple[np.ndarray, np.ndarray]:
    """(keep mask, alone mask over kept samples); raises for ``--oversize error``."""
    over = pack.oversize_mask(lens, cfg)
    if not over.any():
        return np.ones(len(ids), dtype=bool), np.zeros(len(ids), dtype=bool)
    if cfg.oversize == "error":
        where = np.flatnonzero(over)
        shown = ", ".join(f"{int(ids[i])} ({int(lens[i])} tokens)" for i in where[:_SHOW_IDS])
        more = f" and {len(where) - _SHOW_IDS} more" if len(where) > _SHOW_IDS else ""
        raise ConfigError(
            f"{len(where)} samples do not fit --max-tokens {cfg.max_tokens} even alone: sample_id {shown}{more}; "
            "raise --max-tokens, or pass --oversize drop (skip them) or --oversize alone (own micro-batch)"
        )
    if cfg.oversize == "drop":
        return ~over, np.zeros(int((~over).sum()), dtype=bool)
    return np.ones(len(ids), dtype=bool), over


def plan_arrays(ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> PlanArrays:
    """Plan samples given in curriculum order (sorted); see the module doc."""
    cfg = cfg.resolved()
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    _check_input(ids, lens)
    keep, alone = _oversize(ids, lens, cfg)
    dropped: list[dict[str, Any]] = []
    if not keep.all():
        gone = np.flatnonzero(~keep)
        reason = f"oversize: longer than --max-tokens {cfg.max_tokens}"
        dropped = [
            {"sample_id": int(ids[i]), "seq_len": int(lens[i]), "reason": reason} for i in gone
        ]
        ids, lens = ids[keep], lens[keep]
    per_step = cfg.micro_per_step
    if len(ids) < per_step:
        raise ConfigError(
            f"{len(ids)} samples cannot fill one step of dp x grad_accum = {per_step} micro-batches "
            "(every rank needs grad_accum micro-batches per step); lower --dp or --grad-accum"
        )
    streams, offs, steps, epochs = [], [], [], []
    n_pos = 0
    n_steps = 0
    per_micro = None
    if cfg.order == "shuffle" and cfg.batching == "budget":  # how full sorted packing gets
        _, sorted_off = pack.pack(lens, np.array([0, len(lens)]), alone, cfg)
        per_micro = float(lens.sum()) / (len(sorted_off) - 1)
    for epoch in range(cfg.epochs):
        idx, bounds = order.epoch_stream(lens, cfg, epoch, per_micro)
        cap = per_step if cfg.order == "shuffle" else 0
        elens = lens[idx]
        perm, off = pack.pack(elens, bounds, alone[idx], cfg, cap)
        if perm is not None:
            idx, elens = idx[perm], elens[perm]
        off = pack.complete(
            off, elens, per_step, lambda o, v: pack.summarize(o, v, cfg).cost, f"epoch {epoch}"
        )
        m = len(off) - 1
        st = assign.steps_in_order(m, per_step)
        del elens
        streams.append(idx)
        offs.append(off[:-1] + n_pos)
        steps.append(st + n_steps)
        epochs.append({"epoch": epoch, "first_step": n_steps, "num_steps": m // per_step})
        n_pos += len(idx)
        n_steps += m // per_step
    stream = streams[0] if len(streams) == 1 else np.concatenate(streams)
    offsets = np.append(np.concatenate(offs), n_pos)
    step = steps[0] if len(steps) == 1 else np.concatenate(steps)
    micro = pack.summarize(offsets, lens[stream], cfg)
    rank, micro_index = assign.balance_ranks(step, micro.cost, cfg.dp, cfg.grad_accum)
    step_samples = np.bincount(step, weights=micro.samples, minlength=n_steps).astype(np.int64)
    step_tokens = np.bincount(step, weights=micro.tokens, minlength=n_steps).astype(np.int64)
    kept_alone = ids[alone].tolist() if alone.any() else []
    return PlanArrays(
        cfg=cfg,
        ids=ids,
        lens=lens,
        stream=stream,
        offsets=offsets,
        micro=micro,
        step=step,
        rank=rank,
        micro_index=micro_index,
        step_tokens=step_tokens,
        step_samples=step_samples,
        lr=lr_factors(step_samples, step_tokens, cfg),
        epochs=epochs,
        dropped=dropped,
        oversize_alone=[int(i) for i in kept_alone],
    )


def plan_meta(
    p: PlanArrays, input_info: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """plan.json's content (without format/version/ranks) and each rank's extra entry (shapes)."""
    cfg = p.cfg
    shapes = rank_shapes(p.rank, p.micro.samples, p.micro.pad_to, cfg.layout, cfg.dp)
    stats = plan_stats(
        step=p.step,
        rank=p.rank,
        count=p.micro.samples,
        tokens=p.micro.tokens,
        padded_len=p.micro.pad_to,
        cost=p.micro.cost,
        sample_step=np.repeat(
            p.step.astype(np.int32 if p.num_steps < 2**31 else np.int64), p.micro.samples
        ),
        sample_len=p.lens[p.stream],
        ideal_cost=chunked_sum(p.lens, lambda x: sample_cost(x, cfg)) * cfg.epochs,
        lr=p.lr,
        step_samples=p.step_samples,
        step_tokens=p.step_tokens,
        num_steps=p.num_steps,
        dp=cfg.dp,
        layout=cfg.layout,
        shapes=shapes,
    )
    stats["cost"] = cfg.cost
    stats["dropped"] = len(p.dropped)
    stats["oversize_alone"] = p.oversize_alone
    meta = {
        "config": cfg.to_dict(),
        "input": input_info,
        "layout": {"dp": cfg.dp, "pp": 1, "cp": 1, "grad_accum": cfg.grad_accum},
        "num_steps": p.num_steps,
        "epochs": p.epochs,
        "stats": stats,
        "dropped": p.dropped,
    }
    return meta, [{"shapes": s} for s in shapes]


def input_info(ids: np.ndarray, lens: np.ndarray, source: str) -> dict[str, Any]:
    """plan.json ``input``: count, tokens and fingerprint of ALL input samples (dropped included)."""
    return {
        "num_samples": int(len(ids)),
        "total_tokens": int(np.asarray(lens, dtype=np.int64).sum()),
        "fingerprint": fingerprint(ids, lens).hex,
        "source": source,
    }


def make_plan(
    ids: np.ndarray, lens: np.ndarray, cfg: PlanConfig, source: str = ""
) -> tuple[PlanArrays, dict[str, Any], list[dict[str, Any]]]:
    """Plan and describe: ``(arrays, meta, rank_extra)``; write with ``manifest.write_plan``."""
    arrays = plan_arrays(ids, lens, cfg)
    meta, extra = plan_meta(arrays, input_info(ids, lens, source))
    return arrays, meta, extra
