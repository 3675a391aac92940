"""``varpack validate``: check a plan against every invariant, recomputed from its files."""

from __future__ import annotations

import sys

import click


@click.command()
@click.argument("plan", type=click.Path())
@click.option(
    "--metadata",
    "metadata",
    type=click.Path(),
    default=None,
    help="The plan's input (metadata or sort output): check sample ids and lengths against it.",
)
def validate(plan: str, metadata: str | None) -> None:
    """Recompute and check everything PLAN promises; exit 1 with one line per violation.

    Checksums, schema, step and micro numbering, equal micro-batch counts on every rank and step,
    budgets and padded lengths, every sample exactly once per epoch (or dropped), each step's
    global tokens, samples and LR factor, and the stats in plan.json.
    """
    from varpack.manifest.validate import validate_plan

    reference = None
    if metadata is not None:
        from varpack.manifest.make import read_input

        reference = read_input(metadata)
    report = validate_plan(plan, reference)
    if report.problems:
        for line in report.problems:
            click.echo(f"violation: {line}")
        click.echo(f"{plan}: {len(report.problems)} violation(s)", err=True)
        sys.exit(1)
    f = report.facts
    click.echo(
        f"OK {plan}: {f['samples']} planned samples ({f['dropped']} dropped), {f['steps']} steps x {f['dp']} ranks x "
        f"{f['grad_accum']} micro-batches; padding {100 * f['padding_ratio']:.2f}%, time {f['time_vs_ideal']:.3f}x ideal"
    )
