"""``varpack lengths``: derive metadata (sample_id, seq_len) from a tokenized Parquet dataset."""

from __future__ import annotations

from pathlib import Path

import click

from varpack.console import info
from varpack.metadata.lengths import DEFAULT_COLUMN, ROWS_PER_SHARD, derive_lengths


@click.command()
@click.argument("input", type=str)
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--column", default=DEFAULT_COLUMN, help="List column holding the token ids.")
@click.option("--id-column", default=None, help="Integer id column; default: global row position.")
@click.option(
    "--rows-per-shard",
    type=click.IntRange(min=1),
    default=ROWS_PER_SHARD,
    help="Rows per output file.",
)
@click.option(
    "--arrow-copy",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the memory-mappable Arrow IPC copy of the tokens (sample_id, input_ids) "
    "here, in the same pass; the fast input for the torch reader.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT (and --arrow-copy).")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status on stderr.")
def lengths(
    input: str,
    output: Path,
    column: str,
    id_column: str | None,
    rows_per_shard: int,
    arrow_copy: Path | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Write metadata shards for the tokenized dataset INPUT (file, directory or glob) to OUTPUT.

    Reads one row group at a time; the length of a sample is the length of its token list.
    Without --id-column, ids are row positions in the sorted file order (0, 1, 2, ...).
    With --arrow-copy PATH the same pass writes an uncompressed Arrow IPC copy of the tokens keyed
    by the same ids, which varpack.torch.ParquetTokenDataset memory-maps.
    """
    result = derive_lengths(
        input, output, column, id_column, rows_per_shard, overwrite, quiet, arrow_copy
    )
    info(
        f"lengths: wrote {result.num_samples:,} samples ({result.tokens:,} tokens) "
        f"in {len(result.files)} file(s) to {output}"
        + (f"; token copy {arrow_copy}" if arrow_copy is not None else ""),
        quiet,
    )
