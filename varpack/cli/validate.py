"""``varpack validate``: check a plan against every invariant, recomputed from its files."""

from __future__ import annotations

import sys
from typing import Any

import click


@click.command()
@click.argument("plan", type=click.Path())
@click.option(
    "--metadata",
    "metadata",
    type=click.Path(),
    default=None,
    help="The plan's input (metadata or sort output): check sample ids and lengths against it "
    "(about as long as reading it).",
)
@click.option(
    "--replay",
    is_flag=True,
    help="With --metadata: plan the input again with plan.json's config and compare every "
    "manifest row, the steps, epochs, shape lengths and dropped samples. Takes about as long, "
    "and as much memory, as varpack plan on that input.",
)
@click.option(
    "--carry-from",
    "carry_from",
    type=click.Path(),
    default=None,
    metavar="META",
    help="Metadata holding the plan's carried columns (varpack plan --carry): check every carried "
    "value against it, per sample id. Default: --metadata, when that is raw metadata.",
)
@click.option(
    "--parent",
    "parent",
    type=click.Path(),
    default=None,
    metavar="PLAN",
    help="A replanned plan's parent (varpack replan), when it is no longer where plan.json "
    "records it: the parent's steps before the replan and this plan's are checked together.",
)
def validate(
    plan: str, metadata: str | None, replay: bool, carry_from: str | None, parent: str | None
) -> None:
    """Recompute and check everything PLAN promises; exit 1 with one line per violation.

    plan.json's keys and their types; rank files that are plain files inside PLAN, exactly the
    declared ones, readable, with their checksums and row counts; the plan fingerprint, which
    ties plan.json's config to the manifests (an edited config is caught without reading the
    input); step and micro numbering, equal micro-batch counts on every rank and step, budgets
    and padded lengths, every sample exactly once per epoch (or dropped; split documents: their
    pieces tile them, and no two share a micro-batch), each step's global tokens, samples and LR
    factor, and the stats in plan.json; with the metadata, every carried column's values
    (carry.COL) per sample id. A replanned plan (varpack replan) is checked with its parents:
    their steps before it and its own hold every sample exactly once per epoch.
    """
    from varpack.manifest.inspect import token_line
    from varpack.manifest.validate import validate_plan

    if replay and metadata is None:
        raise click.UsageError("--replay needs --metadata INPUT, the input the plan was made from")
    reference = None
    if metadata is not None:
        from varpack.manifest.make import read_input

        reference = _selected(plan, read_input(metadata), metadata, carry_from)
    carry_source = carry_from
    if carry_source is None and metadata is not None:
        from varpack.sort.output import is_sorted_output

        carry_source = None if is_sorted_output(metadata) else metadata
    report = validate_plan(
        plan,
        reference,
        replay=replay,
        carry_source=carry_source,
        carry_required=carry_from is not None,
        parent=parent,
    )
    if report.problems:
        for line in report.problems:
            click.echo(f"violation: {' '.join(line.split())}")
        click.echo(f"{plan}: {len(report.problems)} violation(s)", err=True)
        sys.exit(1)
    from varpack.cli.plan import bound_text

    f = report.facts
    replayed = "; re-planned with its config: same rows" if replay else ""
    carried = report.facts.get("carried")
    if carried:
        why = f.get("carry_unchecked")
        checked = f"not checked: {why}" if why else "checked against the metadata"
        replayed += f"; carried {', '.join(carried)} ({checked})"
    fill = f.get("budget_fill")
    fill_text = "" if fill is None else f"budget fill {100 * fill:.1f}%, "
    samples, tokens = ok_counts(f)
    click.echo(
        f"OK {plan}: {samples} -> {f['steps']:,} steps x {f['dp']} ranks x "
        f"{f['grad_accum']} micro-batches; {tokens}, {fill_text}padding {100 * f['padding_ratio']:.2f}%, "
        f"time {f['time_vs_ideal']:.3f}x ideal{bound_text(f)}; "
        f"{token_line(f['tokens'])}{replayed}"
    )
    from varpack.plan.figures.stats import TIME_VS_IDEAL_LEGEND

    click.echo(f"  ({TIME_VS_IDEAL_LEGEND})")


def _selected(
    plan: str, reference: tuple[Any, Any], metadata: str, carry_from: str | None
) -> tuple[Any, Any]:
    """The metadata's samples a plan made with ``--where`` selected (the same condition, over
    ``--carry-from`` if given, else the metadata), else all of them."""
    from varpack.errors import VarpackError
    from varpack.manifest.format import read_meta
    from varpack.manifest.make import select_input, where_source

    try:
        entry = read_meta(plan).get("selection")
    except (OSError, ValueError, VarpackError):  # validate_plan refuses such a plan in one line
        return reference
    if not isinstance(entry, dict) or not isinstance(entry.get("where"), str):
        return reference
    source = carry_from if carry_from is not None else where_source(metadata, None)
    ids, lens, _ = select_input(*reference, entry["where"], source)
    return ids, lens


def ok_counts(f: dict[str, Any]) -> tuple[str, str]:
    """The OK line's samples and tokens, worded as ``plan`` words them (samples, pieces after
    splitting, epochs; tokens planned = epochs x tokens kept), recomputed from the manifests:
    ``f['samples']`` counts their rows, a piece of a split document one each."""
    from varpack.plan.figures.words import samples_text, tokens_text

    rows, epochs, t = f["samples"], f["epochs"], f["tokens"]
    if f["replanned"]:  # its steps hold part of the run: no input count to word them against
        what = "pieces after splitting" if t and t.get("pieces") else "samples"
        return f"{rows:,} {what} in its steps", f"{f['real_tokens']:,} tokens"
    if f["mix"]:
        samples = samples_text(f["input_samples"], f["dropped"], 1, None, drawn=rows)
    else:
        docs = rows // max(epochs, 1) - (int(t["pieces"]) - int(t["documents_split"]) if t else 0)
        samples = samples_text(docs + f["dropped"], f["dropped"], epochs, t)
    return samples, tokens_text(f["real_tokens"], epochs, t, f["mix"])
