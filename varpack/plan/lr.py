"""Learning-rate factor of every step from its realised global batch.

With a reference global batch ``base`` (samples or tokens) and a step's realised batch ``b``
(all ranks, all micro-batches), ``k = b / base``; the scaling rule, chosen by name from
:data:`LR_SCALINGS`, turns ``k`` into the factor: ``none`` (1), ``linear`` (``k``) or ``sqrt``
(``sqrt(k)``). The blog's example: with a 30-token budget and base 2, batches of 10 and 4 samples
give factors 5 and 2 with linear scaling. The trainer multiplies its scheduled LR by the factor.

The stage (:func:`step_totals`) counts each step's global samples and tokens, once the
execution order is final, and the factors follow from them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: scaling name -> factor as a function of k = realised batch / base batch
LR_SCALINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "none": np.ones_like,
    "linear": lambda k: k,
    "sqrt": np.sqrt,
}


def lr_factors(
    step_samples: np.ndarray,
    step_tokens: np.ndarray,
    scaling: str = "none",
    base_batch_size: float | None = None,
    base_unit: str = "samples",
) -> np.ndarray:
    """Factor per step (float64).

    >>> lr_factors(np.array([10, 4]), np.array([30, 28]), "linear", 2.0).tolist()
    [5.0, 2.0]
    >>> lr_factors(np.array([10, 4]), np.array([30, 28])).tolist()
    [1.0, 1.0]
    """
    realised = np.asarray(step_tokens if base_unit == "tokens" else step_samples, np.float64)
    k = realised / float(base_batch_size) if base_batch_size else np.ones_like(realised)
    return np.asarray(LR_SCALINGS[scaling](k), dtype=np.float64)


def step_totals(
    step: np.ndarray, samples: np.ndarray, tokens: np.ndarray, num_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Global ``(samples, tokens)`` of every step from each micro-batch's step and counts.

    >>> [a.tolist() for a in step_totals(np.array([0, 1, 0]), np.array([2, 1, 3]), np.array([9, 4, 7]), 2)]
    [[5, 1], [16, 4]]
    """
    step_samples = np.bincount(step, weights=samples, minlength=num_steps).astype(np.int64)
    step_tokens = np.bincount(step, weights=tokens, minlength=num_steps).astype(np.int64)
    return step_samples, step_tokens
