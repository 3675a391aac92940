"""Every tuned constant of the balance planner is in one record, named with the test that fails
without it, or listed as having none yet."""

from __future__ import annotations

import ast
from pathlib import Path

from varpack.plan import tuning

ROOT = Path(__file__).resolve().parents[2]


def _constants() -> set[str]:
    tree = ast.parse(Path(tuning.__file__).read_text())
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}  # fmt: skip
    return {n for n in names if n.isupper() and n not in ("TESTS", "UNTESTED")}


def test_every_constant_is_tested_or_listed_as_not_yet() -> None:
    constants = _constants()
    assert len(constants) == 28  # the composer's 22 and the engine's 6
    assert set(tuning.TESTS) | set(tuning.UNTESTED) == constants
    assert not set(tuning.TESTS) & set(tuning.UNTESTED)


def test_each_named_test_exists() -> None:
    for name, node in tuning.TESTS.items():
        path, _, func = node.partition("::")
        source = (ROOT / path).read_text()
        tree = ast.parse(source)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert func in defined, f"{name}: {node} is not a test"
