"""Progress and status output, always on stderr so stdout stays machine-readable."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

err = Console(stderr=True, highlight=False)


def info(message: str, quiet: bool = False) -> None:
    """One status line on stderr (suppressed by ``--quiet``)."""
    if not quiet:
        err.print(message, markup=False, soft_wrap=True)


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False) -> Iterator[Progress]:
    """A rich progress bar on stderr; disabled when quiet or when stderr is not a terminal.

    Use ``bar.advance(task_id, n)`` with the task id ``0``.
    """
    disable = quiet or not sys.stderr.isatty()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=disable,
    )
    with bar:
        bar.add_task(description, total=total)
        yield bar
