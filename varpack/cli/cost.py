"""``varpack cost``: the FLOPs varpack balances for, of one sample alone, at chosen lengths."""

from __future__ import annotations

import json
from typing import Any

import click

from varpack.errors import ConfigError

#: lengths shown when none are given
DEFAULT_LENGTHS = (1024, 4096, 16384, 32768, 65536, 131072)
_MAX_LENGTH = 2**31 - 1


def _counts(values: tuple[str, ...], flag: str, what: str, example: str) -> list[int]:
    """A flag's values: repeated, or comma-separated, positive integers."""
    out = []
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= _MAX_LENGTH:
                raise ConfigError(
                    f"{flag} {part.strip()!r}: give {what} in [1, {_MAX_LENGTH}], "
                    f"repeated or comma-separated ({flag} {example})"
                )
            out.append(int(text))
    return out


def _lengths(values: tuple[str, ...]) -> list[int]:
    """``--lengths`` values (the defaults where none are given)."""
    return _counts(values, "--lengths", "token counts", "1024,32768") or list(DEFAULT_LENGTHS)


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
@click.option(
    "--patches",
    "patches",
    multiple=True,
    metavar="N[,N...]",
    help="A vision-language model: one sample's images, each by its patches before merging "
    "(t x h x w of its grid_thw); shows the vision tower's part.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the figures as numbers).")
def cost(config: str, lengths: tuple[str, ...], patches: tuple[str, ...], as_json: bool) -> None:
    """The FLOPs of one sample alone, forward and backward, that --cost flops balances.

    CONFIG is a Hugging Face config.json, a directory holding one, or a preset name
    (--model-preset's). For each length: the linear layers' FLOPs (every matmul, the LM head
    included, the experts a token visits), causal attention's (each query attends
    min(position, window) keys of its layer) and their total, 3 x the forward. Then the
    length from which attention costs more than the linear layers.

    A vision-language model (qwen2_vl, qwen2_5_vl) is costed as its language model, and with
    --patches its vision tower too: for each image, the patch embedding, every block's linear
    layers, attention over the image's patches (Qwen2.5-VL: in windows, but on its full-attention
    blocks) and the merger; then the sample's two parts and their sum at each length. Examples:

        varpack cost Qwen2.5-0.5B/config.json --lengths 1024,32768

        varpack cost Qwen2-VL-2B-Instruct/config.json --lengths 2048 --patches 1024,4096
    """
    import numpy as np

    from varpack.cli.model import read_model
    from varpack.plan.models.flops import CROSSOVER_LIMIT, TRAIN_PASSES, crossover, train_flops

    sizes = _lengths(lengths)
    images = _counts(patches, "--patches", "patch counts", "1024,4096")
    model = read_model(config)
    if images and model.vision is None:
        raise ConfigError(
            f"--patches: {model.source} has no vision tower varpack costs "
            "(give a qwen2_vl or qwen2_5_vl config.json)"
        )
    merge = model.vision.merge if model.vision is not None else 1
    odd = [n for n in images if n % (merge * merge)]
    if odd:
        raise ConfigError(
            f"--patches {odd[0]}: an image's patches are a multiple of {merge * merge} (the "
            f"merger folds {merge} x {merge} patches into one token)"
        )
    f = train_flops(np.array(sizes, dtype=np.int64), model.spec)
    cross = crossover(model.spec)
    rows = [
        {"length": s, "linear": float(a), "attention": float(b), "total": float(a + b)}
        for s, a, b in zip(sizes, f.linear, f.attention, strict=True)
    ]
    vision = _vision_rows(images, model.vision) if images and model.vision else None
    if as_json:
        out: dict[str, Any] = {
            "source": model.source,
            "digest": model.spec.digest(),
            "spec": model.spec.to_dict(),
            "passes": TRAIN_PASSES,
            "crossover": cross,
            "flops": rows,
        }
        if model.vision is not None:
            out["vision_spec"] = model.vision.to_dict()
        if vision is not None:
            out["vision"] = vision
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
    if vision is not None and model.vision is not None:
        _show_vision(vision, model.vision, rows)


def _vision_rows(images: list[int], vision: Any) -> list[dict[str, float]]:
    """The tower's training FLOPs of each image (``patches`` its t x h x w)."""
    import numpy as np

    from varpack.plan.models.vision import vision_train_flops

    f = vision_train_flops(np.array(images, dtype=np.int64), vision)
    return [
        {"patches": n, "linear": float(a), "attention": float(b), "total": float(a + b)}
        for n, a, b in zip(images, f.linear, f.attention, strict=True)
    ]


def _show_vision(vision: list[dict[str, float]], spec: Any, rows: list[dict[str, Any]]) -> None:
    """The vision tower's table, then the sample's two parts at each length."""
    from varpack.plan.models.flops import TRAIN_PASSES

    click.echo(spec.describe())
    click.echo(f"FLOPs of each image, forward and backward ({TRAIN_PASSES} x the forward):")
    click.echo(f"{'patches':>12} {'linear':>11} {'attention':>11} {'total':>11}")
    for r in vision:
        click.echo(
            f"{int(r['patches']):>12,} {r['linear']:>11.4g} {r['attention']:>11.4g} "
            f"{r['total']:>11.4g}"
        )
    tower = sum(r["total"] for r in vision)
    click.echo(f"the sample ({len(vision)} image(s), {int(sum(r['patches'] for r in vision)):,} "
               "patches) at each length:")  # fmt: skip
    click.echo(f"{'length':>12} {'text':>11} {'vision':>11} {'total':>11} {'vision share':>12}")
    for r in rows:
        total = r["total"] + tower
        click.echo(
            f"{r['length']:>12,} {r['total']:>11.4g} {tower:>11.4g} {total:>11.4g} "
            f"{tower / total:>11.1%}"
        )
