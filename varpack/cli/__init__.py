"""The ``varpack`` command line: a click group whose commands load lazily.

Each command lives in its own module (``varpack.cli.<name>``) and stays thin: it parses options,
calls the library, prints. Lazy loading keeps ``varpack --help`` fast and means no command pulls
in torch or MPI unless it runs. Every failure the user can cause or fix is one line on stderr,
``varpack: error: <what, where; what to do>``, never a traceback: a usage error (bad flag or
value) exits 2 with "see --help"; a :class:`~varpack.errors.VarpackError` exits with its code (2
for bad input, options or output paths, 1 for a failing environment such as a full disk); an
``OSError`` naming a path exits 1; a bad ``VARPACK_*`` environment variable exits 2 before any
work; SIGTERM, SIGINT and SIGHUP remove the partial output and exit
``128 + signal`` (143, 130, 129).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from varpack import __version__
from varpack.errors import Interrupted, VarpackError

#: command name -> "module:attribute"
COMMANDS = {
    "synth": "varpack.cli.synth:synth",
    "lengths": "varpack.cli.lengths:lengths",
    "check": "varpack.cli.check:check",
    "sort": "varpack.cli.sort:sort",
    "plan": "varpack.cli.plan:plan",
    "replan": "varpack.cli.replan:replan",
    "inspect": "varpack.cli.inspect:inspect",
    "validate": "varpack.cli.validate:validate",
    "calibrate": "varpack.cli.calibrate:calibrate",
    "compile": "varpack.cli.compile:compile_kernels_command",
    "cost": "varpack.cli.cost:cost",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not {"-h", "--help"} & set(rest):  # help needs no settings
            check_environment()
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        from varpack.atomic import interruptible

        try:
            with interruptible():
                return super().invoke(ctx)
        except VarpackError as exc:
            fail(str(exc), exc.exit_code)
        except Interrupted as exc:
            fail(f"{exc}; the partial output was removed", exc.exit_code)
        except click.UsageError as exc:
            usage_error(exc)
        except BrokenPipeError:
            closed_pipe()
        except OSError as exc:
            fail(os_error_text(exc), 1)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("standalone_mode", None)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except click.UsageError as exc:  # raised before invoke (an unknown command, a bad flag)
            usage_error(exc)
        except click.exceptions.Abort:
            fail("interrupted", 130)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)


def check_environment() -> None:
    """Read every ``VARPACK_*`` setting before any work, so that a bad one stops every command
    in one line, not only the commands that happen to use it."""
    from varpack.console import log_interval
    from varpack.plan.kernels.compose_threads import default_threads
    from varpack.sort.exchange import max_message_bytes

    log_interval()
    max_message_bytes()
    default_threads()


def usage_error(exc: click.UsageError) -> None:
    """A bad flag, value or command: one line that says where to look, exit 2."""
    names, ctx = [], exc.ctx
    while ctx is not None and ctx.parent is not None:  # the root's name may be "python -m varpack"
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    command = " ".join(["varpack", *reversed(names)])
    if _another_rank():  # every rank parsed the same flags: rank 0 says it, once
        sys.exit(2)
    fail(f"{exc.format_message().rstrip('.')}; see {command} --help", 2)


def _another_rank() -> bool:
    """Started by ``mpiexec ... python -m mpi4py`` as a rank other than 0 (read from the
    launcher's environment: MPI need not be started for a usage error)."""
    if "mpi4py.run" not in sys.modules:
        return False
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "").strip()
        if value:
            return value != "0"
    return False


def fail(message: str, code: int = 2) -> None:
    """Print one error line and exit (the single place that formats user errors)."""
    click.echo(error_line(message), err=True)
    sys.exit(code)


def error_line(message: str) -> str:
    """``varpack: error: <message>`` on one line."""
    one_line = " ".join(str(message).split("\n")).replace("\r", " ")
    return f"varpack: error: {one_line}"


def closed_pipe() -> None:
    """Standard output was closed by its reader (``varpack validate ... | head -1``): not an
    error of a path. Exit as a shell tool killed by SIGPIPE does, 141, quietly; stdout goes to
    ``/dev/null`` so the interpreter's last flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)


def os_error_text(exc: OSError) -> str:
    """What an ``OSError`` naming a path says to the user."""
    what = f"{exc.filename}: " if exc.filename else ""
    return f"{what}{exc.strerror or exc}; check the path and its permissions"


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.version_option(__version__, prog_name="varpack")
def main() -> None:
    """Plan variable-length training offline: sort lengths, pack micro-batches, replay in torch."""
