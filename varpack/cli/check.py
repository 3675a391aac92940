"""``varpack check``: validate metadata and print a summary of its lengths."""

from __future__ import annotations

import json

import click

from varpack.errors import ConfigError
from varpack.metadata.contract import ID, LEN, read_metadata, scan_input
from varpack.metadata.summary import render, summarize
from varpack.plan.oversize import preview, render_preview


@click.command()
@click.argument("input", type=str)
@click.option(
    "--key", "keys", multiple=True, help="Numeric key column to require and summarise (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 2**31 - 1),
    default=None,
    help="Preview what each --oversize choice (error, drop, split, alone) would do under this "
    "budget: documents and tokens dropped, split into how many pieces, micro-batches alone.",
)
@click.option(
    "--pad-multiple", type=click.IntRange(1, 2**31 - 1), default=1, help="As for varpack plan."
)
@click.option(
    "--split-len", type=click.IntRange(1, 2**31 - 1), default=None, help="As for varpack plan."
)
@click.option(
    "--where",
    "where",
    default=None,
    metavar="SQL",
    help="Summarise only the rows that satisfy this SQL condition over the metadata's columns "
    "(as varpack plan --where), and say how many it kept.",
)
def check(
    input: str,
    keys: tuple[str, ...],
    as_json: bool,
    max_tokens: int | None,
    pad_multiple: int,
    split_len: int | None,
    where: str | None,
) -> None:
    """Validate the metadata INPUT (file, directory or glob) and summarise it.

    Checks every rule of the metadata contract (columns and types, no nulls, sample_id >= 0 and
    unique across all files, seq_len > 0, at least one row) and prints count, tokens, length
    percentiles and a log2 histogram. Symbolic links to files and directories are followed and
    listed. Exit code 2 with one line on stderr when the input is bad. With --max-tokens N, also
    previews each --oversize choice under that budget. With --where SQL, summarises the rows
    the condition keeps.
    """
    table = read_metadata(input, keys)
    listing = scan_input(input)
    selected = None
    if where is not None:  # the same selection as varpack plan --where
        from varpack.metadata.where import check_sql, keep, where_ids

        sql = check_sql(where)
        ids = table.column(ID).to_numpy()
        kept = where_ids([str(f) for f in listing.files], sql)
        mask, selected = keep(ids, table.column(LEN).to_numpy(), kept, sql, input)
        table = table.filter(mask)
    extra = {k: table.column(k).to_numpy() for k in keys if k not in (ID, LEN)}
    summary = summarize(table.column(LEN).to_numpy(), len(listing.files), extra)
    from varpack.metadata.vision import render_vision, vision_summary

    kept_ids = None if selected is None else table.column(ID).to_numpy()
    vision = vision_summary([str(f) for f in listing.files], kept_ids)
    links = [str(p) for p in listing.links]
    over = None
    if max_tokens is not None:
        if max_tokens < pad_multiple:
            raise ConfigError(
                f"--max-tokens {max_tokens} is smaller than --pad-multiple {pad_multiple}"
            )
        over = preview(table.column(LEN).to_numpy(), max_tokens, pad_multiple, split_len)
    elif split_len is not None:
        raise ConfigError("--split-len needs --max-tokens (the budget to preview)")
    if as_json:
        extra = {**({"links": links} if links else {}), **({"oversize": over} if over else {})}
        if vision is not None:
            extra["vision"] = vision
        if selected is not None:
            extra["selection"] = selected.entry()
        click.echo(json.dumps({**summary.to_dict(), **extra}, indent=2))
    else:
        if selected is not None:
            click.echo(selected.line())
        click.echo(render(summary))
        if vision is not None:
            click.echo(render_vision(vision))
        if over is not None:
            click.echo("")
            click.echo(render_preview(over))
        if links:
            click.echo(f"followed {len(links)} symbolic link(s): {', '.join(links)}")
