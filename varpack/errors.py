"""User-facing errors, and the exception a signal turns into.

A :class:`VarpackError` is something the user caused or can fix: the CLI prints its message on one
line to stderr, without a traceback, and exits with its ``exit_code`` (2 for bad input, options
or output paths; 1 for an environment failure such as a full disk). Anything else is a bug and
keeps its traceback. Messages say what is wrong, where (file, row, sample id, option) and what to
do. :class:`Interrupted` is raised by varpack's signal handlers (SIGTERM, SIGINT, SIGHUP) so that
every ``finally`` and cleanup runs; the CLI reports it in one line and exits ``128 + signal``.

:func:`deferred` keeps a signal's exception out of numba's own code.

:func:`env_int` and :func:`env_float` read the numbers varpack takes from the environment
(``VARPACK_*``, torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``): a bad value is a
:class:`ConfigError` naming the variable, never a traceback.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from types import FrameType


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


def deferred(signum: int, frame: FrameType | None) -> bool:
    """For varpack's signal handler: True where the signal came inside numba's own Python code,
    and it is sent again (handled a line later) rather than raised there.

    numba calls back into Python while it boxes a kernel's results (``_numba_unpickle``): a
    signal that came while the kernel ran is handled there, and an exception there is not
    expected: a ``SystemError``, or a segmentation fault (``plan`` and ``validate`` ended so in
    about half of the SIGTERMs sent during a kernel). During a JIT compilation (numba's Python
    too) the signal waits for it to end.
    """
    if frame is None or not str(frame.f_globals.get("__name__")).startswith("numba."):
        return False
    threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
    return True
