"""``varpack calibrate``: fit the memory model (A, B) and the time model (a, b, or the four terms
of :mod:`varpack.plan.timefit`) from a CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from varpack.errors import InputError
from varpack.plan.cost import sample_flops
from varpack.plan.models import PRESETS, ModelDims, ModelSpec, preset_spec
from varpack.plan.models.flops import sample_train_flops

_NEEDED = ("tokens",)
_OPTIONAL = ("peak_memory", "step_time", "flops", "linear_flops", "attention_flops", "samples")
_TEXT = "kind"  # a text column: each row's kind, for the time model's errors per kind
#: a text column: the lengths of each row's samples, separated by spaces ("812 4096 77"); with a
#: model's config they give the row's linear and attention FLOPs and its sequences
_LENGTHS = "lengths"


def _read(
    path: Path,
) -> tuple[dict[str, np.ndarray], np.ndarray | None, list[np.ndarray] | None]:
    """The CSV's numeric columns (a header row names them), its kinds and each row's sample
    lengths (None without)."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte {exc.start}); write the CSV as UTF-8"
        ) from None
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from None
    if not rows:
        raise InputError(f"{path}: no rows; write a header (tokens,peak_memory,step_time) and rows")
    cols = {k.strip(): [] for k in rows[0] if k is not None}  # type: dict[str, list[float]]
    kinds = None
    if _TEXT in cols:
        del cols[_TEXT]
        key = next(k for k in rows[0] if k is not None and k.strip() == _TEXT)
        kinds = np.array([(r.get(key) or "").strip() for r in rows], dtype=str)
    lengths = None
    if _LENGTHS in cols:
        del cols[_LENGTHS]
        key = next(k for k in rows[0] if k is not None and k.strip() == _LENGTHS)
        lengths = [_row_lengths(r.get(key), path, i) for i, r in enumerate(rows, start=2)]
    for name in _NEEDED:
        if name not in cols:
            raise InputError(f"{path}: no '{name}' column; the header needs tokens and "
                             "peak_memory and/or step_time")  # fmt: skip
    for i, row in enumerate(rows, start=2):
        for key, value in row.items():
            if key is None or key.strip() not in cols:
                continue
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise InputError(f"{path}:{i}: {key.strip()} {value!r} is not a number") from None
            if not np.isfinite(v) or v < 0:
                raise InputError(f"{path}:{i}: {key.strip()} {value!r} must be finite and >= 0")
            cols[key.strip()].append(v)
    got = {k: np.array(v) for k, v in cols.items() if k in _NEEDED + _OPTIONAL}
    if lengths is not None:
        _check_lengths(lengths, got["tokens"], path)
    return got, kinds, lengths


def _row_lengths(text: str | None, path: Path, line: int) -> np.ndarray:
    """One row's sample lengths from ``"812 4096 77"``."""
    words = (text or "").split()
    if not words or not all(w.isascii() and w.isdigit() and 0 < int(w) < 2**31 for w in words):
        raise InputError(
            f"{path}:{line}: lengths {text!r} must be the row's sample lengths, positive "
            'integers separated by spaces (e.g. "812 4096 77")'
        )
    return np.array([int(w) for w in words], dtype=np.int64)


def _check_lengths(lengths: list[np.ndarray], tokens: np.ndarray, path: Path) -> None:
    """A row's tokens hold its samples (padding may add more)."""
    short = np.flatnonzero(np.array([x.sum() for x in lengths]) > tokens)
    if len(short):
        i = int(short[0])
        raise InputError(
            f"{path}:{i + 2}: tokens {tokens[i]:.0f} is less than the row's lengths add up to "
            f"({int(lengths[i].sum())}); tokens counts every token of the micro-batch"
        )


