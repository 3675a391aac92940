"""Compile :func:`plan_batch`'s kernels ahead of the first batch (``varpack compile``).

The planner's kernels are numba's, compiled on their first call after an install or an upgrade
and cached on disk (:mod:`varpack.plan.numba_cache`): 35 to 58 s of CPU on 2 shared cores, which a first
``plan_batch`` would otherwise pay on every rank of a new container. :func:`compile_kernels`
plans small batches under each option family that reaches other kernels (both sync models,
both layouts, each oversize choice, bounded shapes, groups, an inference pass, the figures), so
that every later process loads them from the cache instead: a first call of milliseconds plus
numba's start (about 0.3 s).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from varpack.online.batch import plan_batch
from varpack.plan.numba_cache import expect_compiles

#: each family reaches kernels (or argument types) the others do not
FAMILIES: list[dict[str, Any]] = [
    {"mini_batches": 2},
    {"mini_batches": 2, "sync": "step"},
    {"mini_batches": 2, "cost": "flops", "hidden": 896, "kv_hidden": 128, "layers": 24},
    {"mini_batches": 2, "layout": "padded", "pad_multiple": 8},
    {"mini_batches": 2, "oversize": "split", "max_shapes": 4},
    {"mini_batches": 2, "groups": 4, "sync": "step"},
    {"mini_batches": 2, "pp": 2, "oversize": "split"},
    {"mini_batches": 2, "cost": "flops", "model": "mistral-7b-v0.1"},
    {"forward_only": True},
]


def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel :func:`plan_batch` and
    ``BatchPlan.figures`` use; seconds once they are cached."""
    expect_compiles()
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 3000, 512)
    lengths[::97] = 6000  # over the budget: alone, or split
    loss = lengths // 2
    for options in FAMILIES:
        plan = plan_batch(lengths, dp=2, max_tokens=4096, loss_tokens=loss, **options)
        plan.figures  # noqa: B018  (the bound's kernels)
