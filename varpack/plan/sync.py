"""What data-parallel ranks wait on: the synchronisation models a plan is balanced and scored for.

* ``step``: ranks meet once per optimizer step (DDP with ``no_sync`` during gradient
  accumulation, Megatron's data parallelism, ZeRO-1/2): a step lasts its slowest rank's sum over
  its micro-batches.
* ``micro``: ranks meet at every micro-batch (FSDP / FSDP2 and DeepSpeed ZeRO-3 all-gather the
  parameters layer by layer for each one): a step lasts the sum over its micro-batch *slots*
  (``micro`` 0..K-1, the same position on every rank) of the slowest rank in each slot.

A step's ``micro`` time is never below its ``step`` time (a max of sums is at most the sum of
the maxes), so a plan balanced slot by slot is balanced under both models, while a plan that
levels ranks over a whole step (a rank with a heavy micro-batch given lighter ones later) is not
balanced slot by slot. :data:`SYNC_MODELS` maps each ``--sync`` name to its step times; the
planner's stats, ``inspect`` and ``validate`` all score with it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from varpack.errors import ConfigError


def step_loads(
    step: np.ndarray, rank: np.ndarray, cost: np.ndarray, num_steps: int, dp: int
) -> np.ndarray:
    """(steps, dp) matrix of each rank's cost in each step."""
    flat = np.bincount(step * dp + rank, weights=cost, minlength=num_steps * dp)
    return flat.reshape(num_steps, dp)


def slot_loads(
    step: np.ndarray, rank: np.ndarray, micro: np.ndarray, cost: np.ndarray, num_steps: int,
    dp: int, k: int,
) -> np.ndarray:  # fmt: skip
    """(steps x k, dp) matrix of each rank's cost in each slot ``(step, micro)``."""
    slot = step * k + micro
    flat = np.bincount(slot * dp + rank, weights=cost, minlength=num_steps * k * dp)
    return flat.reshape(num_steps * k, dp)


def step_times(
    step: np.ndarray, rank: np.ndarray, micro: np.ndarray, cost: np.ndarray, num_steps: int,
    dp: int, k: int,
) -> np.ndarray:  # fmt: skip
    """Each step's time when ranks meet once a step: its slowest rank's sum.

    >>> step_times(np.zeros(4, int), np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]),
    ...            np.array([4.0, 1, 1, 4]), 1, 2, 2).tolist()
    [5.0]
    """
    return step_loads(step, rank, cost, num_steps, dp).max(axis=1, initial=0.0)


def micro_times(
    step: np.ndarray, rank: np.ndarray, micro: np.ndarray, cost: np.ndarray, num_steps: int,
    dp: int, k: int,
) -> np.ndarray:  # fmt: skip
    """Each step's time when ranks meet at every micro-batch: the sum over its slots of the
    slowest rank in each (the same micro-batches as above wait 4 + 4).

    >>> micro_times(np.zeros(4, int), np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]),
    ...             np.array([4.0, 1, 1, 4]), 1, 2, 2).tolist()
    [8.0]
    """
    peak = slot_loads(step, rank, micro, cost, num_steps, dp, k).max(axis=1, initial=0.0)
    return peak.reshape(num_steps, k).sum(axis=1)


Times = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int], np.ndarray]

#: ``--sync`` name -> ``fn(step, rank, micro, cost, num_steps, dp, grad_accum)``: each step's time
SYNC_MODELS: dict[str, Times] = {"step": step_times, "micro": micro_times}


def slotted(sync: str | None, grad_accum: int) -> bool:
    """Whether a plan is composed and balanced slot by slot: ``--sync micro`` with more than
    one micro-batch per rank and step (at grad-accum 1 a slot is the step: both models agree)."""
    return sync == "micro" and grad_accum > 1


def resolve_sync(sync: str | None, pp: int) -> str:
    """The model a plan is balanced for: ``--sync``, by default ``micro`` (what sharded data
    parallelism waits on, and balanced under both) or ``step`` with ``--pp`` (pipeline ranks
    meet their data-parallel peers once a step, after the flush).

    >>> resolve_sync(None, 1), resolve_sync(None, 2), resolve_sync("step", 1)
    ('micro', 'step', 'step')
    """
    if sync is None:
        return "step" if pp > 1 else "micro"
    if sync == "micro" and pp > 1:
        raise ConfigError(
            f"--sync micro conflicts with --pp {pp}: pipeline stages meet their data-parallel "
            "peers once per optimizer step (after the pipeline flush); use --sync step (the "
            "default with --pp)"
        )
    return sync
