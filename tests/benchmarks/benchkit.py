"""What the benchmarks share: sample counts written ``30M``, and a run in a fresh process.

A benchmark that reports peak memory runs each candidate in a spawned process of its own
(:func:`in_process`), so one candidate's allocations never count against the next.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from queue import Empty
from typing import Any


def count(text: str) -> int:
    """``"30M"`` -> 30000000, ``"500K"`` -> 500000, ``"1000"`` -> 1000.

    >>> count("2.5M"), count("10K"), count("7")
    (2500000, 10000, 7)
    """
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def in_process(target: Callable[..., None], *args: Any) -> Any:
    """Run ``target(*args, queue)`` in a spawned process; what it puts on the queue (a process
    that dies first is an error, not a wait forever)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    while True:
        try:
            got = queue.get(timeout=1.0)
            break
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"{target.__name__} died (exit code {proc.exitcode})") from None
    proc.join()
    return got
