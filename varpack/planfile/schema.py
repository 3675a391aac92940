"""plan.json's schema: the keys every reader relies on and their JSON types, checked before use.

A plan.json that was edited by hand or damaged must give one line per problem, naming the key and
what was expected (``plan.json ranks: expected a list of rank entries, found an object``), never
a ``KeyError`` or ``TypeError`` deep inside a reader. Two levels: :data:`CORE` is what every
reader needs (layout, step count, the rank entries, the plan fingerprint), :data:`FULL` adds what
``inspect`` shows and ``validate`` recomputes (config, input, epochs, shape lengths, dropped
samples, stats). The config's option types come from :class:`varpack.plan.config.PlanConfig`
itself, so a new option is checked without touching this module. The specs are built from the
type checks of :mod:`varpack.planfile.spec`.

Plans outlive versions: :data:`ADDED` names each key that a plan.json version introduced, with
that version. A plan of an earlier version is read and validated without them (its config
resolves such an option to its default, which only ``--replay`` would use, and ``--replay``
refuses older plans), so every new key must be recorded there together with a new
:data:`varpack.planfile.format.VERSION`.

The plan fingerprint (:func:`plan_fingerprint`) is a sha256 over the config, the input's identity
and each rank file's name, rows and sha256: ``varpack plan`` records it, and a reader recomputes
it from plan.json alone, so a config edited after planning is caught without reading any rows.
From version 2, ``checksum`` (:func:`plan_checksum`) is a sha256 over every other key of
plan.json (the input's path aside): a flipped bit or an edit anywhere in it (a figure, the step count) is caught by every
reader, not only by what ``validate`` recomputes.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from dataclasses import fields
from functools import cache
from typing import Any

from varpack.errors import VarpackError
from varpack.plan.config import PlanConfig
from varpack.plan.context import OPTIONAL_KEYS
from varpack.plan.models import ModelSpec
from varpack.plan.sync import SYNC_MODELS
from varpack.planfile.spec import (
    NUMBER,
    SHA256,
    STRING,
    Spec,
    check,
    integer,
    list_of,
    nullable,
    obj,
)

#: plan.json's key for the fingerprint of config + input + manifests
FINGERPRINT_KEY = "plan_fingerprint"
#: plan.json's key for the sha256 over all its other keys (version 2 on)
CHECKSUM_KEY = "checksum"
#: keys plan.json gained after version 1 (``section.key``), with the version that added them: a
#: plan of an earlier version lacks them, and its readers and ``validate`` do without
ADDED = {
    "config.balance_fill": 2,
    "stats.time_vs_ideal_bound": 2,
    "stats.fill_given_up": 2,
    CHECKSUM_KEY: 2,
    "parent": 3,
    "selection": 3,
    "mix": 3,
    "config.sync": 4,
    "stats.time_vs_ideal_by_sync": 4,
}


def absent(meta: dict[str, Any], section: str = "") -> set[str]:
    """Keys of ``section`` (``config``, ``stats``; ``""``: the top level) that a plan of
    ``meta``'s version may lack: those a later version added."""
    version = meta.get("version")
    version = version if isinstance(version, int) else 0
    names = (key.rpartition(".") for key, added in ADDED.items() if added > version)
    return {name for where, _, name in names if where == section}


#: the model a plan was balanced for: resolved when planned (``--sync`` unset means micro, or
#: step with ``--pp``), so plan.json never holds null; a plan from before ``--sync`` has none
SYNC = Spec(f"one of {', '.join(SYNC_MODELS)}", lambda v: isinstance(v, str) and v in SYNC_MODELS)
#: the options a reader of the rows reads without resolving the config (the torch reader's
#: layout and pieces, the trainer's sync advice): checked by every reader, not only ``full``
READ_OPTIONS = ("sync", "layout", "batching", "oversize", "split_positions", "split_len")


