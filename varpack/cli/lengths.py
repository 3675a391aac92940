"""``varpack lengths``: derive metadata (sample_id, seq_len) from a tokenized Parquet dataset."""

from __future__ import annotations

from pathlib import Path

import click

from varpack.console import info
from varpack.errors import ConfigError
from varpack.metadata.lengths import AUTO, DEFAULT_COLUMN, ROWS_PER_SHARD, derive_lengths


@click.command()
@click.argument("input", type=str)
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--column", default=DEFAULT_COLUMN, help="List column holding the token ids.")
@click.option(
    "--id-column",
    default=AUTO,
    show_default=True,
    help="Integer id column; auto: sample_id, else id, where present (else the row positions).",
)
@click.option("--number-rows", is_flag=True, help="Ids are the global row positions (0, 1, ...).")
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
@click.option(
    "--keep",
    "keep",
    multiple=True,
    metavar="COL",
    help="Copy this column of the dataset (integer, float, boolean or string: source, lang, "
    "score) into the metadata, for plan --where and --carry (repeatable).",
)
@click.option(
    "--grid-column",
    "grids",
    multiple=True,
    metavar="COL",
    help="A column of each sample's image (or video) grids, [t, h, w] per image as the "
    "processor's image_grid_thw: writes vision_patches, each image's t x h x w (repeatable: "
    "image_grid_thw, video_grid_thw).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT (and --arrow-copy).")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status on stderr.")
def lengths(
    input: str,
    output: Path,
    column: str,
    id_column: str,
    number_rows: bool,
    rows_per_shard: int,
    arrow_copy: Path | None,
    keep: tuple[str, ...],
    grids: tuple[str, ...],
    overwrite: bool,
    quiet: bool,
) -> None:
    """Write metadata shards for the tokenized dataset INPUT (file, directory or glob) to OUTPUT.

    Reads one row group at a time; the length of a sample is the length of its token list.
    The ids come from --id-column: by default an integer sample_id or id column where the data
    has one, else the row positions in the sorted file order (0, 1, 2, ...), as with
    --number-rows. The reader (varpack.torch) looks for the same columns.
    With --arrow-copy PATH the same pass writes an uncompressed Arrow IPC copy of the tokens keyed
    by the same ids, which varpack.torch.ParquetTokenDataset memory-maps. --keep source copies
    a column into the metadata (then plan --where and --carry read it there). --grid-column
    image_grid_thw writes each sample's images by their patches (vision_patches), for a
    vision-language dataset that holds the processor's outputs.
    """
    if number_rows and id_column != AUTO:
        raise ConfigError(f"--number-rows and --id-column {id_column}: choose one")
    ids = None if number_rows else id_column
    result = derive_lengths(
        input, output, column, ids, rows_per_shard, overwrite, quiet, arrow_copy, keep, grids
    )
    where = "row positions" if result.id_column is None else f"column '{result.id_column}'"
    info(
        f"lengths: wrote {result.num_samples:,} samples ({result.tokens:,} tokens) "
        f"in {len(result.files)} file(s) to {output}; ids from {where}"
        + (f"; token copy {arrow_copy}" if arrow_copy is not None else ""),
        quiet,
    )
