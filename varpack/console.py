"""Progress and status output, always on stderr so stdout stays machine-readable.

On a terminal, progress is a rich bar. Elsewhere (a Slurm or CI log, stderr redirected to a
file) a bar would print nothing until the end, so :class:`LogProgress` writes a plain line every
``VARPACK_PROGRESS_INTERVAL`` seconds (default 10) with done / total, rate and ETA, and a final
line with the total time. A job done within the first interval writes nothing (as on a terminal,
the command's own summary line says what was done).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from varpack.errors import env_float

err = Console(stderr=True, highlight=False)

#: seconds between two progress lines in a log (overridden by VARPACK_PROGRESS_INTERVAL)
LOG_INTERVAL = 10.0


def info(message: str, quiet: bool = False) -> None:
    """One status line on stderr (suppressed by ``--quiet``)."""
    if not quiet:
        err.print(message, markup=False, soft_wrap=True)


def duration(seconds: float) -> str:
    """Seconds as ``42s``, ``3m 05s`` or ``2h 01m``.

    >>> duration(42.4), duration(185), duration(7260)
    ('42s', '3m 05s', '2h 01m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class LogProgress:
    """Progress as log lines: ``lengths: 1,200 / 5,000 (24.0%), 120/s, ETA 32s``.

    Has the one method callers use on a rich ``Progress`` (``advance(task_id, n)``); a line is
    written when ``interval`` seconds passed since the last one, and :meth:`finish` writes the
    final line. ``clock`` and ``stream`` are for tests.
    """

    def __init__(
        self,
        description: str,
        total: int | None,
        interval: float = LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
    ) -> None:
        self.description, self.total, self.interval = description, total, interval
        self.clock, self.stream = clock, stream
        self.done = 0
        self.lines = 0  # progress lines written so far
        self.start = self.last = clock()

    def advance(self, task_id: Any = 0, advance: float = 1) -> None:
        self.done += int(advance)
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            self.lines += 1
            self._write(self.line(now))

    def line(self, now: float) -> str:
        """Done / total, rate since the start and the time left at that rate."""
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.description}: {self.done:,}"
        if self.total:
            text += f" / {self.total:,} ({100 * self.done / self.total:.1f}%)"
        text += f", {rate:,.0f}/s"
        if self.total and rate > 0:
            text += f", ETA {duration(max(self.total - self.done, 0) / rate)}"
        return text

    def finish(self) -> None:
        """The final line: everything done, in how long, at what rate (only after a progress
        line: a short job stays silent)."""
        if not self.lines:
            return
        elapsed = self.clock() - self.start
        rate = self.done / max(elapsed, 1e-9)
        self._write(
            f"{self.description}: done, {self.done:,} in {duration(elapsed)} ({rate:,.0f}/s)"
        )

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()


def log_interval() -> float:
    """The interval of log progress lines: ``VARPACK_PROGRESS_INTERVAL`` seconds, else 10."""
    return env_float("VARPACK_PROGRESS_INTERVAL", LOG_INTERVAL)


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False) -> Iterator[Any]:
    """Progress on stderr: a rich bar on a terminal, :class:`LogProgress` lines otherwise,
    nothing when quiet.

    Use ``bar.advance(task_id, n)`` with the task id ``0``.
    """
    if not quiet and not sys.stderr.isatty():
        logger = LogProgress(description, total, interval=log_interval())
        yield logger
        logger.finish()  # not on an exception: the error line says what happened
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=quiet,
    )
    with bar:
        bar.add_task(description, total=total)
        yield bar
