"""Random damage to every artifact varpack reads: a flipped bit anywhere, or the file cut short.

For each artifact type (the sort index, a sort part, the single-file output, plan.json, a rank
file, the torch loader's resume state) a reader either gives exactly the result the undamaged
artifact gives, or refuses with one clear line (a :class:`~varpack.errors.VarpackError` whose
message is one line; ``validate``: violations, one line each). It never returns a wrong result
and never raises anything else. The artifacts are built once; each example damages one file of a
private copy and restores it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli, write_metadata

from varpack.errors import VarpackError
from varpack.make import read_input
from varpack.planfile.format import load_plan
from varpack.sort import read_sorted
from varpack.validate import validate_plan

#: one damage: ("flip", where in the file as a fraction, which bit) or ("cut", where, _)
DAMAGE = st.tuples(
    st.sampled_from(["flip", "flip", "cut"]),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 7),
)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None)


def damaged(data: bytes, damage: tuple[str, float, int]) -> bytes:
    kind, where, bit = damage
    at = int(where * len(data))
    if kind == "cut":
        return data[:at]
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


@contextmanager
def damage_of(path: Path, damage: tuple[str, float, int]) -> Iterator[None]:
    """``path`` damaged for the duration, then restored."""
    original = path.read_bytes()
    path.write_bytes(damaged(original, damage))
    try:
        yield
    finally:
        path.write_bytes(original)


def refused_or_same(read: Callable[[], Any], same: Callable[[Any], bool]) -> None:
    """``read()`` refuses in one line, or its result is the undamaged one."""
    try:
        result = read()
    except VarpackError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)
        return
    assert same(result), "a damaged artifact was read as something else"


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The artifacts, with what their readers give undamaged."""
    root = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(11)
    write_metadata(root / "meta.parquet", rng.permutation(40) * 3, rng.integers(1, 200, 40))
    cli("sort", root / "meta.parquet", root / "sorted", "-q")
    cli("sort", root / "meta.parquet", root / "sorted.bin", "--single-file", "-q")
    cli("plan", root / "sorted", root / "plan", "--dp", 2, "--max-tokens", 400, "-q")
    assert validate_plan(root / "plan").problems == []
    return {
        "root": root,
        "sorted": read_sorted(root / "sorted"),
        "bin": read_sorted(root / "sorted.bin"),
        "input": read_input(root / "sorted"),
        "meta": _comparable(load_plan(root / "plan").meta),
        "tables": [load_plan(root / "plan").rank_table(r) for r in range(2)],
    }


def _comparable(meta: dict[str, Any]) -> dict[str, Any]:
    """plan.json's content but the input's path as given (the one thing no checksum covers)."""
    doc = json.loads(json.dumps(meta))
    if isinstance(doc.get("input"), dict):
        doc["input"].pop("source", None)
    return doc


def _same_sorted(want: tuple[Any, dict[str, Any]]) -> Callable[[Any], bool]:
    return lambda got: bool(got[0].equals(want[0]) and got[1] == want[1])


def _same_input(want: tuple[np.ndarray, np.ndarray]) -> Callable[[Any], bool]:
    return lambda got: all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


# --- the sort output ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["_index.json", "part-00000.parquet"])
@FUZZ
@given(damage=DAMAGE)
def test_a_damaged_parts_output(art: dict[str, Any], name: str, damage: Any) -> None:
    out = art["root"] / "sorted"
    with damage_of(out / name, damage):
        refused_or_same(lambda: read_sorted(out), _same_sorted(art["sorted"]))
        refused_or_same(lambda: read_input(out), _same_input(art["input"]))


@FUZZ
@given(damage=DAMAGE)
def test_a_damaged_single_file(art: dict[str, Any], damage: Any) -> None:
    path = art["root"] / "sorted.bin"
    with damage_of(path, damage):
        refused_or_same(lambda: read_sorted(path), _same_sorted(art["bin"]))
        refused_or_same(lambda: read_input(path), _same_input(art["input"]))


