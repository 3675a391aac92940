"""A signal while a numba kernel runs is raised in varpack's code, not inside numba's boxing of
the kernel's results: raised there, it ended ``plan`` and ``validate`` with a SystemError or a
segmentation fault."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from numba import njit

from varpack.atomic import interruptible
from varpack.errors import Interrupted


@njit(nogil=True)
def _busy(n, seconds):  # type: ignore[no-untyped-def]
    """Spin for about ``seconds``; results of several types (boxed through numba's Python)."""
    a = np.zeros(n)
    b = np.zeros(n, dtype=np.bool_)
    start = 0.0
    s = 0.0
    rounds = 0
    while rounds < 1_000_000:
        for i in range(n):
            s += i * 0.5
            a[i] = s
        rounds += 1
        if rounds * n > seconds * 2e8:
            break
    return a, b, True, np.empty(0, np.int64), b[:0], start


def test_a_signal_during_a_kernel_is_raised_after_it():
    _busy(10, 0.0)  # compiled before the clock starts
    for _ in range(3):
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        with pytest.raises(Interrupted) as caught, interruptible():
            timer.start()
            _busy(100_000, 0.5)
            time.sleep(1.0)  # the signal sent again is handled here at the latest
            raise AssertionError("not interrupted")
        assert caught.value.signum == signal.SIGTERM
        assert caught.value.__context__ is None  # not a SystemError from numba's boxing
