"""``varpack replan``: continue a plan from one of its steps on another number of ranks."""

from __future__ import annotations

from typing import Any

import click

from varpack.cli.plan import with_plan_options


@click.command(context_settings={"show_default": False})
@click.argument("plan", type=click.Path())
@click.argument("out", type=click.Path())
@click.option(
    "--from-step",
    "from_step",
    type=click.IntRange(0),
    required=True,
    help="The first step the new plan holds: the step the run's checkpoint resumes at.",
)
@click.option(
    "--rebalance",
    is_flag=True,
    help="Plan what is left again even where every step could keep its micro-batches (they were "
    "composed for the old grad-accum: over fewer per rank they may not level the ranks).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUT.")
@click.option("--quiet", "-q", is_flag=True, help="No summary line.")
@with_plan_options
def replan(
    plan: str,
    out: str,
    from_step: int,
    rebalance: bool,
    overwrite: bool,
    quiet: bool,
    **options: Any,
) -> None:
    """Continue PLAN from step --from-step, on --dp ranks, into the new plan directory OUT.

    OUT holds exactly the samples PLAN's steps from --from-step on would train, its manifests
    numbering the run's steps from there; its plan.json records PLAN as its parent, and
    `varpack validate OUT` checks the two together (every sample once per epoch). Resume with
    `train.py --plan OUT --resume`: it takes the checkpoint made on PLAN at that step.

    With --dp alone, where the new dp divides dp x grad-accum, grad-accum follows and every step
    keeps its samples, tokens and LR factor (its micro-batches are dealt again to the new ranks,
    balanced by cost): the resumed run draws the loss curve the uninterrupted one would have.
    Otherwise (another global batch, budget or cost option) what is left is planned again in
    PLAN's order: each epoch's remaining samples in the order PLAN trains them, so a shuffled
    sample stays within about one window of where it was; LR factors follow the new batch.
    --order, --seed, --epochs, --oversize and --cp stay PLAN's; a --mix plan keeps its steps
    (planning it again is refused). Example:

        varpack replan plan/ plan-dp4/ --from-step 1200 --dp 4
    """
    from varpack.atomic import check_output
    from varpack.make.replan import replan as run_replan

    check_output(out, overwrite, [plan])
    from varpack.cli.model import read_model_options

    given = read_model_options({k: v for k, v in options.items() if v is not None})
    meta, kept = run_replan(plan, out, from_step, given, overwrite, rebalance)
    if kept:  # micro-batches composed for the old grad-accum may not level fewer per rank
        from varpack.planfile.format import read_meta

        before = read_meta(plan)["stats"]["time_vs_ideal"]
        if meta["stats"]["time_vs_ideal"] > before + 0.02:
            click.echo(
                f"note: {meta['stats']['time_vs_ideal']:.3f}x ideal against {before:.3f}x before: "
                "these micro-batches were composed for more per rank; --rebalance plans what is "
                "left again for this layout (each step then holds other samples)",
                err=True,
            )
    if not quiet:
        s, lay = meta["stats"], meta["layout"]
        how = "every step keeps its samples" if kept else "what is left planned again"
        click.echo(
            f"{out}: steps {from_step:,} to {from_step + meta['num_steps'] - 1:,} of the run "
            f"({how}) on {lay['dp']} ranks x {lay['grad_accum']} micro-batches; time "
            f"{s['time_vs_ideal']:.3f}x ideal, imbalance max {s['imbalance_max']:.3f}"
        )