@cache
def _option_specs() -> dict[str, Spec]:
    """Every PlanConfig option with its JSON type (nullable where the option may be None)."""
    hints = typing.get_type_hints(PlanConfig)
    model = Spec("an object of the model's fields", lambda v: isinstance(v, dict))
    simple = {int: integer(), float: NUMBER, str: STRING, ModelSpec: model}
    keys: dict[str, Spec] = {}
    for f in fields(PlanConfig):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType):  # X | None
            (base,) = [a for a in typing.get_args(hint) if a is not type(None)]
            keys[f.name] = nullable(simple[base])
        else:
            keys[f.name] = simple[hint]
    return {**keys, "sync": SYNC}


@cache
def _config_spec(version: int = 1 << 30) -> Spec:
    """Every PlanConfig option with its type (plan.json holds the fully resolved config); the
    options a version after ``version`` added are optional."""
    keys = _option_specs()
    # long-context options appear only where used (plan.json keeps the bytes of other plans)
    later = absent({"version": version}, "config")
    optional = {k: v for k, v in keys.items() if k in OPTIONAL_KEYS or k in later}
    required = {k: v for k, v in keys.items() if k not in optional}
    return obj("an object of plan options", required, optional)


_RANK = obj(
    "a rank entry (an object)",
    {"rank": integer(0), "file": STRING, "rows": integer(0), "sha256": SHA256},
    {"shapes": list_of(list_of(integer(0), "a [rows, pad_to] pair"), "a list of shapes")},
)
#: the carried metadata columns (``varpack plan --carry``), where the plan has any
_CARRY_TYPES = ("int64", "float64", "bool", "string")
_CARRY = obj(
    "an object {from, columns}",
    {
        "from": STRING,
        "columns": list_of(
            obj(
                "a carried column {name, type}",
                {
                    "name": Spec("a column name", lambda v: isinstance(v, str) and v != ""),
                    "type": Spec(f"one of {', '.join(_CARRY_TYPES)}", lambda v: v in _CARRY_TYPES),
                },
            ),
            "a list of carried columns",
        ),
    },
)
#: a plan made by ``varpack replan``: the plan it continues and the step it continues from
_PARENT = obj(
    "an object {plan, plan_fingerprint, from_step}",
    {"plan": STRING, "plan_fingerprint": SHA256, "from_step": integer(0)},
)
#: ``--where``: the SQL condition that selected the planned samples, and what it kept
_SELECTION = obj(
    "an object {where, from, samples, tokens, kept_samples, kept_tokens}",
    {
        "where": STRING,
        "from": STRING,
        "samples": integer(0),
        "tokens": integer(0),
        "kept_samples": integer(0),
        "kept_tokens": integer(0),
    },
)
#: ``--mix``: the blend's weights, each source's figures and its share of the steps
_MIX = obj(
    "an object {column, unit, total, tolerance, sources, shares}",
    {
        "column": STRING,
        "unit": Spec("tokens or samples", lambda v: v in ("tokens", "samples")),
        "total": integer(0),
        "tolerance": Spec(
            "a number in (0, 1]", lambda v: isinstance(v, int | float) and 0 < v <= 1
        ),
        "sources": Spec("an object", lambda v: isinstance(v, dict)),
        "shares": Spec("an object", lambda v: isinstance(v, dict)),
    },
)
#: keys a plan has only where a feature uses them
OPTIONAL = {
    "mix": _MIX,
    FINGERPRINT_KEY: SHA256,
    "carry": _CARRY,
    "checksum": SHA256,
    "parent": _PARENT,
    "selection": _SELECTION,
}
#: what every reader needs (the torch reader, inspect, validate)
CORE = {
    "layout": obj(
        "an object {dp, pp, cp, grad_accum}",
        {"dp": integer(1), "pp": integer(1), "cp": integer(1), "grad_accum": integer(1)},
    ),
    "num_steps": integer(0),
    "ranks": list_of(_RANK, "a list of rank entries"),
}
_STAT_NUMBERS = (
    "real_tokens padded_tokens padding_ratio num_micro_batches micro_batches_per_rank "
    "imbalance_mean imbalance_max time_vs_ideal lr_factor_min lr_factor_max step_samples_min "
    "step_samples_max step_tokens_min step_tokens_max mixing"
).split()
_SHAPE_STAT = obj(
    "a shape's figures (an object)",
    {
        "shape": list_of(integer(), "a [rows, pad_to] pair"),
        "micro_batches": integer(),
        "padding": integer(),
        "padded_tokens": integer(),
    },
)
# Types only: the values are recomputed by validate (some, like pp_extra_padding, may be < 0).
_STATS = obj(
    "an object of figures",
    {
        **{k: NUMBER for k in _STAT_NUMBERS},
        "shapes_per_rank": list_of(integer()),
        "cost": STRING,
    },
    {
        "shapes": list_of(_SHAPE_STAT, "a list of shapes' figures"),
        "num_shapes": integer(),
        "oversize_alone": list_of(integer()),
        "warmup_rows": list_of(integer()),
        "pad_rows": integer(),
        "pad_row_tokens": integer(),
        "pp_extra_padding": integer(),
        "pp_extra_padding_ratio": NUMBER,
        "budget_fill": nullable(NUMBER),
        "blocks": obj("an object of block figures", {}),
        "tokens": obj(
            "an object of token figures (kept, split, dropped)",
            {
                **{k: integer(0) for k in "total kept split dropped".split()},
                **{k: NUMBER for k in "kept_share split_share dropped_share".split()},
                "documents_split": integer(0),
                "pieces": integer(0),
            },
        ),
    },
)
#: what inspect shows and validate recomputes, on top of CORE
FULL = {
    **CORE,
    "config": _config_spec(),  # a plan of an earlier version: _full(version)
    "input": obj(
        "an object {num_samples, total_tokens, fingerprint, source}",
        {
            "num_samples": integer(0),
            "total_tokens": integer(0),
            "fingerprint": STRING,
            "source": STRING,
        },
    ),
    "epochs": list_of(
        obj(
            "an epoch entry (an object)",
            {"epoch": integer(0), "first_step": integer(0), "num_steps": integer(0)},
        ),
        "a list of epoch entries",
    ),
    "shape_lengths": nullable(list_of(integer(1))),
    "stats": _STATS,
    "dropped": list_of(
        obj("a dropped sample (an object)", {"sample_id": integer(0), "seq_len": integer(1)}),
        "a list of dropped samples",
    ),
}


