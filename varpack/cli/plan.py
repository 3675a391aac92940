"""``varpack plan``: sorted lengths (or raw metadata) -> per-rank micro-batch manifests."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

import click

from varpack.plan.config import PlanConfig


def _click_type(f: dataclasses.Field[Any], annotation: Any) -> Any:
    """The click type of a config field: its choices, else its annotation without ``None``."""
    if "choices" in f.metadata:
        return click.Choice(f.metadata["choices"])
    if "bounds" in f.metadata:
        lo, hi = f.metadata["bounds"]
        return click.IntRange(lo, hi)
    if isinstance(annotation, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation


def _option_decorators() -> list[Callable[[Any], Any]]:
    """One ``--flag`` per PlanConfig field; default None so a TOML value is not overridden."""
    out = []
    defaults = PlanConfig()
    hints = typing.get_type_hints(PlanConfig)
    for f in dataclasses.fields(PlanConfig):
        if f.name == "model_digest":  # recorded in plan.json from the model, never given
            continue
        if f.name == "model":  # a path: read into the model's spec (cli/model.py)
            out.append(
                click.option("--model", default=None, metavar="CONFIG", help=f.metadata["help"])
            )
            continue
        typ = _click_type(f, hints[f.name])
        default = getattr(defaults, f.name)
        help_text = f.metadata["help"]
        if f.name == "base_batch_size":
            help_text += " [> 0]"
        if default is not None:
            help_text += f" [default: {default}]"
        out.append(
            click.option(
                f"--{f.name.replace('_', '-')}", f.name, type=typ, default=None, help=help_text
            )
        )
    return out


def with_plan_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for deco in reversed(_option_decorators()):
        func = deco(func)
    return func


@click.command(context_settings={"show_default": False})
@click.argument("input", type=click.Path())
@click.argument("out", type=click.Path())
@click.option(
    "--config",
    "config_file",
    type=click.Path(),
    default=None,
    help="TOML file with any of the options below (flags override it).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUT.")
@click.option("--quiet", "-q", is_flag=True, help="No summary line.")
@click.option(
    "--carry",
    "carry",
    multiple=True,
    metavar="COL",
    help="Take this metadata column into the manifests as carry.COL, one value per sample "
    "(repeatable; integer, float, boolean or string columns).",
)
@click.option(
    "--carry-from",
    "carry_from",
    type=click.Path(),
    default=None,
    metavar="META",
    help="Metadata to read --carry columns from, joined by sample_id (needed when INPUT is a "
    "varpack sort output; default: INPUT).",
)
@click.option(
    "--where",
    "where",
    default=None,
    metavar="SQL",
    help="Plan only the samples whose metadata row satisfies this SQL condition over its "
    "columns (\"score > 0.5 AND lang = 'en'\"); read from INPUT, or --carry-from META when "
    "INPUT is a sort output.",
)
@click.option(
    "--mix",
    "mix",
    default=None,
    metavar="NAME=W,...",
    help="Blend the sources of --source-column at these weights (summing to 1): code=0.3,chat=0.7. "
    "Each source is repeated or subsampled to its share of the run and interleaved at it.",
)
@click.option(
    "--source-column",
    "source_column",
    default=None,
    metavar="COL",
    help="The metadata column naming each sample's source (strings or integers), for --mix; "
    "read from INPUT or --carry-from, and carried into the manifests.",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="NAME=PATH",
    help="A source of --mix by path: the samples whose metadata lies under PATH (repeat: "
    "--source code=meta/code/ --source chat=meta/chat/); instead of --source-column.",
)
@click.option(
    "--mix-unit",
    type=click.Choice(["tokens", "samples"]),
    default=None,
    help="What the --mix weights count. [default: tokens]",
)
@click.option(
    "--mix-tolerance",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="How far each step's token share of a source may be from its target (0.02: 2 points); "
    "steps outside it are counted and reported, with the distance 95% of the steps are within "
    "[default: 0.02, whatever the steps' size].",
)
@click.option(
    "--total-tokens",
    type=click.IntRange(1),
    default=None,
    help="The run's total with --mix (--mix-unit tokens) [default: the largest that repeats no source].",
)
@click.option(
    "--total-samples",
    type=click.IntRange(1),
    default=None,
    help="The run's total with --mix --mix-unit samples [default: the largest that repeats no source].",
)
@with_plan_options
def plan(
    input: str,
    out: str,
    config_file: str | None,
    overwrite: bool,
    quiet: bool,
    carry: tuple[str, ...],
    carry_from: str | None,
    where: str | None,
    mix: str | None,
    source_column: str | None,
    sources: tuple[str, ...],
    mix_unit: str | None,
    mix_tolerance: float | None,
    total_tokens: int | None,
    total_samples: int | None,
    **options: Any,
) -> None:
    """Plan training on INPUT (a `varpack sort` output, or raw metadata) into the directory OUT.

    OUT gets plan.json and one manifest per data-parallel rank (rank-00000.parquet, ...): one row
    per micro-batch in execution order with its sample ids, lengths, padded length, LR factor and
    the step's global token and sample counts. Example:

        varpack plan sorted/ plan/ --max-tokens 16384 --dp 8 --grad-accum 4 --cost flops --model-preset qwen2.5-0.5b

    Shapes: --max-shapes K (at most K shapes per rank), --pack-to L, --warmup reorder (compile
    every shape first), --pp P (one shape per pipeline step), --batching blocks (BLoad).

    Documents longer than the budget: --oversize error (the default: a split cuts an SFT sample
    from its prompt, so varpack splits only when asked), drop, alone (bounded by
    --max-alone-tokens, default 4 x --max-tokens), or split (pieces of --split-len tokens, at
    most the longest sample that fits alone; `varpack check INPUT --max-tokens N` previews each
    choice). A piece's position ids restart at 0 by default (--split-positions restart: the
    model sees no position it was not trained on at --split-len); continue numbers them from the
    piece's offset in its document.

    Metadata columns: --carry source adds a carry.source list column (one value per sample) that
    the torch reader hands to the trainer as batch.carry["source"].
    """
    from varpack.sort.agree import world

    comm = world()
    given = (config_file, carry, carry_from, where, mix, source_column, sources, mix_unit,
             mix_tolerance, total_tokens, total_samples, options)  # fmt: skip
    if comm is not None:  # under mpiexec: each rank plans a share of the samples
        from varpack.cli.agreed import run_agreed

        run_agreed(comm, lambda: _on_ranks(comm, input, out, overwrite, quiet, given))
        return
    from varpack.atomic import check_output
    from varpack.make import input_paths
    from varpack.make import plan as run_plan

    check_output(out, overwrite, input_paths(input))
    names, source, where, source_column, blend, cfg = _settings(*given)
    arrays, meta = run_plan(
        input, out, cfg, overwrite=overwrite, carry=names, carry_from=source, where=where,
        mix=blend, source_column=source_column, source_paths=_paths(sources),
    )  # fmt: skip
    _report(out, cfg, arrays, meta, quiet)


def _report(out: str, cfg: PlanConfig, arrays: Any, meta: dict[str, Any], quiet: bool) -> None:
    """What ``plan`` prints about a new plan: the mix, notes and the summary line."""
    if "mix" in meta and not quiet:
        click.echo(mix_line(meta["mix"]))
    if "mix" in meta:
        outside_line(meta["mix"])
    shapes_note(out, cfg)
    lr_note_line(arrays, cfg)
    for note in arrays.notes:
        click.echo(note, err=True)
    if "selection" in meta and not quiet:
        from varpack.metadata.where import Where

        click.echo(Where.from_entry(meta["selection"]).line())
    if not quiet:
        from varpack.plan.figures.stats import time_vs_ideal_legend

        click.echo(summary_line(out, meta, cfg, arrays))
        click.echo(f"  ({time_vs_ideal_legend(cfg.sync or 'step')})")


def _settings(
    config_file: str | None,
    carry: tuple[str, ...],
    carry_from: str | None,
    where: str | None,
    mix: str | None,
    source_column: str | None,
    sources: tuple[str, ...],
    mix_unit: str | None,
    mix_tolerance: float | None,
    total_tokens: int | None,
    total_samples: int | None,
    options: dict[str, Any],
) -> tuple[list[str], str | None, str | None, str | None, Any, PlanConfig]:
    """The flags merged over ``--config``: ``(carry names, carry source, where, source column,
    blend, config)``."""
    from varpack.errors import ConfigError
    from varpack.make import CARRY_KEYS, load_toml

    values: dict[str, Any] = load_toml(config_file) if config_file else {}

    def given(flag: Any, key: str) -> Any:  # a flag given (even "") overrides the config file
        return values.pop(key, None) if flag is None else flag

    names = list(carry) or values.pop("carry", [])
    where = _condition(where, values, config_file)
    source, mix, source_column = (
        _not_empty(given(v, k), f"--{k.replace('_', '-')}")
        for v, k in ((carry_from, "carry_from"), (mix, "mix"), (source_column, "source_column"))
    )
    sources = sources or tuple(values.pop("sources", ()))
    if mix_unit is None:
        mix_unit = values.pop("mix_unit", "tokens")
        if mix_unit not in ("tokens", "samples"):
            raise ConfigError(
                f"--config {config_file}: mix_unit is tokens or samples, not {mix_unit!r}"
            )
    mix_tolerance = given(mix_tolerance, "mix_tolerance")
    total_tokens = given(total_tokens, "total_tokens")
    total_samples = given(total_samples, "total_samples")
    values = {k: v for k, v in values.items() if k not in CARRY_KEYS}
    from varpack.cli.model import model_option, read_model_options

    if isinstance(values.get("model"), str):  # plan.toml: model = "path/to/config.json"
        values["model"] = model_option(values["model"], f"--config {config_file}: model")
    values.update(read_model_options({k: v for k, v in options.items() if v is not None}))
    cfg = PlanConfig.from_mapping(values).resolved()
    blend = None
    if mix is not None:
        from varpack.plan.mix import Mix, parse_mix

        total = total_tokens if mix_unit == "tokens" else total_samples
        if (total_samples if mix_unit == "tokens" else total_tokens) is not None:
            raise click.UsageError(f"--mix-unit {mix_unit}: give --total-{mix_unit}")
        blend = Mix(parse_mix(mix), mix_unit, total, mix_tolerance)
    elif total_tokens is not None or total_samples is not None or mix_tolerance is not None:
        raise click.UsageError("--total-tokens, --total-samples and --mix-tolerance need --mix")
    return names, source, where, source_column, blend, cfg


def _condition(where: str | None, values: dict[str, Any], config_file: str | None) -> str | None:
    """``--where`` (even ""), else the config file's ``where``, checked before any work
    (:func:`varpack.metadata.where.check_sql`) and named as given."""
    from varpack.metadata.where import check_sql

    if where is None and "where" in values:
        return check_sql(values.pop("where"), f"--config {config_file}: where")
    return None if where is None else check_sql(where)


def _not_empty(value: Any, flag: str) -> Any:
    """A text option given empty is refused, never read as not given."""
    if isinstance(value, str) and not value.strip():
        from varpack.errors import ConfigError

        raise ConfigError(f"{flag} is empty; give a value or leave the option out")
    return value


def _on_ranks(
    comm: Any, input: str, out: str, overwrite: bool, quiet: bool, given: tuple[Any, ...]
) -> int:
    """``plan`` on every rank of ``comm`` (:mod:`varpack.make.mpi`); rank 0 prints the
    summary. Returns the exit code (0)."""
    from varpack.errors import ConfigError
    from varpack.make.mpi import plan_ranks
    from varpack.make.mpi.support import not_shared
    from varpack.sort.agree import agree, unlink_shared_memory

    comm.Barrier()  # every local rank has attached MPI's shared memory by now: a rank that
    unlink_shared_memory()  # fails from here on can no longer leave it in /dev/shm

    def settings() -> tuple[list[str], str | None, str | None, PlanConfig]:
        names, source, sql, column, blend, cfg = _settings(*given)
        for value, flag in ((blend, "--mix"), (column, "--source-column")):
            if value:
                raise ConfigError(not_shared(flag))
        return names, source, sql, cfg

    names, source, sql, cfg = agree(comm, settings)
    got = plan_ranks(comm, input, out, cfg, overwrite, names, source, sql)
    if got is not None:
        _report(out, cfg, *got, quiet)
    return 0


#: more shapes per rank than this, unbounded, earn a note (a static compile builds a graph each)
SHAPES_NOTE = 32


def shapes_note(out: str, cfg: PlanConfig) -> None:
    """On stderr: a plan whose ranks meet many shapes, and the flag that bounds them."""
    if cfg.max_shapes is not None or cfg.pack_to is not None or cfg.batching == "blocks":
        return
    import json
    from pathlib import Path

    ranks = json.loads((Path(out) / "plan.json").read_text())["ranks"]
    most = max(ranks, key=lambda r: len(r["shapes"]))
    if len(most["shapes"]) > SHAPES_NOTE:
        click.echo(
            f"note: rank {most['rank']} meets {len(most['shapes']):,} shapes (ranks "
            f"{min(len(r['shapes']) for r in ranks):,} to {len(most['shapes']):,}); a static "
            "torch.compile builds a graph for each: --max-shapes 16 bounds them (about 1 point "
            "of padding when packed), or compile with dynamic shapes",
            err=True,
        )


def _paths(sources: tuple[str, ...]) -> dict[str, str] | None:
    from varpack.make.path_sources import parse_sources

    return parse_sources(sources) if sources else None


def mix_line(m: dict[str, Any]) -> str:
    """One line: each source's weight, repeat factor and share of the steps (min .. max), and
    how many steps hold every source within the tolerance."""
    from varpack.plan.figures.words import mix_text

    return mix_text(m)


def outside_line(m: dict[str, Any]) -> None:
    """On stderr: the sources some steps hold further from their target than the tolerance."""
    from varpack.plan.figures.words import mix_note

    note = mix_note(m)
    if note is not None:
        click.echo(note, err=True)


def bound_text(s: dict[str, Any]) -> str:
    """`` (bound B)``: the best any composition of the plan's windows could reach, if known."""
    b = s.get("time_vs_ideal_bound")
    return "" if b is None else f" (bound {b:.3f})"


