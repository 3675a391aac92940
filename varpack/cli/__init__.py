"""The ``varpack`` command line: a click group whose commands load lazily.

Each command lives in its own module (``varpack.cli.<name>``) and stays thin: it parses options,
calls the library, prints. Lazy loading keeps ``varpack --help`` fast and means no command pulls
in torch or MPI unless it runs. A :class:`~varpack.errors.VarpackError` becomes one line on stderr
and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from varpack import __version__
from varpack.errors import VarpackError

#: command name -> "module:attribute"
COMMANDS = {
    "synth": "varpack.cli.synth:synth",
    "lengths": "varpack.cli.lengths:lengths",
    "check": "varpack.cli.check:check",
    "sort": "varpack.cli.sort:sort",
    "plan": "varpack.cli.plan:plan",
    "inspect": "varpack.cli.inspect:inspect",
    "validate": "varpack.cli.validate:validate",
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

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except VarpackError as exc:
            fail(str(exc))


def fail(message: str, code: int = 2) -> None:
    """Print one error line and exit (the single place that formats user errors)."""
    click.echo(f"varpack: error: {message}", err=True)
    sys.exit(code)


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.version_option(__version__, prog_name="varpack")
def main() -> None:
    """Plan variable-length training offline: sort lengths, pack micro-batches, replay in torch."""
