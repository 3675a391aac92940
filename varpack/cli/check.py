"""``varpack check``: validate metadata and print a summary of its lengths."""

from __future__ import annotations

import json

import click

from varpack.metadata.contract import ID, LEN, read_metadata, scan_input
from varpack.metadata.summary import render, summarize


@click.command()
@click.argument("input", type=str)
@click.option(
    "--key", "keys", multiple=True, help="Numeric key column to require and summarise (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def check(input: str, keys: tuple[str, ...], as_json: bool) -> None:
    """Validate the metadata INPUT (file, directory or glob) and summarise it.

    Checks every rule of the metadata contract (columns and types, no nulls, sample_id >= 0 and
    unique across all files, seq_len > 0, at least one row) and prints count, tokens, length
    percentiles and a log2 histogram. Symbolic links to files and directories are followed and
    listed. Exit code 2 with one line on stderr when the input is bad.
    """
    table = read_metadata(input, keys)
    listing = scan_input(input)
    extra = {k: table.column(k).to_numpy() for k in keys if k not in (ID, LEN)}
    summary = summarize(table.column(LEN).to_numpy(), len(listing.files), extra)
    links = [str(p) for p in listing.links]
    if as_json:
        click.echo(
            json.dumps({**summary.to_dict(), **({"links": links} if links else {})}, indent=2)
        )
    else:
        click.echo(render(summary))
        if links:
            click.echo(f"followed {len(links)} symbolic link(s): {', '.join(links)}")
