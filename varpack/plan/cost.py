"""Cost models: what a sample and a micro-batch cost, for balancing ranks and scoring plans.

* ``tokens`` — real tokens (sum of lengths); padding is free (a varlen kernel skips it).
* ``padded`` — tokens the model processes: the micro-batch volume (``B x T`` padded, the packed
  total in the packed layout).
* ``flops`` — per sample ``layers * (20 h^2 S + 4 h h_kv S + 4 h S^2)`` (Skrull's estimate: linear
  layers grow with S, attention with S^2). Packed: the samples' FLOPs plus the linear part for the
  pad tokens; padded: every row costs ``flops(T)``.

The *ideal* of a plan is the cost of its real samples alone, ``sum(sample_cost) / dp``: the time a
perfectly balanced, padding-free schedule would take. Plans are scored against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from varpack.plan.rules import LAYOUT_CODE, PADDED, volume

if TYPE_CHECKING:
    from varpack.plan.config import PlanConfig


@dataclass(frozen=True)
class ModelDims:
    """Transformer dimensions used by the FLOPs model (kv_hidden = kv heads x head dim)."""

    hidden: int
    kv_hidden: int
    layers: int


#: Real model configurations (from their published config.json files).
PRESETS: dict[str, ModelDims] = {
    "qwen2.5-0.5b": ModelDims(hidden=896, kv_hidden=128, layers=24),
    "qwen2.5-1.5b": ModelDims(hidden=1536, kv_hidden=256, layers=28),
    "qwen2.5-7b": ModelDims(hidden=3584, kv_hidden=512, layers=28),
    "llama-3-8b": ModelDims(hidden=4096, kv_hidden=1024, layers=32),
    "llama-3-70b": ModelDims(hidden=8192, kv_hidden=1024, layers=80),
}


def model_dims(cfg: PlanConfig) -> ModelDims:
    assert cfg.hidden is not None and cfg.kv_hidden is not None and cfg.layers is not None
    return ModelDims(cfg.hidden, cfg.kv_hidden, cfg.layers)


def linear_flops_per_token(dims: ModelDims) -> float:
    """FLOPs per token of the parts that grow linearly with the sequence."""
    h = float(dims.hidden)
    return dims.layers * (20.0 * h * h + 4.0 * h * dims.kv_hidden)


def sample_flops(lens: np.ndarray, dims: ModelDims) -> np.ndarray:
    """FLOPs of each sample run alone (float64).

    >>> sample_flops(np.array([1, 2]), ModelDims(1, 1, 1)).tolist()
    [28.0, 64.0]
    """
    s = np.asarray(lens, dtype=np.float64)
    return linear_flops_per_token(dims) * s + dims.layers * 4.0 * dims.hidden * s * s


def sample_cost(lens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Cost of each sample alone, unpadded (the ideal's unit)."""
    if cfg.cost == "flops":
        return sample_flops(lens, model_dims(cfg))
    return np.asarray(lens, dtype=np.float64)


_PIECE = 1 << 18  # samples per piece of the chunked cost sums (small temporaries, reused)


def segment_cost_sums(offsets: np.ndarray, lens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """``segment_sums(offsets, sample_cost(lens, cfg))``, in pieces of whole segments.

    The same numbers (each segment is summed on its own), without full-size float temporaries.

    >>> from varpack.plan.config import PlanConfig
    >>> segment_cost_sums(np.array([0, 2, 3]), np.array([1, 2, 3]), PlanConfig(max_tokens=8)).tolist()
    [3.0, 3.0]
    """
    m = len(offsets) - 1
    if m <= 0:
        return np.zeros(0, dtype=np.float64)
    out = np.empty(m, dtype=np.float64)
    i = 0
    while i < m:
        j = int(np.searchsorted(offsets, offsets[i] + _PIECE, side="right")) - 1
        j = min(max(j, i + 1), m)
        a = int(offsets[i])
        b = int(offsets[j]) if j < m else len(lens)  # the last segment runs to the end
        out[i:j] = np.add.reduceat(sample_cost(lens[a:b], cfg), offsets[i:j] - a)
        i = j
    return out


def micro_volume(count: np.ndarray, padded_len: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    return volume(count, padded_len, LAYOUT_CODE[cfg.layout])


def micro_cost(
    count: np.ndarray,
    tokens: np.ndarray,
    padded_len: np.ndarray,
    flops_sum: np.ndarray | None,
    cfg: PlanConfig,
) -> np.ndarray:
    """Cost of each micro-batch under ``cfg.cost`` (float64); ``flops_sum`` needed for flops.

    >>> from varpack.plan.config import PlanConfig
    >>> cfg = PlanConfig(max_tokens=64, layout="padded")
    >>> micro_cost(np.array([2]), np.array([10]), np.array([8]), None, cfg).tolist()
    [10.0]
    """
    if cfg.cost == "tokens":
        return np.asarray(tokens, dtype=np.float64)
    if cfg.cost == "padded":
        return micro_volume(count, padded_len, cfg).astype(np.float64)
    dims = model_dims(cfg)
    if LAYOUT_CODE[cfg.layout] == PADDED:
        return count * sample_flops(padded_len, dims)
    assert flops_sum is not None
    return flops_sum + linear_flops_per_token(dims) * (padded_len - tokens)
