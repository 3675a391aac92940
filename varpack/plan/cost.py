"""Cost models: what a sample and a micro-batch cost, for balancing ranks and scoring plans.

Chosen by name from :data:`COST_MODELS`:

* ``tokens`` — real tokens (sum of lengths); padding is free (a varlen kernel skips it).
* ``padded`` — tokens the model processes: the micro-batch volume (``B x T`` padded, the packed
  total in the packed layout).
* ``flops`` — the training FLOPs of each sample alone: with a model (:class:`ModelSpec`, read
  from its config.json or a preset) 3 x its forward, every matmul and causal attention over
  each layer's window (:mod:`varpack.plan.models.flops`); with dimensions only (``--hidden
  --kv-hidden --layers``) Skrull's approximation ``layers * (20 h^2 S + 4 h h_kv S + 4 h S^2)``.
  Packed: the samples' FLOPs plus the linear part for the pad tokens; padded: every row costs
  ``flops(T)``.
* ``time`` — seconds, ``a * flops + b`` (``flops`` as above, ``b`` once per micro-batch), with
  ``(a, b)`` measured by ``varpack calibrate``; or, with a model, the four-term model of
  :mod:`varpack.plan.timefit` (``terms``): a sample costs ``a_lin * linear + a_attn * attention +
  c``, a packed micro-batch its samples plus ``a_lin`` times the linear FLOPs of its pad tokens
  plus ``b``, a padded one ``count`` samples of ``T`` tokens plus ``b``. The composer prices
  samples by the quadratic of the FLOP terms (``c`` and ``b`` as ``b`` is: left out of the
  balance); everything summed or scored counts all four.

The *ideal* of a plan is the cost of its real samples alone, ``sum(sample_cost) / dp``: the time a
perfectly balanced, padding-free schedule would take. Plans are scored against it.

The composer's kernels price a sample of ``x`` tokens as ``lin * x + quad * x^2``
(:func:`cost_coefficients`). That is exact for ``tokens`` and ``padded``, for Skrull's formula and
for a model without sliding windows (causal attention is ``2 q_dim L (S^2 + S)``). A window makes
the attention of a layer grow linearly past it: there the composer prices samples by the
quadratic closest to the exact cost over the lengths a micro-batch holds (:func:`window_fit`),
while everything that sums or scores costs (micro-batch costs, the assignment of micro-batches
to ranks, slot order, the ideal, ``time_vs_ideal``, ``validate``) uses the exact per-sample
cost, and the time bound prices only its over-estimated light tokens by a quadratic, the exact
cost's upper bound (:func:`bound_coefficients`).

The functions take a :class:`CostModel` (the kind, the layout and the model), never the whole
plan config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from varpack.plan.models import ModelDims, ModelSpec
from varpack.plan.models.flops import (
    TRAIN_PASSES,
    full_attention_coefficients,
    linear_per_token,
    sample_train_flops,
    train_flops,
)
from varpack.plan.rules import LAYOUT_CODE, PADDED, volume


@dataclass(frozen=True)
class CostModel:
    """A cost model: its ``kind`` (a key of :data:`COST_MODELS`), the layout, and for ``flops``
    and ``time`` the model (``spec``) or Skrull's dimensions (``dims``); ``span``: the longest
    sample a micro-batch holds (the range :func:`window_fit` fits, for a model with windows)."""

    kind: str = "tokens"
    layout: str = "packed"
    dims: ModelDims | None = None  # Skrull's dimensions ("flops" and "time" without a model)
    time: tuple[float, float] | None = None  # (a, b) of "time": seconds = a * flops + b
    spec: ModelSpec | None = None  # the model ("flops" and "time")
    span: int | None = None
    terms: tuple[float, float, float, float] | None = None  # "time": (a_lin, a_attn, c, b)

    def __post_init__(self) -> None:
        if self.kind not in COST_MODELS:
            raise ValueError(f"unknown cost model {self.kind!r}; known: {sorted(COST_MODELS)}")
        if self.kind in ("flops", "time") and (self.dims is None) == (self.spec is None):
            raise ValueError(f"the {self.kind} cost model needs a model or its dimensions")
        if self.kind == "time" and (self.time is None) == (self.terms is None):
            raise ValueError("the time cost model needs (seconds per FLOP, fixed seconds)")
        if self.terms is not None and self.spec is None:
            raise ValueError("the four-term time model needs a model (its linear FLOPs)")

    @property
    def model_dims(self) -> ModelDims:
        assert self.dims is not None
        return self.dims


def linear_flops_per_token(dims: ModelDims) -> float:
    """FLOPs per token of the parts that grow linearly with the sequence (Skrull's)."""
    h = float(dims.hidden)
    return dims.layers * (20.0 * h * h + 4.0 * h * dims.kv_hidden)


def cost_coefficients(model: CostModel) -> tuple[float, float]:
    """``(lin, quad)`` with a sample of ``x`` tokens costing ``lin * x + quad * x^2`` alone (for
    a model with windows, the closest such quadratic over ``1 .. span``: :func:`window_fit`).

    >>> cost_coefficients(CostModel("tokens"))
    (1.0, 0.0)
    """
    if model.kind not in ("flops", "time"):  # tokens, and padded: the length
        return 1.0, 0.0
    if model.terms is not None:
        assert model.spec is not None
        return window_fit(model.spec, model.span, model.terms[:2])
    scale = 1.0 if model.time is None else model.time[0]  # time: seconds per FLOP (the fixed
    # seconds per micro-batch are the same on every rank of a step: they do not move the balance)
    if model.spec is not None:
        lin, quad = window_fit(model.spec, model.span)
        return scale * lin, scale * quad
    dims = model.model_dims
    return scale * linear_flops_per_token(dims), scale * dims.layers * 4.0 * dims.hidden


def bound_coefficients(model: CostModel) -> tuple[float, float]:
    """``(lin, quad)`` whose quadratic is at least every sample's cost, and its cost per token
    at least theirs at every length: :func:`cost_coefficients` where that is exact, else (a
    model with windows) the cost as if no layer had one."""
    if model.terms is not None:  # the FLOP terms without windows, c per token (x >= 1)
        lin, quad = _terms_full(model.spec, model.terms[:2])  # type: ignore[arg-type]
        return lin + model.terms[2], quad
    if model.spec is None or all(w is None for w in model.spec.windows):
        return cost_coefficients(model)
    scale = 1.0 if model.time is None else model.time[0]
    lin, quad = full_attention_coefficients(model.spec)
    return scale * lin, scale * quad


def bound_pricing(model: CostModel) -> dict[str, Any]:
    """The time bound's ``coeffs`` and ``exact`` (:func:`varpack.plan.figures.bound.time_bound`):
    the quadratic alone where it is exact, else its upper bound and the exact sample cost."""
    if exact_quadratic(model):
        return {"coeffs": cost_coefficients(model), "exact": None}
    return {"coeffs": bound_coefficients(model), "exact": lambda x: sample_cost(x, model)}


def exact_quadratic(model: CostModel) -> bool:
    """Whether ``lin * x + quad * x^2`` (:func:`cost_coefficients`) is every sample's cost."""
    spec = model.spec
    if model.terms is not None and model.terms[2] > 0:  # c per sample: no quadratic has it
        return False
    return spec is None or model.kind not in ("flops", "time") or _windows_beyond(spec, model.span)


def _windows_beyond(spec: ModelSpec, span: int | None) -> bool:
    return all(w is None or (span is not None and w >= span) for w in spec.windows)


#: lengths the quadratic of a model with windows is fitted at (evenly spread up to the span)
FIT_POINTS = 256
#: the span fitted when a plan has no token budget
FIT_SPAN = 131072


def _terms_full(spec: ModelSpec, weights: tuple[float, float]) -> tuple[float, float]:
    """``full_attention_coefficients`` with the linear FLOPs weighted by ``weights[0]`` and the
    attention FLOPs by ``weights[1]``."""
    lin, quad = full_attention_coefficients(spec)
    per_token = float(TRAIN_PASSES * linear_per_token(spec))
    return weights[0] * per_token + weights[1] * (lin - per_token), weights[1] * quad


def window_fit(
    spec: ModelSpec, span: int | None, weights: tuple[float, float] | None = None
) -> tuple[float, float]:
    """``(lin, quad)``: exact when no window is shorter than ``span``; else the non-negative
    least-squares fit, in relative error, of the training FLOPs at :data:`FIT_POINTS` lengths
    evenly spread over ``(0, span]`` (the lengths that carry a micro-batch's tokens).
    ``weights``: ``(a_lin, a_attn)``, the cost is ``a_lin * linear + a_attn * attention``
    (the four-term time model's FLOP terms) instead of the FLOPs.

    A sum in a fixed order of Python floats, so the fit is the same on every machine.

    >>> from varpack.plan.models import preset_spec
    >>> lin, quad = window_fit(preset_spec("mistral-7b-v0.1"), 32768)
    >>> s = np.array([8192.0, 32768.0])
    >>> err = (lin * s + quad * s * s) / sample_train_flops(s, preset_spec("mistral-7b-v0.1")) - 1
    >>> bool(abs(err).max() < 0.03)
    True
    """
    if _windows_beyond(spec, span):
        return full_attention_coefficients(spec) if weights is None else _terms_full(spec, weights)
    top = FIT_SPAN if span is None else span
    s = [max(1.0, float(round(top * (i + 1) / FIT_POINTS))) for i in range(FIT_POINTS)]
    if weights is None:
        c = [float(v) for v in sample_train_flops(np.array(s), spec, TRAIN_PASSES)]
    else:
        f = train_flops(np.array(s), spec, TRAIN_PASSES)
        c = [float(v) for v in weights[0] * f.linear + weights[1] * f.attention]
    # minimise sum ((lin s + quad s^2) / c - 1)^2: normal equations of a = s/c, b = s^2/c
    a = [x / y for x, y in zip(s, c, strict=True)]
    b = [x * x / y for x, y in zip(s, c, strict=True)]
    aa, bb = math.fsum(x * x for x in a), math.fsum(x * x for x in b)
    ab = math.fsum(x * y for x, y in zip(a, b, strict=True))
    a1, b1 = math.fsum(a), math.fsum(b)
    det = aa * bb - ab * ab
    lin, quad = (a1 * bb - b1 * ab) / det, (b1 * aa - a1 * ab) / det
    if quad < 0:  # never for a causal model; kept non-negative as the kernels need
        return a1 / aa, 0.0
    if lin < 0:
        return 0.0, b1 / bb
    return lin, quad


def pad_token_cost(model: CostModel) -> float:
    """The FLOPs of one pad token of a packed row: its linear part (of ``flops`` and ``time``)."""
    if model.spec is not None:
        return float(TRAIN_PASSES * linear_per_token(model.spec))
    return linear_flops_per_token(model.model_dims)


def model_flops(lens: np.ndarray, model: CostModel) -> np.ndarray:
    """Training FLOPs of each sample alone under ``model``'s spec or dimensions (float64)."""
    if model.spec is not None:
        return sample_train_flops(lens, model.spec)
    return sample_flops(lens, model.model_dims)


def sample_flops(lens: np.ndarray, dims: ModelDims) -> np.ndarray:
    """FLOPs of each sample run alone under Skrull's approximation (float64).

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
    return model_flops(lens, model)


def _tokens_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    return np.asarray(tokens, dtype=np.float64)


def _padded_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    return micro_volume(count, padded_len, m.layout).astype(np.float64)


def _time_cost(lens: np.ndarray, model: CostModel) -> np.ndarray:
    if model.terms is not None:
        assert model.spec is not None
        a_lin, a_attn, c, _ = model.terms
        f = train_flops(lens, model.spec)
        return a_lin * f.linear + a_attn * f.attention + c
    assert model.time is not None
    return model.time[0] * model_flops(lens, model)


def time_scale(model: CostModel) -> tuple[float, float]:
    """``(seconds per linear FLOP, seconds per micro-batch)`` of ``time`` (``(1, 0)`` else): what
    a pad token's linear FLOPs and the micro-batch itself cost."""
    if model.terms is not None:
        return model.terms[0], model.terms[3]
    return model.time if model.time is not None else (1.0, 0.0)


def _time_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    # flops_sum holds the samples' time (a * flops): the same shape as flops, scaled
    a, b = time_scale(m)
    linear = a * pad_token_cost(m)
    if LAYOUT_CODE[m.layout] == PADDED:
        if m.terms is not None:
            return count * _time_cost(padded_len, m) + b
        return count * a * model_flops(padded_len, m) + b
    return flops_sum + linear * (padded_len - tokens) + b


def _flops_micro(
    count: np.ndarray, tokens: np.ndarray, padded_len: np.ndarray, flops_sum: Any, m: CostModel
) -> np.ndarray:
    if LAYOUT_CODE[m.layout] == PADDED:
        return count * model_flops(padded_len, m)
    assert flops_sum is not None
    return flops_sum + pad_token_cost(m) * (padded_len - tokens)


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