def _full(meta: Any) -> dict[str, Spec]:
    """:data:`FULL` for the plan's version (an earlier one lacks the options added since)."""
    version = meta.get("version") if isinstance(meta, dict) else None
    if not isinstance(version, int):
        return FULL
    return {**FULL, "config": _config_spec(version)}


def meta_problems(meta: Any, full: bool = False) -> list[str]:
    """Every problem of plan.json's content against :data:`CORE` (``full``: :data:`FULL`), one
    line each; then the cross-key rules (dp rank entries numbered 0..dp-1, a valid config)."""
    out: list[str] = []
    read = obj("an object of plan options", {}, {k: _option_specs()[k] for k in READ_OPTIONS})
    check(
        obj("an object", _full(meta) if full else CORE, OPTIONAL | {"config": read}), meta, "", out
    )
    if out:
        return out
    if len(meta["ranks"]) != meta["layout"]["dp"]:
        out.append(
            f"plan.json layout dp does not match the {len(meta['ranks'])} rank entries "
            f"(dp is {meta['layout']['dp']})"
        )
    wrong = [i for i, r in enumerate(meta["ranks"]) if r["rank"] != i]
    if wrong:
        out.append(
            f"plan.json ranks[{wrong[0]}].rank is {meta['ranks'][wrong[0]]['rank']}, not {wrong[0]}"
        )
    if full:
        try:
            cfg = config_of(meta)
        except VarpackError as exc:
            out.append(f"plan.json config is invalid: {exc}")
        else:
            out.extend(unresolved(meta["config"], cfg))
    return out


