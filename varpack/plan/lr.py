"""Learning-rate factor of every step from its realised global batch.

With a reference global batch ``base`` (samples or tokens) and a step's realised batch ``b``
(all ranks, all micro-batches), ``k = b / base``; linear scaling gives ``k``, square-root scaling
``sqrt(k)`` (the blog: with a 30-token budget and base 2, batches of 10 and 4 samples give
factors 5 and 2 with linear scaling). The trainer multiplies its scheduled LR by the factor.
"""

from __future__ import annotations

import numpy as np

from varpack.plan.config import PlanConfig


def lr_factors(step_samples: np.ndarray, step_tokens: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    """Factor per step (float64).

    >>> from varpack.plan.config import PlanConfig
    >>> cfg = PlanConfig(max_tokens=30, lr_scaling="linear", base_batch_size=2.0)
    >>> lr_factors(np.array([10, 4]), np.array([30, 28]), cfg).tolist()
    [5.0, 2.0]
    """
    n = len(step_samples)
    if cfg.lr_scaling == "none":
        return np.ones(n, dtype=np.float64)
    assert cfg.base_batch_size is not None
    realised = step_tokens if cfg.base_unit == "tokens" else step_samples
    k = np.asarray(realised, dtype=np.float64) / float(cfg.base_batch_size)
    return k if cfg.lr_scaling == "linear" else np.sqrt(k)
