"""Cost and memory of a context-parallel micro-batch, from its samples' CP placement.

Per CP rank ``j`` of a micro-batch (Skrull's DACP model):

``time_j = max(comm, compute(local_j)) + compute(distributed) / N``

The K/V all-gather of the distributed samples (``comm``) overlaps the compute of the rank's
local samples; the distributed samples' shares are computed after it. The micro-batch takes its
slowest CP rank, plus the time model's fixed part ``b``. ``compute`` is the cost model's sample
cost (tokens, FLOPs or seconds, ``lin * S + quad * S^2``: :func:`~varpack.plan.cost.cost_coefficients`,
the closest quadratic for a model with sliding windows); ``comm`` is priced only with
``--cost time`` and ``--comm-bytes-per-s``: ``latency + (N-1)/N * tokens * kv_bytes / bw`` with
``kv_bytes = 2 (K and V) * kv_hidden * layers * 2 bytes`` (bf16) per token (``kv_hidden``: kv
heads x head_dim).

Memory: a CP rank holds ``local_j + distributed / N`` tokens, at most the bucket size C; it is
kept scaled by N (``N * local_j + distributed``, integers) so that the rule is exact. The
planner (to balance ranks and score the plan) and ``validate`` (from the manifests) both call
:func:`cp_load`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from varpack.plan.cost import cost_coefficients

KV_ELEMENT_BYTES = 2  # bf16 K and V


@dataclass(frozen=True)
class CPModel:
    """What prices a CP micro-batch: the group, its bucket, compute, fixed time and the link."""

    n: int
    bucket: int
    lin: float = 1.0  # compute per token (cost units)
    quad: float = 0.0  # compute per token squared (attention)
    fixed: float = 0.0  # per micro-batch (the time model's b)
    comm_bw: float | None = None  # bytes per second
    comm_latency: float = 0.0
    kv_bytes: float = 0.0  # K/V bytes per token


def cp_model(cfg: Any) -> CPModel:
    """The CP model of a resolved :class:`~varpack.plan.config.PlanConfig` with ``--cp``."""
    bucket = cfg.bucket()
    assert bucket is not None
    if cfg.cost not in ("flops", "time"):
        return CPModel(cfg.cp, bucket)
    model = cfg.cost_model()
    _, fixed = cfg.time_model() or (1.0, 0.0)
    lin, quad = cost_coefficients(model)
    if model.spec is not None:
        kv_width, layers = model.spec.kv_dim, model.spec.layers
    else:
        kv_width, layers = model.model_dims.kv_hidden, model.model_dims.layers
    return CPModel(
        cfg.cp,
        bucket,
        lin=lin,
        quad=quad,
        fixed=fixed,
        comm_bw=cfg.comm_bytes_per_s,
        comm_latency=float(cfg.comm_latency or 0.0),
        kv_bytes=2.0 * KV_ELEMENT_BYTES * kv_width * layers,
    )


class CPLoad(NamedTuple):
    """Per micro-batch: its time (slowest CP rank), and per (micro-batch, CP rank) loads."""

    cost: np.ndarray  # float64 (m,)
    compute: np.ndarray  # float64 (m, n): each CP rank's time before the fixed part
    memory: np.ndarray  # int64 (m, n): N * local tokens + distributed tokens (<= N * C)
    distributed: np.ndarray  # int64 (m,): distributed samples


def cp_load(offsets: np.ndarray, lens: np.ndarray, placement: np.ndarray, model: CPModel) -> CPLoad:
    """Time and memory of every micro-batch of a placed stream (vectorised).

    >>> load = cp_load(np.array([0, 3]), np.array([1, 1, 6]), np.array([0, 1, -1]), CPModel(2, 4))
    >>> load.cost.tolist(), load.memory.tolist()
    ([4.0], [[8, 8]])
    """
    n, m = model.n, len(offsets) - 1
    mb = np.repeat(np.arange(m, dtype=np.int64), np.diff(offsets))
    s = np.asarray(lens, dtype=np.float64)
    c = model.lin * s + model.quad * s * s
    dist = np.asarray(placement) < 0
    key = (mb * n + np.asarray(placement, dtype=np.int64))[~dist]
    local_cost = np.bincount(key, weights=c[~dist], minlength=m * n).reshape(m, n)
    local_tok = np.bincount(key, weights=s[~dist], minlength=m * n).reshape(m, n)
    dist_cost = np.bincount(mb[dist], weights=c[dist], minlength=m) / n
    dist_tok = np.bincount(mb[dist], weights=s[dist], minlength=m)
    comm = np.zeros(m)
    if model.comm_bw is not None:
        volume = dist_tok * (n - 1) / n * model.kv_bytes
        comm = np.where(dist_tok > 0, model.comm_latency + volume / model.comm_bw, 0.0)
    compute = np.maximum(comm[:, None], local_cost) + dist_cost[:, None]
    memory = (n * local_tok + dist_tok[:, None]).round().astype(np.int64)
    return CPLoad(
        cost=compute.max(axis=1) + model.fixed,
        compute=compute,
        memory=memory,
        distributed=np.bincount(mb[dist], minlength=m).astype(np.int64),
    )


def over_capacity(load: CPLoad, model: CPModel) -> np.ndarray:
    """Indices of micro-batches with a CP rank over the bucket size."""
    return np.flatnonzero((load.memory > model.n * model.bucket).any(axis=1))
