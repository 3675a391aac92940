"""numba's cache of the planner's kernels is keyed to varpack's version and sources
(:mod:`varpack.plan.numba_cache`): a kernel whose callee changed in another file is compiled
again, never replayed from the cache."""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

import varpack
from varpack.plan import numba_cache
from varpack.plan.kernels import compose

PKG = Path(varpack.__file__).resolve().parent


def _copy_package(to: Path) -> Path:
    """A copy of varpack's sources (no caches) under ``to``: its own numba cache."""
    shutil.copytree(PKG, to / "varpack", ignore=shutil.ignore_patterns("__pycache__"))
    return to / "varpack"


def test_the_key_changes_with_any_planner_source_and_the_version(tmp_path: Path) -> None:
    plan = _copy_package(tmp_path) / "plan"
    key = numba_cache.cache_key("1.0", plan)
    assert numba_cache.cache_key("1.0", plan) == key
    assert numba_cache.cache_key("1.1", plan) != key
    heavy = plan / "kernels" / "heavy.py"  # a callee of kernels in other files
    text = heavy.read_text()
    heavy.write_text(text.replace("lin * x + quad * x * x", "lin * x + quad * x * x + 0"))
    assert numba_cache.cache_key("1.0", plan) != key
    heavy.write_text(text)
    assert numba_cache.cache_key("1.0", plan) == key
    (plan.parent / "errors.py").write_text((plan.parent / "errors.py").read_text() + "\n# more\n")
    assert numba_cache.cache_key("1.0", plan) != key  # what the planner imports counts too


def test_the_sources_hold_every_planner_module_and_what_it_imports() -> None:
    got = set(numba_cache.sources())
    assert {PKG / "errors.py", PKG / "fingerprint.py"} <= got
    assert set((PKG / "plan").rglob("*.py")) <= got
    assert all(p.is_file() for p in got)


def test_a_planner_kernel_is_cached_under_the_key() -> None:
    buf = np.arange(4, dtype=np.int64)
    lens = np.full(4, 10, dtype=np.int64)
    compose._slots_by_cost(buf, np.zeros(4, np.bool_), 4, lens, 1.0, 0.0, 10.0, np.int64(100))
    index = list((PKG / "plan" / "kernels" / "__pycache__").glob("compose._slots_by_cost-*.nbi"))
    assert index and any(numba_cache.cached(p) for p in index)
    assert not numba_cache.cached(index[0].with_suffix(".missing"))


_CALL = """
import numpy as np
from varpack.plan.kernels import compose
buf = np.arange(4, dtype=np.int64)
lens = np.full(4, 10, dtype=np.int64)
print(compose._slots_by_cost(buf, np.zeros(4, np.bool_), 4, lens, 1.0, 0.0, 10.0, np.int64(100)))
"""


@pytest.mark.slow
def test_a_changed_callee_in_another_file_is_compiled_again(tmp_path: Path) -> None:
    """``compose._slots_by_cost`` sums ``heavy.cost`` (another file, inlined): once its cost
    doubles, the caller, its own file untouched, must return the doubled slot count."""
    heavy = _copy_package(tmp_path) / "plan" / "kernels" / "heavy.py"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": ""}

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", _CALL], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()

    assert run() == "4"
    assert run() == "4"  # from the cache
    heavy.write_text(heavy.read_text().replace("lin * x + quad", "2 * lin * x + quad"))
    assert run() == "8"


def _kernel_modules_outside_plan() -> list[str]:
    names = []
    for path in sorted(PKG.rglob("*.py")):
        if path.is_relative_to(PKG / "plan"):
            continue
        text = path.read_text()
        if "njit" in text and "import" in text:
            names.append(".".join(path.relative_to(PKG.parent).with_suffix("").parts))
    return names


def test_kernels_outside_the_planner_call_only_kernels_of_their_own_file() -> None:
    """numba keys those by their own file only: a kernel there must not call (or inline) a
    kernel of another module, which would replay stale code once that module changed."""
    found = _kernel_modules_outside_plan()
    assert found  # the token copy's check values, the MPI planner's moved figures
    wrong = []
    for name in found:
        module = importlib.import_module(name)
        tree = ast.parse(Path(module.__file__ or "").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("varpack"):
                for alias in node.names:
                    obj = getattr(module, alias.asname or alias.name, None)
                    if isinstance(obj, CPUDispatcher):
                        wrong.append(f"{name} imports the kernel {node.module}.{alias.name}")
    assert not wrong, wrong
