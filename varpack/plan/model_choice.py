"""Which model ``--cost flops`` and ``--cost time`` price samples for: a plan's model options.

One of three, per plan:

* ``--model`` (the config's ``model``): the model's :class:`ModelSpec`, which the CLI reads from
  a Hugging Face config.json; the Python API also takes the spec's dict as plan.json records it,
  a parsed config.json, or a preset's name;
* ``--model-preset NAME``: a bundled model (:mod:`varpack.plan.models.presets`);
* ``--hidden --kv-hidden --layers``: no model, Skrull's approximation from three dimensions
  (with ``--model-preset`` only where they are the preset's, as plans made before varpack read
  configs record them).

The resolved config holds the spec (``model``) and its digest (``model_digest``); plan.json
records both, so a plan made again from its plan.json prices samples alike, and a config whose
spec no longer matches its digest (edited by hand) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from varpack.errors import ConfigError
from varpack.plan.models import PRESETS, ModelSpec, preset_key, preset_spec, spec_from_config
from varpack.plan.models.presets import PRESET_CONFIGS

#: the options that say which model a plan is priced for
MODEL_KEYS = ("model_preset", "model", "model_digest", "hidden", "kv_hidden", "layers")
_DIMS = ("hidden", "kv_hidden", "layers")


def as_spec(value: Any, where: str = "model") -> ModelSpec | None:
    """``value`` as a spec: a spec, its dict (plan.json's), a parsed config.json (it has
    ``hidden_size``) or a preset's name; None stays None.

    >>> as_spec("qwen2.5-0.5b") == as_spec(as_spec("qwen2.5-0.5b").to_dict())
    True
    """
    if value is None or isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        key = preset_key(value)
        if key is None:
            raise ConfigError(
                f"{where} {value!r} is not a preset ({', '.join(sorted(PRESET_CONFIGS))}); give "
                "a model's config.json (its parsed dict, or its path to varpack plan --model)"
            )
        return preset_spec(key)
    if isinstance(value, Mapping):
        if "hidden_size" in value:
            return spec_from_config(value, where)
        return ModelSpec.from_dict(value, where)
    raise ConfigError(f"{where}: give a config.json's dict, a preset name or a ModelSpec")


def resolve_model(cfg: Any) -> Any:
    """``cfg`` (a PlanConfig) with its model resolved: the spec and its digest filled in from
    ``--model`` or the preset; Skrull's dimensions checked. Refuses what conflicts."""
    dims = {k: getattr(cfg, k) for k in _DIMS}
    given = [k for k, v in dims.items() if v is not None]
    named = [f for f, v in (("--model", cfg.model), ("--model-preset", cfg.model_preset)) if v]
    if cfg.cost not in ("flops", "time"):
        if named or given:
            what = named[0] if named else f"--{_flag(given[0])}"
            raise ConfigError(
                f"{what} is only used by --cost flops (or time); add --cost flops or remove it"
            )
        if cfg.model_digest is not None:
            raise ConfigError("model_digest is only used with a model (--cost flops)")
        return cfg
    spec = as_spec(cfg.model, "--model")
    key = None
    if cfg.model_preset is not None:
        key = preset_key(cfg.model_preset)
        if key is None:
            raise ConfigError(
                f"--model-preset {cfg.model_preset!r} is unknown; choose one of "
                f"{', '.join(sorted(PRESET_CONFIGS))}"
            )
    if given:
        return _skrull(cfg, dims, given, key, spec)
    _same_digest(spec, cfg.model_digest)  # a recorded spec edited since: refused first
    if key is not None:
        if spec is not None and spec != preset_spec(key):
            raise ConfigError(
                "--model conflicts with --model-preset (another model); give one of them"
            )
        spec = preset_spec(key)
    if spec is None:
        raise ConfigError(
            f"--cost {cfg.cost} needs the model it prices: --model CONFIG (its config.json), "
            "--model-preset NAME, or Skrull's approximation's three dimensions (--hidden, --kv-hidden, "
            "--layers)"
        )
    _same_digest(spec, cfg.model_digest)
    return dataclasses.replace(cfg, model_preset=key, model=spec, model_digest=spec.digest())


def _same_digest(spec: ModelSpec | None, digest: str | None) -> None:
    if digest is not None and (spec is None or spec.digest() != digest):
        found = "no model" if spec is None else spec.digest()
        raise ConfigError(
            f"model_digest {digest} does not match the model's fields ({found}): the config "
            "was edited after planning; plan again from the model's config.json"
        )


def _skrull(
    cfg: Any, dims: dict[str, Any], given: list[str], key: str | None, spec: ModelSpec | None
) -> Any:
    """Skrull's approximation from ``--hidden --kv-hidden --layers``."""
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise ConfigError(
            f"Skrull's approximation needs all three dimensions (--hidden, --kv-hidden, --layers; "
            f"missing: --{_flag(missing[0])}); or give the model: --model CONFIG or --model-preset NAME"
        )
    if spec is not None or cfg.model_digest is not None:
        raise ConfigError(
            f"--{_flag(given[0])} conflicts with --model: give the model (--model or "
            "--model-preset) or Skrull's dimensions (--hidden, --kv-hidden, --layers), not both"
        )
    if key is not None:
        preset = PRESETS[key]
        if any(dims[k] != getattr(preset, k) for k in _DIMS):
            differ = next(k for k in _DIMS if dims[k] != getattr(preset, k))
            raise ConfigError(
                f"--{_flag(differ)} conflicts with --model-preset; give a preset or the dimensions"
            )
    return dataclasses.replace(cfg, model_preset=key)


def model_options(parent: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """A parent plan's config dict for a child given ``options``: where they name a model
    (or Skrull's dimensions), the parent's model options give way to them."""
    if any(options.get(k) is not None for k in MODEL_KEYS):
        return {k: v for k, v in parent.items() if k not in MODEL_KEYS}
    return parent


def _flag(name: str) -> str:
    return name.replace("_", "-")


def model_rows(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``inspect``'s line naming the model a plan's config (plan.json's) prices samples for.

    >>> model_rows({"cost": "flops", "hidden": 8, "kv_hidden": 2, "layers": 1})
    [('model', "Skrull's approximation: hidden 8, kv hidden 2, 1 layers")]
    """
    if config.get("cost") not in ("flops", "time"):
        return []
    if isinstance(config.get("model"), Mapping):
        spec = ModelSpec.from_dict(config["model"], "plan.json config.model")
        name = f"{config['model_preset']}, " if config.get("model_preset") else ""
        return [("model", f"{name}{spec.describe()} ({config.get('model_digest')})")]
    dims = ", ".join(f"{k.replace('_', ' ')} {config.get(k)}" for k in _DIMS[:2])
    return [("model", f"Skrull's approximation: {dims}, {config.get('layers')} layers")]
