"""A signal during a held block (a long numba kernel) is raised when the block ends, not inside
it: raised while numba boxes a kernel's results, it crashed the process."""

from __future__ import annotations

import os
import signal

import pytest

from varpack.atomic import interruptible
from varpack.errors import Interrupted, held_signals


def test_a_signal_in_a_held_block_is_raised_at_its_end():
    reached = []
    with pytest.raises(Interrupted) as caught, interruptible():
        with held_signals():
            with held_signals():  # nested: raised only when the outer block ends
                os.kill(os.getpid(), signal.SIGTERM)
                reached.append("inner")
            reached.append("outer")
        reached.append("after")  # not reached
    assert reached == ["inner", "outer"]
    assert caught.value.signum == signal.SIGTERM


def test_outside_a_held_block_a_signal_raises_at_once():
    with pytest.raises(Interrupted), interruptible():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs on one of these lines
            pass
        raise AssertionError("not interrupted")
