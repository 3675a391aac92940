"""``varpack synth``: write synthetic length metadata or a tokenized dataset."""

from __future__ import annotations

from pathlib import Path

import click

from varpack.console import info
from varpack.metadata.synth import DEFAULT_VOCAB, DISTS, write_synth
from varpack.metadata.synth_tokens import PATTERNS

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


class Count(click.ParamType):
    """A positive count written as ``1000000``, ``1_000_000``, ``1e6`` or ``1M``."""

    name = "count"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().replace("_", "").upper()
        try:
            if text and text[-1] in _SUFFIX:
                number = float(text[:-1]) * _SUFFIX[text[-1]]
            else:
                number = float(text)
        except ValueError:
            self.fail(f"{value!r} is not a count (e.g. 1000000, 1e6, 100M)", param, ctx)
        if number != int(number) or number < 1:
            self.fail(f"{value!r} is not a positive whole number", param, ctx)
        return int(number)


@click.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--dist", type=click.Choice(DISTS), default="long-tail", help="Length distribution.")
@click.option("--num-samples", "-n", type=Count(), default="1M", help="Samples (1e6, 100M, ...).")
@click.option(
    "--shards", type=click.IntRange(min=1), default=8, help="Output files (unequal sizes)."
)
@click.option("--seed", type=click.IntRange(min=0), default=0, help="Same seed, same bytes.")
@click.option(
    "--min-len", type=click.IntRange(min=1), default=None, help="Override the lower bound."
)
@click.option(
    "--max-len", type=click.IntRange(min=1), default=None, help="Override the upper bound."
)
@click.option("--tokenized", is_flag=True, help="Write sample_id + random input_ids instead.")
@click.option(
    "--vocab-size", type=click.IntRange(min=1), default=DEFAULT_VOCAB, help="Token ids in [0, V)."
)
@click.option(
    "--pattern",
    type=click.Choice(PATTERNS),
    default="random",
    help="With --tokenized: random ids (nothing to learn), or count: each sample counts up by "
    "one from a random id, wrapping at --vocab-size (a model learns it in a few steps).",
)
@click.option(
    "--row-group-size", type=click.IntRange(min=1), default=None, help="Rows per row group."
)
@click.option(
    "--sources",
    type=click.IntRange(min=0, max=1000),
    default=0,
    help="Add a 'source' string column with this many sources (web, code, books, ...; skewed "
    "like a mixture), for varpack plan --carry source. [default: none]",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status on stderr.")
def synth(
    output: Path,
    dist: str,
    num_samples: int,
    shards: int,
    seed: int,
    min_len: int | None,
    max_len: int | None,
    tokenized: bool,
    vocab_size: int,
    pattern: str,
    row_group_size: int | None,
    sources: int,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Write synthetic metadata (sample_id, seq_len) shards into the directory OUTPUT.

    Distributions: long-tail (chat: median ~300 tokens, 2% tail of 10K-128K), bimodal (40% below
    8K, the rest up to 128K), video (frame counts 3-94, mean ~22.3), uniform (64-8192). Ids are
    unique, shuffled and sparse; shard sizes are unequal. With --tokenized, write a dataset of
    token lists (sample_id, input_ids) with the same ids and lengths instead, random or, with
    --pattern count, learnable.
    """
    result = write_synth(
        output,
        dist,
        num_samples,
        shards,
        seed,
        tokenized=tokenized,
        vocab_size=vocab_size,
        pattern=pattern,
        min_len=min_len,
        max_len=max_len,
        row_group_size=row_group_size,
        overwrite=overwrite,
        quiet=quiet,
        sources=sources,
    )
    what = "tokenized samples" if tokenized else "samples"
    info(
        f"synth: wrote {result.num_samples:,} {what} ({result.tokens:,} tokens, {dist}) "
        f"in {len(result.files)} file(s) to {output}",
        quiet,
    )
