"""``varpack sort``: distributed sample sort of sequence-length metadata (any number of ranks)."""

from __future__ import annotations

import click

from varpack.errors import VarpackError


@click.command()
@click.argument("input", type=click.Path())
@click.argument("output", type=click.Path())
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="COL",
    help="Sort key column, most significant first (repeatable) [default: seq_len].",
)
@click.option(
    "--descending",
    multiple=True,
    metavar="COL",
    help="Sort this key column descending (repeatable).",
)
@click.option(
    "--single-file",
    is_flag=True,
    help="Write one memory-mappable binary file instead of Parquet parts.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@click.option(
    "--oversample",
    default=1024,
    show_default=True,
    type=click.IntRange(1, 1 << 20),
    help="Splitter samples drawn per rank.",
)
def sort(
    input: str,
    output: str,
    keys: tuple[str, ...],
    descending: tuple[str, ...],
    single_file: bool,
    overwrite: bool,
    quiet: bool,
    oversample: int,
) -> None:
    """Sort metadata INPUT (file, directory or glob) into OUTPUT in global order.

    Order: the --key columns (default seq_len), then sample_id, so it is total and identical for
    any number of ranks. Runs as one process, or distributed under
    `mpiexec -n P python -m mpi4py -m varpack sort ...` (or srun). OUTPUT is a directory of
    Parquet parts with _index.json, or with --single-file one binary file.
    """
    from varpack.sort.agree import agreed_exit
    from varpack.sort.driver import SortFailed, sort_metadata

    try:
        sort_metadata(
            input,
            output,
            keys=keys or ("seq_len",),
            descending=descending,
            single_file=single_file,
            overwrite=overwrite,
            quiet=quiet,
            oversample=oversample,
        )
    except SortFailed as exc:
        if str(exc):
            click.echo(f"varpack: error: {exc}", err=True)
        agreed_exit(exc.code)
    except VarpackError as exc:
        if not getattr(exc, "agreed", False):
            raise  # not agreed by all ranks: the group's handler exits (mpi4py aborts the rest)
        click.echo(f"varpack: error: {exc}", err=True)
        agreed_exit(exc.exit_code)
