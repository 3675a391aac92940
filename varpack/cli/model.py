"""The model a command costs samples for: a ``config.json`` read from disk, or a preset's.

Reading the file is the CLI's job (the planner takes the parsed spec): :func:`read_model` opens
a Hugging Face ``config.json`` (or the one in a directory), parses it, and returns the spec with
the name to show; a model_type varpack does not know prints its note on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import click

from varpack.errors import InputError
from varpack.plan.models import ModelSpec, preset_key, preset_spec, spec_from_config, unknown_note
from varpack.plan.models.presets import PRESET_CONFIGS
from varpack.plan.models.vision import VisionSpec, vision_from_config


class Model(NamedTuple):
    """A spec and where it came from (a path, or ``preset NAME (repo)``); ``vision``: the
    vision tower of a vision-language model (None for a language model)."""

    spec: ModelSpec
    source: str
    vision: VisionSpec | None = None


def config_path(path: str | Path) -> Path:
    """``path`` itself, or its ``config.json`` when it is a directory."""
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def read_config(path: str | Path, flag: str = "--model") -> ModelSpec:
    """The language model's spec of the config.json at ``path`` (a file, or a directory
    holding one); a vision-language model's tower is said on stderr: plans balance the
    language model's part (``varpack cost --patches`` shows the tower's)."""
    spec, vision = _read(path, flag)
    if vision is not None:
        click.echo(
            f"note: {config_path(path)}: {spec.model_type}: samples are costed by their "
            "language model's part; `varpack cost --patches` shows the vision tower's",
            err=True,
        )
    return spec


def _read(path: str | Path, flag: str) -> tuple[ModelSpec, VisionSpec | None]:
    """The language model's spec of the config.json at ``path``, and its vision tower's."""
    p = config_path(path)
    if not p.is_file():
        what = f"{path} holds no config.json" if Path(path).is_dir() else f"{path}: no such file"
        raise InputError(f"{flag} {what}; give a Hugging Face config.json or its directory")
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text; give a Hugging Face config.json") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{p}: not JSON (line {exc.lineno}: {exc.msg}); give a Hugging Face config.json"
        ) from None
    spec = spec_from_config(config, str(p))
    note = unknown_note(spec, str(p))
    if note is not None:
        click.echo(f"note: {note}", err=True)
    return spec, vision_from_config(config, str(p))


def read_model(name: str, flag: str = "CONFIG") -> Model:
    """A config.json path, a directory holding one, or a preset name (a path wins)."""
    p = Path(name)
    if p.exists():
        spec, vision = _read(p, flag)
        return Model(spec, str(config_path(p)), vision)
    key = preset_key(name)
    if key is None:
        raise InputError(
            f"{flag} {name!r} is neither a file, a directory holding a config.json, nor a "
            f"preset ({', '.join(sorted(PRESET_CONFIGS))})"
        )
    return Model(preset_spec(key), f"preset {key} ({PRESET_CONFIGS[key][0]})")


def read_model_options(options: dict[str, Any]) -> dict[str, Any]:
    """Plan ``options`` with ``--model CONFIG`` read into the model's spec."""
    if isinstance(options.get("model"), str):
        return {**options, "model": model_option(options["model"])}
    return options


def model_option(path: str, flag: str = "--model") -> ModelSpec | str:
    """The spec of the config.json at ``path`` (or in it, a directory); a preset's name (not a
    path) stays a name, which the plan's config resolves as ``--model-preset`` would."""
    if not Path(path).exists() and preset_key(path) is not None:
        return path
    return read_config(path, flag)