def sync_text(s: dict[str, Any], sync: str | None, other: bool = False) -> str:
    """`` under micro sync``: the model the time is scored under (``other``: and the time
    under the other model), where the plan records both."""
    both = s.get("time_vs_ideal_by_sync")
    if not both or sync not in both:
        return ""
    rest = [f"{v:.3f}x under {k}" for k, v in both.items() if k != sync]
    return f" under {sync} sync" + (f" ({', '.join(rest)})" if other and rest else "")


def summary_line(out: str, meta: dict[str, Any], cfg: PlanConfig, arrays: Any = None) -> str:
    """The one-line summary of a new plan (thousands separators; budget fill when known): the
    samples as in ``validate`` (pieces after splitting, epochs), the tokens planned (epochs x
    tokens kept), and with ``arrays`` (the plan's) the LR factors' range and median."""
    from varpack.plan.figures.words import (
        layout_text,
        lr_text,
        mix_drawn,
        samples_text,
        token_line,
        tokens_text,
    )

    s = meta["stats"]
    fill = s.get("budget_fill")
    fill_text = "" if fill is None else f"budget fill {100 * fill:.1f}%, "
    mix = meta.get("mix")
    drawn, pieces = mix_drawn(mix)
    epochs = len(meta.get("epochs") or [0])
    t = s.get("tokens")
    lr = (
        ""
        if arrays is None or cfg.lr_scaling == "none"
        else f"; {lr_text(arrays.lr, cfg.lr_scaling)}"
    )
    return (
        f"{out}: {samples_text(meta['input']['num_samples'], s['dropped'], epochs, t, drawn, pieces)} -> "
        f"{layout_text(meta['num_steps'], cfg.dp, cfg.grad_accum)}; "
        f"{tokens_text(s['real_tokens'], epochs, t, mix is not None)}, {fill_text}"
        f"padding {100 * s['padding_ratio']:.2f}%, time {s['time_vs_ideal']:.3f}x ideal{bound_text(s)}{sync_text(s, cfg.sync)}, "
        f"imbalance max {s['imbalance_max']:.3f}, mixing {s['mixing']:.3f}{lr}; {token_line(t)}"
    )


def lr_note_line(arrays: Any, cfg: PlanConfig) -> None:
    """On stderr: the note of LR factors far from 1 and the flag that sets them, if due."""
    from varpack.plan.figures.words import lr_note

    note = lr_note(arrays.lr, cfg.lr_scaling, cfg.base_batch_size, cfg.base_unit,
                   arrays.step_samples, arrays.step_tokens)  # fmt: skip
    if note is not None:
        click.echo(note, err=True)
