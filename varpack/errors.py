"""User-facing errors, and the exception a signal turns into.

A :class:`VarpackError` is something the user caused or can fix: the CLI prints its message on one
line to stderr, without a traceback, and exits with its ``exit_code`` (2 for bad input, options
or output paths; 1 for an environment failure such as a full disk). Anything else is a bug and
keeps its traceback. Messages say what is wrong, where (file, row, sample id, option) and what to
do. :class:`Interrupted` is raised by varpack's signal handlers (SIGTERM, SIGINT, SIGHUP) so that
every ``finally`` and cleanup runs; the CLI reports it in one line and exits ``128 + signal``.

:func:`held_signals` holds their exception back around a long numba kernel.

:func:`env_int` and :func:`env_float` read the numbers varpack takes from the environment
(``VARPACK_*``, torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``): a bad value is a
:class:`ConfigError` naming the variable, never a traceback.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Iterator

#: the signals varpack turns into :class:`Interrupted`
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


class VarpackError(Exception):
    """Bad input, bad option or an unsafe output: reported in one line, exit code 2."""

    exit_code = 2


class InputError(VarpackError):
    """The input data (metadata, sorted output, plan, dataset) is missing, malformed or invalid."""


class ConfigError(VarpackError):
    """An option or a combination of options is invalid."""


class OutputExistsError(VarpackError):
    """The output path exists and ``--overwrite`` was not given."""


class OutputError(VarpackError):
    """The output path is unsafe: it overlaps an input, or is not varpack's to replace."""


class WriteError(VarpackError):
    """Writing an output failed in the environment (disk full, read-only, no permission)."""

    exit_code = 1


class Interrupted(BaseException):
    """A termination signal arrived; raised where the program was, so cleanups run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def env_int(name: str, default: int, low: int = 0) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty), at least
    ``low``; anything else is a :class:`ConfigError` naming the variable.

    >>> os.environ["VARPACK_DOCTEST"] = "abc"
    >>> env_int("VARPACK_DOCTEST", 3)
    Traceback (most recent call last):
    varpack.errors.ConfigError: environment variable VARPACK_DOCTEST='abc' is not an integer; unset it or give an integer >= 0
    >>> del os.environ["VARPACK_DOCTEST"]
    >>> env_int("VARPACK_DOCTEST", 3)
    3
    """
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        what = "is not an integer" if value is None else f"is below {low}"
        raise ConfigError(
            f"environment variable {name}={text!r} {what}; unset it or give an integer >= {low}"
        )
    return value


def env_float(name: str, default: float, low: float = 0.0) -> float:
    """The finite number in environment variable ``name`` (``default`` when unset or empty), at
    least ``low``; anything else is a :class:`ConfigError` naming the variable."""
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= low):
        raise ConfigError(
            f"environment variable {name}={text!r} is not a finite number >= {low:g}; unset it "
            "or give one"
        )
    return value


_HOLDS = [0]  # blocks within held_signals, in any thread
ARRIVED: list[int] = []  # signals that arrived while held (raised when the hold ends)


def signal_held(signum: int) -> bool:
    """Called by varpack's signal handler: True (and the signal noted) where a hold is on, so
    the handler returns instead of raising."""
    if _HOLDS[0] == 0:
        return False
    ARRIVED.append(signum)
    return True


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Within the block, a signal's :class:`Interrupted` is held back and raised when the
    block ends (in the main thread; a worker thread's block only ends its hold).

    For a long numba kernel: a signal that arrives while it runs is otherwise handled while
    numba boxes the kernel's results (it calls back into Python there), where the handler's
    exception is not expected: a ``SystemError``, or a segmentation fault, instead of a clean
    exit. Masking the signal does not do: a thread of Arrow's pool may take it.
    """
    _HOLDS[0] += 1
    try:
        yield
    finally:
        _HOLDS[0] -= 1
    if _HOLDS[0] == 0 and ARRIVED and threading.current_thread() is threading.main_thread():
        signum = ARRIVED[0]
        ARRIVED.clear()
        raise Interrupted(signum)
