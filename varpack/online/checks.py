"""``plan_batch``'s arguments checked in its own words, before anything is looked up or planned.

Every option is checked by its exact type and range here, then handed on as a plain Python
``int`` or ``str``: the resolved-config cache (:func:`varpack.plan.batch.batch_config`) is keyed
on values that compare equal across types (``2 == 2.0 == np.int64(2)``, ``1 == True``), so a
value refused in a fresh process must be refused before the cache could answer for it, and a
value accepted once is accepted in any order. The bounds are the planner's own
(:class:`varpack.plan.config.PlanConfig`'s fields).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.config import COUNT_MAX, PlanConfig

#: option -> (least, most) an integer option may take: the planner's bounds of the same option
BOUNDS: dict[str, tuple[int, int]] = {
    f.name: f.metadata["bounds"] for f in fields(PlanConfig) if "bounds" in f.metadata
}
#: integer options plan_batch takes (``None`` allowed for the optional ones)
INTEGERS = ("dp", "max_tokens", "pad_multiple", "pp", "seed")
OPTIONAL_INTEGERS = ("hidden", "kv_hidden", "layers", "max_shapes")
#: option -> the names it takes (``None`` allowed for the ones with a resolved default)
CHOICES: dict[str, tuple[str, ...]] = {
    "cost": ("tokens", "padded", "flops"),
    "layout": ("packed", "padded"),
    "sync": ("micro", "step"),
    "oversize": ("alone", "split", "error"),
}
OPTIONAL_CHOICES = ("sync", "oversize")


def shown(value: Any) -> str:
    """A value as a one-line message shows it: its ``repr``, or its type where that is long."""
    text = repr(value)
    if "\n" in text or len(text) > 40:
        shape = getattr(value, "shape", None)
        return f"<{type(value).__name__}{'' if shape is None else f' of shape {shape}'}>"
    return text


def integer(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as a Python ``int`` in ``[low, high]``: an ``int`` or NumPy integer, no bool."""
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, int | np.integer)
        or not low <= value <= high
    ):
        raise ConfigError(f"{name}={shown(value)}: must be an integer in [{low}, {high}]")
    return int(value)


def choice(name: str, value: Any) -> str | None:
    """``value`` as a ``str`` of the option's choices (``None`` where the option has a default
    resolved later)."""
    if value is None and name in OPTIONAL_CHOICES:
        return None
    if not isinstance(value, str) or value not in CHOICES[name]:
        raise ConfigError(f"{name}={shown(value)}: choose {' or '.join(CHOICES[name])}")
    return str(value)


def checked_options(**given: Any) -> dict[str, Any]:
    """plan_batch's options (all but the per-sample ones) checked one by one, as plain values."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name in CHOICES:
            out[name] = choice(name, value)
        elif name in INTEGERS or (name in OPTIONAL_INTEGERS and value is not None):
            out[name] = integer(name, value, *BOUNDS[name])
        elif name == "mini_batches":
            out[name] = integer(name, value, 1, COUNT_MAX)
        elif name == "forward_only":
            if not isinstance(value, bool | np.bool_):
                raise ConfigError(f"forward_only={shown(value)}: must be True or False")
            out[name] = bool(value)
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Options:
    """plan_batch's options checked and resolved: the batch config's keyword arguments (plain
    values, the cache's key), the steps, and whether it is an inference pass."""

    config: dict[str, Any]
    mini_batches: int
    forward_only: bool


def batch_options(**given: Any) -> Options:
    """Check every option, then their combinations; fill the defaults that depend on others
    (``sync``: ``step`` with ``pp > 1``; ``oversize``: ``error`` where shapes are fixed)."""
    o = checked_options(**given)
    pp, max_shapes, sync, oversize = o["pp"], o["max_shapes"], o["sync"], o["oversize"]
    if o["forward_only"] and o["mini_batches"] != 1:
        raise ConfigError("forward_only plans one pass: leave mini_batches at 1")
    if sync is None:
        sync = "step" if pp > 1 else "micro"  # as varpack plan --pp chooses it
    elif sync == "micro" and pp > 1:
        raise ConfigError(
            f"sync='micro' conflicts with pp={pp}: pipeline stages meet their data-parallel "
            "peers once per optimizer step (after the pipeline flush); pass sync='step' or "
            "leave sync out (step is the default with pp > 1)"
        )
    if o["layout"] == "padded" and (pp > 1 or max_shapes is not None):
        what = "pp > 1" if pp > 1 else "max_shapes"
        raise ConfigError(f"{what} needs layout='packed' here (the padded layout is cut sorted)")
    if o["forward_only"] and pp == 1:
        sync = "micro"  # an inference pass: every slot balanced, whatever the trainer waits on
    shaped = "pp > 1" if pp > 1 else "max_shapes" if max_shapes is not None else None
    if oversize is None:  # a lone sample in a plan of fixed shapes would need a shape of its own
        oversize = "alone" if shaped is None else "error"
    elif oversize == "alone" and shaped is not None:
        raise ConfigError(
            f"oversize='alone' conflicts with {shaped}: a lone oversize sample would need a "
            "shape of its own; pass oversize='split' or 'error', or leave oversize out (error "
            "is the default there)"
        )
    config = {k: v for k, v in o.items() if k not in ("mini_batches", "forward_only")}
    config.update(sync=sync, oversize=oversize)
    return Options(config, o["mini_batches"], o["forward_only"])
