"""``varpack cost``: the FLOPs varpack balances for, of one sample alone, at chosen lengths."""

from __future__ import annotations

import json
from typing import Any

import click

from varpack.errors import ConfigError

#: lengths shown when none are given
DEFAULT_LENGTHS = (1024, 4096, 16384, 32768, 65536, 131072)
_MAX_LENGTH = 2**31 - 1


def _lengths(values: tuple[str, ...]) -> list[int]:
    """``--lengths`` values: repeated, or comma-separated, positive integers."""
    out = []
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not text.isdigit() or not 1 <= int(text) <= _MAX_LENGTH:
                raise ConfigError(
                    f"--lengths {part.strip()!r}: give token counts in [1, {_MAX_LENGTH}], "
                    "repeated or comma-separated (--lengths 1024,32768)"
                )
            out.append(int(text))
    return out or list(DEFAULT_LENGTHS)


@click.command()
@click.argument("config", metavar="CONFIG")
@click.option(
    "--lengths",
    "lengths",
    multiple=True,
    metavar="S[,S...]",
    help="Sample lengths in tokens (repeat or comma-separate) "
    f"[default: {','.join(map(str, DEFAULT_LENGTHS))}].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the figures as numbers).")
def cost(config: str, lengths: tuple[str, ...], as_json: bool) -> None:
    """The FLOPs of one sample alone, forward and backward, that --cost flops balances.

    CONFIG is a Hugging Face config.json, a directory holding one, or a preset name
    (--model-preset's). For each length: the linear layers' FLOPs (every matmul, the LM head
    included, the experts a token visits), causal attention's (each query attends
    min(position, window) keys of its layer) and their total, 3 x the forward. Then the
    length from which attention costs more than the linear layers. Example:

        varpack cost Qwen2.5-0.5B/config.json --lengths 1024,32768
    """
    import numpy as np

    from varpack.cli.model import read_model
    from varpack.plan.models.flops import CROSSOVER_LIMIT, TRAIN_PASSES, crossover, train_flops

    sizes = _lengths(lengths)
    model = read_model(config)
    f = train_flops(np.array(sizes, dtype=np.int64), model.spec)
    cross = crossover(model.spec)
    rows = [
        {"length": s, "linear": float(a), "attention": float(b), "total": float(a + b)}
        for s, a, b in zip(sizes, f.linear, f.attention, strict=True)
    ]
    if as_json:
        out: dict[str, Any] = {
            "source": model.source,
            "digest": model.spec.digest(),
            "spec": model.spec.to_dict(),
            "passes": TRAIN_PASSES,
            "crossover": cross,
            "flops": rows,
        }
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{model.source}: {model.spec.describe()}")
    click.echo(f"FLOPs of one sample alone, forward and backward ({TRAIN_PASSES} x the forward):")
    click.echo(f"{'length':>12} {'linear':>11} {'attention':>11} {'total':>11}")
    for r in rows:
        click.echo(
            f"{r['length']:>12,} {r['linear']:>11.4g} {r['attention']:>11.4g} {r['total']:>11.4g}"
        )
    if cross is None:
        capped = all(w is not None for w in model.spec.windows)
        why = ": every layer's window caps it" if capped else ""
        click.echo(
            f"attention never overtakes the linear layers (within {CROSSOVER_LIMIT:,} tokens{why})"
        )
    else:
        click.echo(f"attention overtakes the linear layers from {cross:,} tokens on")