def _lengths_terms(
    lengths: list[np.ndarray], model: ModelSpec | ModelDims | None, path: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's (linear FLOPs, attention FLOPs, sequences) counted from its samples' lengths
    by the model's config: every sample alone, as the plan costs it."""
    if not isinstance(model, ModelSpec):
        raise InputError(f"{path}: a lengths column is costed by a model's config; give --model "
                         "CONFIG or --model-preset NAME")  # fmt: skip
    from varpack.plan.models.flops import train_flops

    count = np.array([len(x) for x in lengths], dtype=np.int64)
    f = train_flops(np.concatenate(lengths), model)
    starts = np.concatenate(([0], np.cumsum(count)[:-1]))
    return (
        np.add.reduceat(f.linear, starts),
        np.add.reduceat(f.attention, starts),
        count.astype(np.float64),
    )


def _terms(
    cols: dict[str, np.ndarray], path: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each row's (linear FLOPs, attention FLOPs, sequences) for the four-term time model."""
    has = [k in cols for k in ("linear_flops", "attention_flops")]
    if not any(has):  # a samples column alone is carried, as before (a·flops + b ignores it)
        return None
    if not all(has):
        raise InputError(f"{path}: the four-term time model needs both linear_flops and "
                         "attention_flops columns; add the other one")  # fmt: skip
    ones = np.ones(len(cols["tokens"]))
    return cols["linear_flops"], cols["attention_flops"], cols.get("samples", ones)


def _model(
    config: str | None, preset: str | None, hidden: int | None, kv: int | None, layers: int | None
) -> ModelSpec | ModelDims | None:
    """The model the rows' FLOPs are counted for: its config, a preset, or Skrull's dimensions."""
    given = [v is not None for v in (hidden, kv, layers)]
    if any(given) and not all(given):
        raise InputError("calibrate: give all of --hidden --kv-hidden --layers, or --model")
    if sum([config is not None, preset is not None, all(given)]) > 1:
        raise InputError(
            "calibrate: give one model: --model, --model-preset or --hidden --kv-hidden --layers"
        )
    if config is not None:
        from varpack.cli.model import read_model

        return read_model(config, "--model").spec
    if preset is not None:
        return preset_spec(preset)
    return ModelDims(hidden, kv, layers) if all(given) else None  # type: ignore[arg-type]


@click.command()
@click.argument(
    "csv_path", metavar="CSV", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--model",
    "model_config",
    metavar="CONFIG",
    default=None,
    help="The model whose FLOPs each row costs (without a flops column): a Hugging Face "
    "config.json, its directory, or a preset name.",
)
@click.option(
    "--model-preset",
    type=click.Choice(sorted(PRESETS)),
    default=None,
    help="A bundled model whose FLOPs each row costs (without a flops column).",
)
@click.option("--hidden", type=click.IntRange(1), default=None, help="Skrull's hidden size h.")
@click.option("--kv-hidden", type=click.IntRange(1), default=None, help="Skrull's key/value width.")
@click.option("--layers", type=click.IntRange(1), default=None, help="Skrull's layers.")
@click.option(
    "--memory-capacity",
    type=click.IntRange(1),
    default=None,
    help="Bytes a rank may use for activations: adds the bucket size to OUT.",
)
@click.option(
    "--holdout",
    type=click.IntRange(0),
    default=0,
    help="Keep every k-th row out of the fit and report the error predicting it.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing OUT.")
def calibrate(csv_path: Path, out: Path, model_config: str | None, model_preset: str | None,
              hidden: int | None, kv_hidden: int | None, layers: int | None,
              memory_capacity: int | None, holdout: int, overwrite: bool) -> None:  # fmt: skip
    """Fit A, B (activation bytes = A * tokens + B) and a, b (seconds = a * flops + b) from CSV.

    CSV has a header and one row per measured step: tokens, peak_memory (bytes) and/or
    step_time (seconds), optionally flops. OUT (JSON) holds the plan options to use:
    --memory-per-token, --memory-fixed (and --bucket-size with --memory-capacity),
    --time-per-flop, --time-fixed, with the fit's error in percent. With linear_flops and
    attention_flops columns (optionally samples, the sequences of each row, and kind, a text
    label), or with a lengths column (each row's sample lengths separated by spaces, costed by
    --model or --model-preset) the time fit is the four-term model instead: --time-per-linear-flop,
    --time-per-attention-flop, --time-per-sequence, --time-per-micro-batch, with the held-out
    error per kind. Example:

        varpack calibrate steps.csv calib.json --model-preset qwen2.5-0.5b --holdout 4
    """
    from varpack.atomic import atomic_file
    from varpack.plan.calibrate import calibrate as fit

    cols, kinds, lengths = _read(csv_path)
    model = _model(model_config, model_preset, hidden, kv_hidden, layers)
    seconds = cols.get("step_time")
    flops = cols.get("flops")
    terms = _terms(cols, csv_path)
    if lengths is not None:
        if terms is not None or flops is not None or "samples" in cols:
            raise InputError(f"{csv_path}: a lengths column gives each row's FLOPs and samples; "
                             "drop the flops, linear_flops, attention_flops and samples "
                             "columns, or the lengths column")  # fmt: skip
        if seconds is not None:  # the lengths price the time fit; memory needs only tokens
            terms = _lengths_terms(lengths, model, csv_path)
    if seconds is not None and flops is None and terms is None:
        if model is None:
            raise InputError("calibrate: step_time needs a flops column, --model, --model-preset "
                             "or --hidden --kv-hidden --layers")  # fmt: skip
        if isinstance(model, ModelSpec):
            flops = sample_train_flops(cols["tokens"], model)
        else:
            flops = sample_flops(cols["tokens"], model)
    if seconds is None and cols.get("peak_memory") is None:
        raise InputError(f"{csv_path}: neither peak_memory nor step_time; nothing to fit")
    result: dict[str, Any] = {"varpack_calibration": 1, "source": str(csv_path)}
    line = None if terms is not None else seconds  # a * flops + b, or the four terms
    result.update(fit(cols["tokens"], cols.get("peak_memory"), line, flops,
                      memory_capacity, holdout))  # fmt: skip
    if seconds is not None and terms is not None:
        result.update(_fit_terms(terms, seconds, kinds, holdout, result["rows"]))
    try:  # strict JSON: a figure that overflowed is refused, not written as NaN or Infinity
        text = json.dumps(result, indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise InputError(f"{csv_path}: the fit's figures overflow (not finite); give memory in "
                         "bytes and time in seconds, at realistic sizes") from None  # fmt: skip
    with atomic_file(out, overwrite, [csv_path], owned=_is_calibration) as tmp:
        tmp.write_text(text)
    click.echo(_summary(out, result))


def _fit_terms(
    terms: tuple[np.ndarray, np.ndarray, np.ndarray],
    seconds: np.ndarray,
    kinds: np.ndarray | None,
    holdout: int,
    rows: int,
) -> dict[str, Any]:
    """The four-term time model's keys (:func:`~varpack.plan.timefit.fit_time`'s, its
    ``objective`` as ``time_objective``), refusals in calibrate's words."""
    from varpack.plan.timefit import TERMS, Features, fit_time

    if rows < len(TERMS):
        raise InputError(
            f"calibrate: the time model has {len(TERMS)} terms and "
            + (f"--holdout {holdout} leaves " if holdout else "the CSV has ")
            + f"{rows} rows to fit; measure more steps"
            + (" or hold out fewer (0: none)" if holdout else "")
        )
    try:
        got = fit_time(Features(*terms), seconds, kinds, holdout)
    except InputError as exc:
        raise InputError(str(exc).replace("fit_time: ", "calibrate: ", 1)) from None
    del got["rows"], got["held_out"]
    got["time_objective"] = got.pop("objective")
    return got


def _is_calibration(path: Path) -> bool:
    try:
        return "varpack_calibration" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def _summary(out: Path, r: dict[str, Any]) -> str:
    parts = [f"{out}: {r['rows']} rows"]
    if "memory_per_token" in r:
        parts.append(f"memory {r['memory_per_token']:.4g} B/token + {r['memory_fixed']:.4g} B "
                     f"(error mean {r['memory_error']['mean_pct']:.2f}%)")  # fmt: skip
    if "time_per_flop" in r:
        held = r["time_error_held_out"]
        parts.append(f"time {r['time_per_flop']:.4g} s/FLOP + {r['time_fixed']:.4g} s (error mean "
                     f"{r['time_error']['mean_pct']:.2f}%"
                     + (f", held out {held['mean_pct']:.2f}%" if held else "") + ")")  # fmt: skip
    if "time_per_linear_flop" in r:
        parts.append(_four_terms(r))
    if "bucket_size" in r:
        parts.append(f"bucket size {r['bucket_size']} tokens")
    return "; ".join(parts)


def _four_terms(r: dict[str, Any]) -> str:
    from varpack.plan.timefit import TERMS

    line = "time " + " + ".join(f"{r[t]:.4g} {u}" for t, u in zip(
        TERMS, ("s/linear FLOP", "s/attention FLOP", "s/sequence", "s/micro-batch"), strict=True
    )) + f" (error mean {r['time_error']['mean_pct']:.2f}%"  # fmt: skip
    held = r["time_error_held_out"]
    if held:
        kinds = r["time_error_held_out_by_kind"]
        line += f", held out {held['mean_pct']:.2f}% max {held['max_pct']:.2f}%"
        if len(kinds) > 1 or next(iter(kinds)) != "all":
            line += ", by kind " + ", ".join(
                f"{k} {e['mean_pct']:.2f}% max {e['max_pct']:.2f}%" if e else f"{k} none held out"
                for k, e in kinds.items()
            )
    return line + ")"