@FUZZ
@given(damage=st.tuples(st.just("flip"), st.floats(0.99, 1, exclude_max=True), st.integers(0, 7)))
def test_a_flipped_record_of_the_single_file(art: dict[str, Any], damage: Any) -> None:
    """The records are a small tail of the file: damage them on purpose too."""
    path = art["root"] / "sorted.bin"
    with damage_of(path, damage):
        refused_or_same(lambda: read_sorted(path), _same_sorted(art["bin"]))


# --- the plan --------------------------------------------------------------------------------------


def _same_plan(art: dict[str, Any]) -> Callable[[Any], bool]:
    return lambda plan: (
        _close(_comparable(plan.meta), art["meta"])
        and all(plan.rank_table(r).equals(t) for r, t in enumerate(art["tables"]))
    )


def _close(a: Any, b: Any) -> bool:
    """Equal JSON, floats equal to 1e-12 (validate's own tolerance is looser)."""
    if isinstance(b, float) and isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(_close, a, b))
    return type(a) is type(b) and bool(a == b)


def _validated(art: dict[str, Any]) -> None:
    """``validate``: violations of one line each, or a plan that is the undamaged one."""
    plan = art["root"] / "plan"
    try:
        report = validate_plan(plan)
    except VarpackError as exc:
        assert "\n" not in str(exc)
        return
    if report.problems:
        assert all(p and "\n" not in p for p in report.problems), report.problems
        return
    assert _same_plan(art)(load_plan(plan)), "validate passed a damaged plan"


@pytest.mark.parametrize("name", ["plan.json", "rank-00000.parquet", "rank-00001.parquet"])
@FUZZ
@given(damage=DAMAGE)
def test_a_damaged_plan(art: dict[str, Any], name: str, damage: Any) -> None:
    plan = art["root"] / "plan"
    with damage_of(plan / name, damage):
        refused_or_same(lambda: load_plan(plan, verify=True, full=True), _same_plan(art))
        _validated(art)


# --- the loader state ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loader(art: dict[str, Any]) -> Any:
    pytest.importorskip("torch")
    from varpack.torch import PlanLoader

    ids, lens = art["input"]
    data = {int(i): np.arange(n) for i, n in zip(ids, lens, strict=True)}
    return PlanLoader(art["root"] / "plan", data, rank=1)


@FUZZ
@given(damage=DAMAGE, skip=st.integers(0, 12), on_values=st.booleans())
def test_a_damaged_loader_state(loader: Any, damage: Any, skip: int, on_values: bool) -> None:
    """The state as a checkpoint holds it (JSON here): damage that still parses is refused by
    the loader in one line, or restores the very same cursor. Half the examples flip a bit of
    the numbers (epoch, step, micro, version), where damage most often still parses."""
    loader.load_state_dict(_at(loader, skip))
    want = loader.state_dict()
    text = json.dumps(want).encode()
    if on_values:
        spans = [m.span(1) for m in re.finditer(rb'"(?:epoch|step|micro|version)": (\d+)', text)]
        digits = [i for a, b in spans for i in range(a, b)]
        kind, where, bit = damage
        damage = ("flip", (digits[int(where * len(digits))] + 0.5) / len(text), bit)
    text = damaged(text, damage)
    try:
        state = json.loads(text)
    except ValueError:
        return  # the checkpoint's own container refuses it before varpack sees it
    refused_or_same(lambda: loader.load_state_dict(state), lambda _: loader.state_dict() == want)


def _at(loader: Any, rows: int) -> dict[str, Any]:
    """A state ``rows`` micro-batches into the plan (at most the whole pass)."""
    from varpack.torch.state import make_state

    row = loader.rows
    if rows >= len(row):
        return make_state(loader.fingerprint, 0, loader.num_steps, 0)
    return make_state(loader.fingerprint, 0, int(row.step[rows]), int(row.micro[rows]))


def test_the_fixture_copies_are_untouched(art: dict[str, Any], tmp_path: Path) -> None:
    """Every example restored what it damaged: the plan still validates."""
    shutil.copytree(art["root"] / "plan", tmp_path / "plan")
    assert validate_plan(tmp_path / "plan").problems == []
