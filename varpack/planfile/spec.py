"""JSON type checks for plan.json: each value against what it must be, one line per problem.

A :class:`Spec` names what a value must be and tests it; :func:`check` appends one line per
problem (``plan.json ranks: expected a list of rank entries, found an object``), and the
combinators (:func:`integer`, :func:`nullable`, :func:`list_of`, :func:`obj`) build the specs of
plan.json's keys (:mod:`varpack.planfile.schema`) from plain ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Spec:
    """What a JSON value must be: ``what`` names it in messages, ``test`` accepts its type and
    range, ``parts`` checks what it contains (keys, items) once the value itself is accepted."""

    what: str
    test: Callable[[Any], bool]
    parts: Callable[[Any, str, list[str]], None] | None = None


def check(spec: Spec, value: Any, where: str, out: list[str]) -> None:
    """Append to ``out`` one line per problem of ``value`` (at key path ``where``) against ``spec``."""
    if not spec.test(value):
        out.append(f"{_at(where)}: expected {spec.what}, found {_describe(value)}")
    elif spec.parts is not None:
        spec.parts(value, where, out)


def _at(where: str) -> str:
    """The place of a problem: ``plan.json`` itself, or a key path in it."""
    return f"plan.json {where}" if where else "plan.json"


def _key(where: str, key: str) -> str:
    """The path of ``key`` inside the value at ``where``."""
    return f"{where}.{key}" if where else key


def _describe(value: Any) -> str:
    """A JSON value named by its type (and itself, when short)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    kind = {int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"the {kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a count


def integer(lo: int | None = None) -> Spec:
    """An integer, at least ``lo`` if given."""
    what = "an integer" + (f" >= {lo}" if lo is not None else "")
    return Spec(what, lambda v: _is_int(v) and (lo is None or v >= lo))


NUMBER = Spec("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
STRING = Spec("a string", lambda v: isinstance(v, str))
SHA256 = Spec(
    "a sha256 (64 hex digits)", lambda v: isinstance(v, str) and bool(_HEX64.fullmatch(v))
)


def nullable(spec: Spec) -> Spec:
    """``spec`` or null."""
    parts = spec.parts

    def inner(value: Any, where: str, out: list[str]) -> None:
        if value is not None and parts is not None:
            parts(value, where, out)

    return Spec(f"{spec.what} or null", lambda v: v is None or spec.test(v), inner)


def list_of(item: Spec, what: str | None = None) -> Spec:
    """A list whose every item is ``item`` (the first few bad items reported)."""

    def parts(value: list[Any], where: str, out: list[str]) -> None:
        before = len(out)
        for i, v in enumerate(value):
            check(item, v, f"{where}[{i}]", out)
            if len(out) - before >= 3:  # a list of a million bad items: three lines say it
                break

    return Spec(what or f"a list of {item.what}", lambda v: isinstance(v, list), parts)


def obj(what: str, required: dict[str, Spec], optional: dict[str, Spec] | None = None) -> Spec:
    """An object with the ``required`` keys (and the ``optional`` ones where present)."""
    optional = optional or {}

    def parts(value: dict[str, Any], where: str, out: list[str]) -> None:
        for key, spec in required.items():
            if key not in value:
                out.append(f"{_at(where)}: missing key {key!r} ({spec.what})")
            else:
                check(spec, value[key], _key(where, key), out)
        for key, spec in optional.items():
            if key in value:
                check(spec, value[key], _key(where, key), out)

    return Spec(what, lambda v: isinstance(v, dict), parts)
