"""``python -m varpack.torch.torchrun``: torchrun, with a failed or interrupted job in one line.

torchrun (torch 2.13) treats any worker exit other than 0 as a failure and then raises
``ChildFailedError`` out of its own ``main``: a Python traceback and a ~20-line failure block,
printed whatever the worker did (``@record``, error files and exit codes change only what the
block says). Ctrl-C is the same: its signal handler raises ``SignalException``, which it lets out
after stopping the workers, traceback and all. Nothing a worker can do keeps that short, short of
exiting 0 (which would hide the failure from the shell and the scheduler).

This module takes exactly torchrun's arguments and runs the same launcher, but catches those two
exceptions: a worker that exits 2 (a varpack error, its line already printed), 130 or 143
(interrupted, said so), or that wrote its line to torchelastic's error file (a timeout or a lost
peer, exit 1: ``varpack.torch.watch``) adds nothing; another failure is one line (rank, exit
code or signal).
The exit code is the first failed worker's (128 + signal for a signal). torchelastic's own
warnings (the workers it signals) are silenced.

Imports: torch (``torch.distributed.run``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

#: exit codes a worker of ``jobs/train.py`` uses after saying why in its own line
EXPLAINED = {2, 128 + signal.SIGINT, 128 + signal.SIGTERM}


def _quiet_elastic() -> None:
    """torchelastic's loggers (each set to WARNING by torch) down to CRITICAL: its warnings
    repeat what the workers said."""
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name == "torch.distributed.run":
            logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; return the job's exit code, having said at most one line."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    _quiet_elastic()
    try:
        run(args)
    except SignalException as exc:  # Ctrl-C or SIGTERM: the workers were told, and said so
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode
        said = bool(failure.error_file) and os.path.isfile(failure.error_file)  # its own line
        if code not in EXPLAINED and not said:
            how = f"exit code {code}" if code > 0 else f"signal {failure.signal_name()}"
            sys.stderr.write(f"torchrun: rank {rank} (pid {failure.pid}) failed with {how}\n")
        return code if code > 0 else 128 - code
    return 0


if __name__ == "__main__":
    sys.exit(main())
