"""The FLOPs of one sample of ``S`` tokens run alone through a model (:class:`ModelSpec`).

Forward, in two parts (2 FLOPs per multiply-add):

* **linear** ``= S x`` the matmul FLOPs of one token (:func:`linear_per_token`): per layer the
  q, k, v and o projections (``heads x head_dim`` queries, ``kv_heads x head_dim`` keys and
  values), the MLP (three matmuls when gated, two otherwise), or in a sparse layer the router,
  the ``experts_per_token`` experts each token visits and the shared expert with its gate; then
  the LM head over every position (``2 x hidden x vocab``), tied to the embedding or not. These
  are exactly the ``aten.mm`` / ``addmm`` / ``bmm`` that torch's ``FlopCounterMode`` counts for
  the transformers model's linear layers;
* **attention**, causal: the query at position ``i`` (1-based) of a layer with window ``w``
  attends ``min(i, w)`` keys, ``2 x q_dim`` FLOPs for the scores and as many for the weighted
  values; per layer ``4 x q_dim x sum_i min(i, w)``, in closed form.

Training counts ``passes`` forwards: 3 (forward and backward, the MFU convention), 4 with one
recomputed forward (activation checkpointing). Every function is vectorised over an array of
lengths (float64).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np

from varpack.plan.models.spec import ModelSpec

#: forward passes that one sample's training costs: forward + backward (the backward is twice)
TRAIN_PASSES = 3
#: the longest length :func:`crossover` looks at
CROSSOVER_LIMIT = 10_000_000


class Flops(NamedTuple):
    """FLOPs of each sample, by part (float64 arrays of the lengths' shape)."""

    linear: np.ndarray
    attention: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.linear + self.attention


def linear_per_token(spec: ModelSpec) -> int:
    """Forward matmul FLOPs of one token, every layer and the LM head (an exact integer).

    >>> linear_per_token(ModelSpec("llama", 64, 2, 4, 2, 16, 96, True, 100, (None, None)))
    135680
    """
    h = spec.hidden
    mats = 3 if spec.gated else 2
    attention = 2 * h * (2 * spec.q_dim + 2 * spec.kv_dim)
    dense = 2 * mats * h * spec.intermediate
    sparse = (
        2 * h * spec.experts  # the router
        + spec.experts_per_token * 2 * mats * h * spec.expert_intermediate
        + 2 * mats * h * spec.shared_intermediate
        + (2 * h if spec.shared_gate else 0)
    )
    n_sparse = len(spec.moe_layers)
    layers = spec.layers * attention + (spec.layers - n_sparse) * dense + n_sparse * sparse
    return layers + 2 * h * spec.vocab


def window_layers(spec: ModelSpec) -> list[tuple[int | None, int]]:
    """``(window, layers)`` for each distinct window, full attention (None) first.

    >>> window_layers(ModelSpec("gemma2", 8, 3, 2, 1, 4, 16, True, 10, (4, None, 4)))
    [(None, 1), (4, 2)]
    """
    counts = Counter(spec.windows)
    return sorted(counts.items(), key=lambda kv: -1 if kv[0] is None else kv[0])


def key_pairs(lens: np.ndarray, window: int | None) -> np.ndarray:
    """``sum_{i=1..S} min(i, window)`` for each length S: the (query, key) pairs of one head.

    >>> key_pairs(np.array([1, 3, 5]), None).tolist(), key_pairs(np.array([1, 3, 5]), 2).tolist()
    ([1.0, 6.0, 15.0], [1.0, 5.0, 9.0])
    """
    s = np.asarray(lens, dtype=np.float64)
    if window is None:
        return s * (s + 1.0) * 0.5
    w = float(window)
    m = np.minimum(s, w)
    return m * (m + 1.0) * 0.5 + (s - m) * w


def attention_flops(lens: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """Forward FLOPs of causal attention (scores and weighted values) for each length."""
    s = np.asarray(lens, dtype=np.float64)
    out = np.zeros(s.shape, dtype=np.float64)
    for window, n in window_layers(spec):
        out += n * key_pairs(s, window)
    return 4.0 * spec.q_dim * out


def forward_flops(lens: np.ndarray, spec: ModelSpec) -> Flops:
    """Forward FLOPs of each sample alone, linear and attention."""
    s = np.asarray(lens, dtype=np.float64)
    return Flops(float(linear_per_token(spec)) * s, attention_flops(s, spec))


def train_flops(lens: np.ndarray, spec: ModelSpec, passes: int = TRAIN_PASSES) -> Flops:
    """FLOPs of training on each sample alone: ``passes`` x the forward (3: fwd + bwd)."""
    f = forward_flops(lens, spec)
    return Flops(passes * f.linear, passes * f.attention)


def sample_train_flops(lens: np.ndarray, spec: ModelSpec, passes: int = TRAIN_PASSES) -> np.ndarray:
    """Total training FLOPs of each sample alone (the cost the planner balances)."""
    return train_flops(lens, spec, passes).total


def crossover(spec: ModelSpec, limit: int = CROSSOVER_LIMIT) -> int | None:
    """The shortest length whose attention FLOPs reach its linear FLOPs; None past ``limit``.

    Attention per token, ``attention(S) / S``, grows with S (to ``4 q_dim sum_l w_l`` with
    windows), while the linear part per token is constant; so the lengths where attention
    dominates are all those from one length on, found by bisection.

    >>> crossover(ModelSpec("llama", 64, 2, 4, 2, 16, 96, True, 100, (None, None)))
    529
    """
    lin = float(linear_per_token(spec))

    def attends(s: int) -> bool:
        return float(attention_flops(np.array([s]), spec)[0]) >= lin * s

    if not attends(limit):
        return None
    lo, hi = 1, limit  # attends(hi); find the smallest such length
    if attends(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attends(mid):
            hi = mid
        else:
            lo = mid
    return hi


def full_attention_coefficients(spec: ModelSpec, passes: int = TRAIN_PASSES) -> tuple[float, float]:
    """``(lin, quad)`` with ``lin * S + quad * S^2`` the training FLOPs of S tokens alone, when
    no layer has a window (otherwise the quadratic is an upper bound of the attention part).

    Causal attention is ``4 q_dim L S (S + 1) / 2 = 2 q_dim L (S^2 + S)``: its ``S`` term joins
    the linear coefficient.
    """
    half = 2.0 * spec.q_dim * spec.layers
    return passes * (float(linear_per_token(spec)) + half), passes * half
