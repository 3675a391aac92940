"""Commands whose work is shared over MPI ranks (``validate``, ``inspect``): one exit for all.

:func:`run_agreed` runs the shared part on every rank and leaves with one exit code: the code
the ranks agreed on, or, after a failure on any rank (:class:`~varpack.sort.agree.Agreed`), the
failing rank's error printed once by rank 0, worded as one process words it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def run_agreed(comm: Any, work: Callable[[], int]) -> None:
    """Run ``work`` (every rank: the same exit code; rank 0 prints), then exit every rank with
    that code (0: return normally)."""
    from varpack.cli import error_line, os_error_text
    from varpack.sort.agree import Agreed, agreed_exit

    try:
        code = work()
    except Agreed as exc:
        if comm.Get_rank() == 0 and exc.error is not None:
            err = exc.error
            text = os_error_text(err) if isinstance(err, OSError) else str(err)
            click.echo(error_line(text), err=True)
        agreed_exit(exc.code)
        return
    if code:
        agreed_exit(code)
