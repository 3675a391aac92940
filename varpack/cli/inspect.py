"""``varpack inspect``: show a plan's figures (text or JSON) and optionally plot them."""

from __future__ import annotations

import json
from typing import Any

import click


@click.command()
@click.argument("plan", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(),
    default=None,
    help="Write a figure (PNG, or SVG/PDF by the suffix): document lengths (a split plan's "
    "pieces too), tokens per micro-batch, LR factor, per-rank load; above 500 steps, per-step "
    "panels as percentile bands over buckets of steps. Never inside PLAN or over the plan's "
    "input; written atomically.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
def inspect(plan: str, as_json: bool, plot_file: str | None, overwrite: bool) -> None:
    """Show PLAN's samples and pieces, tokens, padding, balance, time vs ideal, mixing, LR factors
    and shapes (checksums verified).

    Under `mpiexec -n P python -m mpi4py -m varpack inspect PLAN` each rank verifies a
    contiguous share of the rank files; rank 0 prints (and plots) the same as one process."""
    from varpack.sort.agree import world

    comm = world()
    if comm is not None:
        from varpack.cli.agreed import run_agreed

        run_agreed(comm, lambda: _on_ranks(comm, plan, as_json, plot_file, overwrite))
        return
    from varpack.inspect import describe, render

    if plot_file:  # an unsafe figure path fails before anything is printed
        from varpack.inspect.plot import check_plot_output

        check_plot_output(plan, plot_file, overwrite)
    info = describe(plan)
    click.echo(json.dumps(info, indent=2) if as_json else render(info))
    if plot_file:
        from varpack.inspect.plot import plot

        plot(plan, plot_file, overwrite)
        if not as_json:
            click.echo(f"plot written to {plot_file}")


def _on_ranks(comm: Any, plan: str, as_json: bool, plot_file: str | None, overwrite: bool) -> int:
    """``inspect`` on every rank of ``comm``: the files verified in shares; rank 0 prints and
    plots. Every rank returns 0 (a failure is agreed and raised)."""
    from varpack.inspect import describe, render
    from varpack.planfile.opened import load_plan_ranks
    from varpack.sort.agree import agree

    def first() -> None:
        if plot_file:  # an unsafe figure path fails before anything is printed
            from varpack.inspect.plot import check_plot_output

            check_plot_output(plan, plot_file, overwrite)

    opened = load_plan_ranks(comm, plan, full=True, first=first)

    def show() -> None:
        info = describe(plan, opened)
        click.echo(json.dumps(info, indent=2) if as_json else render(info))
        if plot_file:
            from varpack.inspect.plot import plot

            plot(plan, plot_file, overwrite)
            if not as_json:
                click.echo(f"plot written to {plot_file}")

    agree(comm, lambda: show() if opened is not None else None)
    return 0
