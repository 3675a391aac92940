"""``varpack validate``: check a plan against every invariant, recomputed from its files."""

from __future__ import annotations

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
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Nothing on success (exit 0); the violations only, on failure (exit 1).",
)
def validate(
    plan: str,
    metadata: str | None,
    replay: bool,
    carry_from: str | None,
    parent: str | None,
    quiet: bool,
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

    Under `mpiexec -n P python -m mpi4py -m varpack validate ...` each rank checks a contiguous
    share of the rank files and the ranks combine the whole-plan checks; rank 0 prints the same
    report as one process (--replay is refused there: it re-plans in one process).
    """
    if replay and metadata is None:
        raise click.UsageError("--replay needs --metadata INPUT, the input the plan was made from")
    from varpack.sort.agree import world

    comm = world()
    if comm is not None:  # under mpiexec: each rank reads its share of the plan
        from varpack.cli.agreed import run_agreed

        run_agreed(comm, lambda: _on_ranks(comm, plan, metadata, replay, carry_from, parent, quiet))
        return
    from varpack.validate import validate_plan

    reference = None if metadata is None else _reference(plan, metadata, carry_from)
    report = validate_plan(
        plan,
        reference,
        replay=replay,
        carry_source=_carry_source(metadata, carry_from),
        carry_required=carry_from is not None,
        parent=parent,
    )
    code = _verdict(plan, report, replay, quiet)
    if code:
        from varpack.sort.agree import agreed_exit

        agreed_exit(code)  # sys.exit, unless MPI was started for this one process


def _on_ranks(
    comm: Any,
    plan: str,
    metadata: str | None,
    replay: bool,
    carry_from: str | None,
    parent: str | None,
    quiet: bool = False,
) -> int:
    """``validate`` on every rank of ``comm``: rank 0 reads ``--metadata`` and prints the report;
    every rank returns the exit code. ``--replay`` is refused: it plans the whole input again in
    one process, as ``varpack plan`` does, which no share of ranks can split."""
    from varpack.errors import ConfigError
    from varpack.sort.agree import agree
    from varpack.validate import Inputs
    from varpack.validate.parallel import validate_ranks

    def refuse() -> None:
        raise ConfigError(
            "--replay plans the whole input again in one process, as varpack plan does: run "
            "varpack validate --replay without mpiexec (every other check runs under it)"
        )

    if replay:
        agree(comm, refuse)

    def inputs() -> Inputs:
        reference = None if metadata is None else _reference(plan, metadata, carry_from)
        source = _carry_source(metadata, carry_from)
        return Inputs(reference, source, carry_from is not None, parent)

    report = validate_ranks(comm, plan, inputs)
    code = 0 if report is None else _verdict(plan, report, replay, quiet)
    return int(comm.bcast(code, root=0))


def _reference(plan: str, metadata: str, carry_from: str | None) -> tuple[Any, Any]:
    """The input's (ids, lens), narrowed to the samples a ``--where`` plan selected."""
    from varpack.make import read_input

    return _selected(plan, read_input(metadata), metadata, carry_from)


def _carry_source(metadata: str | None, carry_from: str | None) -> str | None:
    """Where the carried values are checked against: ``--carry-from``, else ``--metadata``
    when it is raw metadata (a sort output holds no carried columns)."""
    if carry_from is not None or metadata is None:
        return carry_from
    from varpack.sort.output import is_sorted_output

    return None if is_sorted_output(metadata) else metadata


def _verdict(plan: str, report: Any, replay: bool, quiet: bool = False) -> int:
    """Print the violations (exit code 1) or the OK line (0; ``quiet``: nothing)."""
    from varpack.plan.figures.words import counted, layout_text, token_line

    if report.problems:
        for line in report.problems:
            click.echo(f"violation: {' '.join(line.split())}")
        click.echo(f"{plan}: {counted(len(report.problems), 'violation')}", err=True)
        return 1
    if quiet:
        return 0
    from varpack.cli.plan import bound_text, sync_text

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
        f"OK {plan}: {samples} -> {layout_text(f['steps'], f['dp'], f['grad_accum'])}; "
        f"{tokens}, {fill_text}padding {100 * f['padding_ratio']:.2f}%, "
        f"time {f['time_vs_ideal']:.3f}x ideal{bound_text(f)}{sync_text(f, f.get('sync'), True)}; "
        f"{token_line(f['tokens'])}{replayed}"
    )
    from varpack.plan.figures.stats import time_vs_ideal_legend

    click.echo(f"  ({time_vs_ideal_legend(f.get('sync') or 'step')})")
    return 0


def _selected(
    plan: str, reference: tuple[Any, Any], metadata: str, carry_from: str | None
) -> tuple[Any, Any]:
    """The metadata's samples a plan made with ``--where`` selected (the same condition, over
    ``--carry-from`` if given, else the metadata), else all of them."""
    from varpack.errors import VarpackError
    from varpack.make import select_input, where_source
    from varpack.planfile.format import read_meta

    try:
        entry = read_meta(plan).get("selection")
    except (OSError, ValueError, VarpackError):  # validate_plan refuses such a plan in one line
        return reference
    if not isinstance(entry, dict) or not isinstance(entry.get("where"), str):
        return reference
    source = carry_from if carry_from is not None else where_source(metadata, None)
    flag = f"{plan}: plan.json's selection where"  # checked as --where was when planning
    ids, lens, _ = select_input(*reference, entry["where"], source, flag)
    return ids, lens


def ok_counts(f: dict[str, Any]) -> tuple[str, str]:
    """The OK line's samples and tokens, worded as ``plan`` words them (samples, pieces after
    splitting, epochs; tokens planned = epochs x tokens kept), recomputed from the manifests:
    ``f['samples']`` counts their rows, a piece of a split document one each."""
    from varpack.plan.figures.words import counted, samples_text, tokens_text

    rows, epochs, t = f["samples"], f["epochs"], f["tokens"]
    if f["replanned"]:  # its steps hold part of the run: no input count to word them against
        what = f"{counted(rows, 'piece')} after splitting" if t and t.get("pieces") else None
        return f"{what or counted(rows, 'sample')} in its steps", tokens_text(
            f["real_tokens"], 1, None
        )
    if f["mix"]:  # the documents drawn (rows at offset 0), and their pieces
        drawn = f.get("documents", rows)
        samples = samples_text(f["input_samples"], f["dropped"], 1, None, drawn, rows)
    else:
        docs = rows // max(epochs, 1) - (int(t["pieces"]) - int(t["documents_split"]) if t else 0)
        samples = samples_text(docs + f["dropped"], f["dropped"], epochs, t)
    return samples, tokens_text(f["real_tokens"], epochs, t, f["mix"])
