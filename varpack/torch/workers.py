"""DataLoader workers by default: from the CPUs each training process has on its node.

``PlanLoader(num_workers="auto")`` asks :func:`default_workers`. A worker reads and collates whole
micro-batches ahead of the loop, which takes that work off the process that launches the GPU's
kernels; too few leave the loop waiting for batches. Measured on one H100 with 16 CPUs (110 M
model, 16K-token micro-batches, ``bench_gpu.py``): the reader took 3.7 % of the loop with 2
workers and 0.4 % with 6. So a process gets the CPUs of its node shared by the processes there
(torchrun's ``LOCAL_WORLD_SIZE``, else one per visible GPU), less two (itself and the CUDA
driver's threads), at most :data:`MAX_WORKERS`. Without CUDA it gets none: on a CPU the model
needs every core, and a worker only adds a process boundary (``docs/benchmarks.md``, torch reader).
"""

from __future__ import annotations

import os

import torch

from varpack.errors import ConfigError, env_int

MAX_WORKERS = 6  # 0.4 % of the loop at 6 on an H100; more only holds more memory
RESERVED = 2  # CPUs kept for the training process and the CUDA driver


def default_workers(gpus: int | None = None, cpus: int | None = None) -> int:
    """Workers for one training process: ``cpus // processes - 2``, within ``0..6``.

    ``gpus``: visible GPUs (default: torch's count; 0 without CUDA); ``cpus``: CPUs this process
    may run on (default: its affinity).

    >>> default_workers(gpus=1, cpus=16), default_workers(gpus=8, cpus=32), default_workers(0, 64)
    (6, 2, 0)
    """
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        return 0
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    procs = env_int("LOCAL_WORLD_SIZE", gpus, low=1)
    return max(0, min(MAX_WORKERS, (cpus or 1) // procs - RESERVED))


def resolve_workers(value: int | str) -> int:
    """``num_workers`` as given (an int >= 0), or ``"auto"``: :func:`default_workers`.

    >>> resolve_workers(3), resolve_workers("auto") >= 0
    (3, True)
    """
    if value == "auto":
        return default_workers()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"num_workers={value!r}: give a count >= 0 or 'auto' (from the CPUs per GPU)"
        )
    return value