def unresolved(config: dict[str, Any], cfg: PlanConfig) -> list[str]:
    """plan.json's options left null that its config resolves to a value (the default split
    length, a preset's model dimensions, the budget ``--pack-to`` sets), one line each: plan.json
    records each option as the plan was made with it, and a null there claims another plan.

    >>> cfg = PlanConfig(max_tokens=64, oversize="split").resolved()
    >>> unresolved({"split_len": None, "pack_to": None}, cfg)  # doctest: +ELLIPSIS
    ['plan.json config.split_len: null, but the config resolves it to 64 (...)']
    """
    values = cfg.to_dict()
    return [
        f"plan.json config.{key}: null, but the config resolves it to {values[key]!r} (plan.json "
        "records each option as the plan was made with it)"
        for key, value in config.items()
        if value is None and values.get(key) is not None
    ]


def config_of(meta: dict[str, Any], where: str = "plan.json config") -> PlanConfig:
    """plan.json's config, resolved. A plan from before ``--sync`` (version 3 and older) was
    balanced once per step: it reads as ``sync = "step"``, whatever the default now."""
    values = dict(meta.get("config", {}))
    if "sync" in absent(meta, "config"):
        values.setdefault("sync", "step")
    return PlanConfig.from_mapping(values, where=where).resolved()


def plan_fingerprint(meta: dict[str, Any]) -> str:
    """sha256 over a canonical JSON of the config, the input's identity (its path left out, so a
    moved input keeps it), each rank file's name, rows and sha256, and the carried columns'
    names and types where the plan has any (a plan without keeps the fingerprint it had)."""
    info = meta.get("input")
    body = {
        "config": meta.get("config"),
        "input": {k: v for k, v in info.items() if k != "source"}
        if isinstance(info, dict)
        else info,
        "ranks": [[r.get("file"), r.get("rows"), r.get("sha256")] for r in meta.get("ranks", [])],
    }
    carry = meta.get("carry")
    if carry is not None:
        body["carry"] = carry.get("columns") if isinstance(carry, dict) else carry
    parent = meta.get("parent")
    if parent is not None:  # a replanned plan: its lineage is part of its identity
        body["parent"] = (
            {k: v for k, v in parent.items() if k != "plan"} if isinstance(parent, dict) else parent
        )
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint_problem(meta: dict[str, Any], manifests_ok: bool = True) -> str | None:
    """Why plan.json's recorded fingerprint does not fit its content (``None``: it does, or none
    is recorded). ``manifests_ok``: the rank files matched their checksums, so what changed is
    the config or the input in plan.json."""
    recorded = meta.get(FINGERPRINT_KEY)
    if recorded is None or recorded == plan_fingerprint(meta):
        return None
    what = (
        "its config (or input) was edited after planning: the manifests are the ones varpack plan "
        "wrote, but not with this config"
        if manifests_ok
        else "its config, input or rank checksums were edited after planning"
    )
    return (
        f"plan.json {FINGERPRINT_KEY} does not match its content; {what}. Restore plan.json, or "
        "re-run varpack plan with the options you want"
    )


def plan_checksum(meta: dict[str, Any]) -> str:
    """sha256 over a canonical JSON of every key of plan.json but the checksum itself and the
    input's path as given (``input.source``: plans of one input differ only there)."""
    body = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    if isinstance(body.get("input"), dict):
        body["input"] = {k: v for k, v in body["input"].items() if k != "source"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def checksum_problem(meta: dict[str, Any]) -> str | None:
    """Why plan.json's checksum does not fit its content (``None``: it does, or the plan is of
    a version before checksums and holds none)."""
    recorded = meta.get(CHECKSUM_KEY)
    if recorded is None and CHECKSUM_KEY in absent(meta):
        return None
    if recorded is None:
        return f"plan.json has no {CHECKSUM_KEY}; restore plan.json, or re-run varpack plan"
    if recorded != plan_checksum(meta):
        return (
            f"plan.json {CHECKSUM_KEY} does not match its content: plan.json was changed after "
            "planning (by hand, or damaged on disk); restore it, or re-run varpack plan"
        )
    return None
