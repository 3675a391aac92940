"""``plan_batch``'s arguments checked in its own words, before anything is looked up or planned.

Every option is checked by its exact type and range here, then handed on as a plain Python
``int`` or ``str``: the resolved-config cache (:func:`varpack.plan.batch.batch_config`) is keyed
on values that compare equal across types (``2 == 2.0 == np.int64(2)``, ``1 == True``), so a
value refused in a fresh process must be refused before the cache could answer for it, and a
value accepted once is accepted in any order. The bounds are the planner's own
(:class:`varpack.plan.config.PlanConfig`'s fields).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.plan.config import CHOICES as PLAN_CHOICES
from varpack.plan.config import COUNT_MAX, INT32_MAX, PlanConfig
from varpack.plan.model_choice import as_spec

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
    "compose": ("cost", "engine"),
}
OPTIONAL_CHOICES = ("sync", "oversize")
#: Most tokens a step may be planned to hold (dp x pp x max_tokens): its sums stay far inside
#: int64, as the planner requires of dp x grad-accum x max_tokens
STEP_TOKENS_MAX = 2**52
#: The longest sample: the planner holds lengths, budgets and micro-batch totals as int32
MAX_LENGTH = INT32_MAX
_KINDS = {"f": "floats", "c": "complex numbers", "b": "bools", "U": "strings", "S": "bytes",
          "O": "Python objects", "M": "dates", "m": "time spans", "V": "records"}  # fmt: skip


def shown(value: Any) -> str:
    """A value as a one-line message shows it: its ``repr``, or its type where that is long."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
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
        elif name == "model":
            out[name] = as_spec(value, "model")
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
    _check_model(o["cost"], o["model"], {k: o[k] for k in ("hidden", "kv_hidden", "layers")})
    if o["pad_multiple"] > o["max_tokens"]:
        raise ConfigError(
            f"pad_multiple={o['pad_multiple']} exceeds max_tokens={o['max_tokens']}: nothing "
            "fits; lower pad_multiple or raise max_tokens"
        )
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
    if o["compose"] == "engine" and (o["layout"] != "packed" or pp > 1):
        raise ConfigError(
            "compose='engine' composes the packed layout without pp; leave compose out for "
            "the others"
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
    if o["dp"] * pp * o["max_tokens"] > STEP_TOKENS_MAX:  # a step's sums stay inside int64
        raise ConfigError(
            f"dp={o['dp']} x pp={pp} x max_tokens={o['max_tokens']} is beyond what a step's "
            "token count can hold (2**52); lower one of them"
        )
    config = {k: v for k, v in o.items() if k not in ("mini_batches", "forward_only")}
    config.update(sync=sync, oversize=oversize)
    return Options(config, o["mini_batches"], o["forward_only"])


def _check_model(cost: str, model: Any, dims: dict[str, int | None]) -> None:
    """The model with ``cost="flops"``, and only there: ``model``, or Skrull's three
    dimensions (``hidden``, ``kv_hidden``, ``layers``), not both."""
    given = [k for k, v in dims.items() if v is not None]
    if cost != "flops" and (given or model is not None):
        what = "model" if model is not None else given[0]
        raise ConfigError(
            f"{what} is only used by cost='flops'; pass cost='flops' or leave {what} out"
        )
    if cost != "flops":
        return
    if model is not None and given:
        raise ConfigError(
            f"{given[0]} conflicts with model: give the model (its config.json's dict, a preset "
            "name or a ModelSpec), or Skrull's hidden, kv_hidden and layers, not both"
        )
    missing = [k for k, v in dims.items() if v is None]
    if model is None and missing:
        raise ConfigError(
            "cost='flops' needs the model: pass model (a config.json's dict, a preset name or a "
            "ModelSpec), or Skrull's hidden, kv_hidden (key/value heads x head dim) and layers "
            f"(missing {', '.join(missing)})"
        )


def lengths_array(lengths: Any) -> np.ndarray:
    """``lengths`` as ``int64``: a non-empty 1-D sequence of integers in ``[1, MAX_LENGTH]``
    (NumPy, vectorised: a look at the dtype, a min and a max)."""
    lens = _array("lengths", lengths, "one per sample")
    if len(lens) == 0:
        raise InputError("lengths: the batch holds no samples; give one length per sample")
    lens = _integers("lengths", lens)
    _at_most("lengths", lens, MAX_LENGTH, "tokens (the planner's lengths are int32)")
    low = int(np.argmin(lens))
    if lens[low] <= 0:
        raise InputError(f"lengths[{low}] = {int(lens[low])}: every length must be > 0")
    return lens.astype(np.int64, copy=False)


def group_numbers(groups: Any, n: int) -> np.ndarray | None:
    """A group number per sample (``None``: every sample on its own), from a group size or one
    integer per sample."""
    if groups is None:
        return None
    if isinstance(groups, int | np.integer) and not isinstance(groups, bool | np.bool_):
        if groups < 1:
            raise ConfigError(f"groups={groups}: a group size must be >= 1")
        return np.arange(n, dtype=np.int64) // min(int(groups), n)
    if not isinstance(groups, list | tuple) and np.ndim(groups) == 0:
        raise ConfigError(
            f"groups={shown(groups)}: give a group size (an integer >= 1) or a group number "
            f"per sample ({n})"
        )
    return per_sample(groups, n, "groups")


def per_sample(values: Any, n: int, name: str) -> np.ndarray | None:
    """One integer per sample as ``int64`` (``loss_tokens``: counts >= 0)."""
    if values is None:
        return None
    arr = _array(name, values, f"one per sample ({n})")
    if arr.shape != (n,):
        raise InputError(f"{name}: one integer per sample ({n}), not {len(arr)} of them")
    arr = _integers(name, arr)
    if name == "loss_tokens":
        _at_most(name, arr, MAX_LENGTH, "tokens (a sample holds at most as many)")
        if (arr < 0).any():
            i = int(np.argmax(arr < 0))
            raise InputError(f"loss_tokens[{i}] = {int(arr[i])} is negative; counts are >= 0")
    return arr.astype(np.int64, copy=False)  # group numbers beyond int64 map one to one


def loss_counts(values: Any, lens: np.ndarray) -> np.ndarray | None:
    """``loss_tokens``: one count per sample in ``[0, its length]``."""
    arr = per_sample(values, len(lens), "loss_tokens")
    if arr is not None and (arr > lens).any():
        i = int(np.argmax(arr > lens))
        raise InputError(
            f"loss_tokens[{i}] = {int(arr[i])} exceeds lengths[{i}] = {int(lens[i])}: a sample's "
            "loss counts at most its own tokens"
        )
    return arr


def _array(name: str, values: Any, what: str) -> np.ndarray:
    """``values`` as a 1-D NumPy array, or one line saying why it is none."""
    kind = type(values).__name__
    kind = "None" if values is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as err:  # ragged, nested unevenly, a device tensor ...
        why = "ragged or unevenly nested" if isinstance(err, ValueError) else str(err)
        raise InputError(
            f"{name}: a 1-D sequence of integers ({what}), not {kind} NumPy cannot read as "
            f"one ({why.splitlines()[0].split('. ')[0][:80]})"
        ) from None
    if arr.ndim == 0:
        raise InputError(f"{name}: a 1-D sequence of integers ({what}), not {kind}")
    if arr.ndim != 1:
        raise InputError(f"{name}: a 1-D sequence of integers ({what}), not shape {arr.shape}")
    return arr


def _integers(name: str, arr: np.ndarray) -> np.ndarray:
    """An integer array as it is; Python objects that are all integers as ``int64`` where
    they fit (one pass over the objects, only for an object array); anything else refused."""
    if arr.dtype.kind == "O":
        bad = [i for i, v in enumerate(arr.tolist())
               if not isinstance(v, int) or isinstance(v, bool)]  # fmt: skip
        if not bad:
            values = arr.tolist()
            top = max(range(len(values)), key=lambda i: abs(values[i]))
            if abs(values[top]) > np.iinfo(np.int64).max:
                raise InputError(f"{name}[{top}] = {values[top]} is too large")
            return arr.astype(np.int64)
        raise InputError(
            f"{name}[{bad[0]}] = {shown(arr[bad[0]])}: {name} are integers, not "
            f"{type(arr[bad[0]]).__name__}"
        )
    if arr.dtype.kind not in "iu":
        kind = _KINDS.get(arr.dtype.kind, str(arr.dtype))
        hint = "; cast whole numbers with .astype(int)" if arr.dtype.kind == "f" else ""
        raise InputError(f"{name}: integers, not {kind} ({arr.dtype}){hint}")
    return arr


def _at_most(name: str, arr: np.ndarray, most: int, unit: str) -> None:
    top = int(np.argmax(arr))
    if arr[top] > most:
        raise InputError(f"{name}[{top}] = {int(arr[top])} is too large: at most {most:,} {unit}")


#: ``--flag VALUE`` of a planner message: a flag, then a number, a quoted value or a choice
_FLAG = re.compile(
    r"--([a-z][a-z-]*)(?: (-?[0-9][0-9,.]*\b|'[^']*'|"
    + "|".join(sorted({rf"{c}\b" for cs in PLAN_CHOICES.values() for c in cs}, key=len)[::-1])
    + "))?"
)


def api_words(message: str) -> str:
    """A planner message in the API's words, for what plan_batch cannot check before planning
    (it checks all it can in its own words first): ``--max-tokens 0`` is ``max_tokens=0``,
    ``--dp`` is ``dp``, a sample is named by its index."""

    def flag(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return name if m.group(2) is None else f"{name}={m.group(2)}"

    return _FLAG.sub(flag, message).replace("sample_id", "sample")
