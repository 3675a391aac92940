"""Cost models: what a sample and a micro-batch cost, for balancing ranks and scoring plans.

Chosen by name from :data:`COST_MODELS`:

* ``tokens`` — real tokens (sum of lengths); padding is free (a varlen kernel skips it).
* ``padded`` — tokens the model processes: the micro-batch volume (``B x T`` padded, the packed
  total in the packed layout).
* ``flops`` — per sample ``layers * (20 h^2 S + 4 h h_kv S + 4 h S^2)`` (Skrull's estimate: linear
  layers grow with S, attention with S^2). Packed: the samples' FLOPs plus the linear part for the
  pad tokens; padded: every row costs ``flops(T)``.
* ``time`` — seconds, ``a * flops + b`` (``flops`` as above, ``b`` once per micro-batch), with
  ``(a, b)`` measured by ``varpack calibrate``.

The *ideal* of a plan is the cost of its real samples alone, ``sum(sample_cost) / dp``: the time a
perfectly balanced, padding-free schedule would take. Plans are scored against it.

The functions take a :class:`CostModel` (the kind, the layout and the model dimensions), never
the whole plan config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from varpack.plan.models import ModelDims
from varpack.plan.rules import LAYOUT_CODE, PADDED, volume


@dataclass(frozen=True)
class CostModel:
    """A cost model: its ``kind`` (a key of :data:`COST_MODELS`), the layout, model dimensions."""

    kind: str = "tokens"
    layout: str = "packed"
    dims: ModelDims | None = None  # required by "flops" and "time"
    time: tuple[float, float] | None = None  # (a, b) of "time": seconds = a * flops + b

    def __post_init__(self) -> None:
        if self.kind not in COST_MODELS:
            raise ValueError(f"unknown cost model {self.kind!r}; known: {sorted(COST_MODELS)}")
        if self.kind in ("flops", "time") and self.dims is None:
            raise ValueError(f"the {self.kind} cost model needs model dimensions")
        if self.kind == "time" and self.time is None:
            raise ValueError("the time cost model needs (seconds per FLOP, fixed seconds)")

    @property
    def model_dims(self) -> ModelDims:
        assert self.dims is not None
        return self.dims


def linear_flops_per_token(dims: ModelDims) -> float:
    """FLOPs per token of the parts that grow linearly with the sequence."""
    h = float(dims.hidden)
    return dims.layers * (20.0 * h * h + 4.0 * h * dims.kv_hidden)


def cost_coefficients(model: CostModel) -> tuple[float, float]:
    """``(lin, quad)`` with a sample of ``x`` tokens costing ``lin * x + quad * x^2`` alone.

    >>> cost_coefficients(CostModel("tokens"))
    (1.0, 0.0)
    """
    if model.kind not in ("flops", "time"):  # tokens, and padded: the length
        return 1.0, 0.0
    dims = model.model_dims
    scale = 1.0 if model.time is None else model.time[0]  # time: seconds per FLOP (the fixed
    # seconds per micro-batch are the same on every rank of a step: they do not move the balance)
    return scale * linear_flops_per_token(dims), scale * dims.layers * 4.0 * dims.hidden


def sample_flops(lens: np.ndarray, dims: ModelDims) -> np.ndarray:
    """FLOPs of each sample run alone (float64).

    >>> sample_flops(np.array([1, 2]), ModelDims(1, 1, 1)).tolist()
    [28.0, 64.0]
    """
    s = np.asarray(lens, dtype=np.float64)
    return linear_flops_per_token(dims) * s + dims.layers * 4.0 * dims.hidden * s * s


def micro_volume(count: np.ndarray, padded_len: np.ndarray, layout: str) -> np.ndarray:
    """Tokens the model processes for each micro-batch (``rules.volume`` of its shape)."""
    return volume(count, padded_len, LAYOUT_CODE[layout])


def _length_cost(lens: np.ndarray, model: CostModel) -> np.ndarray:
    return np.asarray(lens, dtype=np.float64)


def _flops_cost(lens: np.ndarray, model: CostModel) -> np.ndarray:
    return sample_flops(lens, model.model_dims)


def _tokens_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    return np.asarray(tokens, dtype=np.float64)


def _padded_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    return micro_volume(count, padded_len, m.layout).astype(np.float64)


def _time_cost(lens: np.ndarray, model: CostModel) -> np.ndarray:
    assert model.time is not None
    return model.time[0] * sample_flops(lens, model.model_dims)


def _time_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    # flops_sum holds the samples' time (a * flops): the same shape as flops, scaled
    assert m.time is not None
    a, b = m.time
    linear = a * linear_flops_per_token(m.model_dims)
    if LAYOUT_CODE[m.layout] == PADDED:
        return count * a * sample_flops(padded_len, m.model_dims) + b
    return flops_sum + linear * (padded_len - tokens) + b


def _flops_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    if LAYOUT_CODE[m.layout] == PADDED:
        return count * sample_flops(padded_len, m.model_dims)
    assert flops_sum is not None
    return flops_sum + linear_flops_per_token(m.model_dims) * (padded_len - tokens)


class _Kind(NamedTuple):
    sample: Callable[[np.ndarray, CostModel], np.ndarray]
    micro: Callable[..., np.ndarray]
    needs_sample_sums: bool  # micro() needs the sum of the samples' own costs (packed flops)


#: cost model name -> its sample cost and micro-batch cost
COST_MODELS: dict[str, _Kind] = {
    "tokens": _Kind(_length_cost, _tokens_micro, False),
    "padded": _Kind(_length_cost, _padded_micro, False),
    "flops": _Kind(_flops_cost, _flops_micro, True),
    "time": _Kind(_time_cost, _time_micro, True),
}


def sample_cost(lens: np.ndarray, model: CostModel) -> np.ndarray:
    """Cost of each sample alone, unpadded (the ideal's unit).

    >>> sample_cost(np.array([2, 3]), CostModel()).tolist()
    [2.0, 3.0]
    """
    return COST_MODELS[model.kind].sample(lens, model)


_PIECE = 1 << 18  # samples per piece of the chunked cost sums (small temporaries, reused)


def segment_cost_sums(offsets: np.ndarray, lens: np.ndarray, model: CostModel) -> np.ndarray:
    """``segment_sums(offsets, sample_cost(lens, model))``, in pieces of whole segments.

    The same numbers (each segment is summed on its own), without full-size float temporaries.

    >>> segment_cost_sums(np.array([0, 2, 3]), np.array([1, 2, 3]), CostModel()).tolist()
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
        out[i:j] = np.add.reduceat(sample_cost(lens[a:b], model), offsets[i:j] - a)
        i = j
    return out


def micro_cost(
    count: np.ndarray,
    tokens: np.ndarray,
    padded_len: np.ndarray,
    flops_sum: np.ndarray | None,
    model: CostModel,
) -> np.ndarray:
    """Cost of each micro-batch (float64); ``flops_sum`` is needed where the kind says so.

    >>> micro_cost(np.array([2]), np.array([10]), np.array([8]), None, CostModel("tokens", "padded")).tolist()
    [10.0]
    >>> micro_cost(np.array([2]), np.array([10]), np.array([8]), None, CostModel("padded", "padded")).tolist()
    [16.0]
    """
    return COST_MODELS[model.kind].micro(count, tokens, padded_len, flops_sum, model)
