"""The package's shape, read from its source: layering, no import circles, small modules.

These rules keep varpack's rooms as ``docs/architecture.md`` describes them; each test names the
module that breaks a rule, so a change that breaks one is easy to find.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "varpack"
MAX_LINES = 450
MAX_LOOSE = 6

GROUND = {"errors", "atomic", "console", "fingerprint"}
#: package -> the varpack packages (or ground-floor modules) it may import
ALLOWED = {
    "metadata": GROUND,
    "sort": GROUND | {"metadata"},
    "plan": {"errors", "fingerprint"},
    "online": {"errors", "plan"},
    # the plan artifact (format, schema, verified read, atomic write, tables, the rows as arrays
    # and the figures recomputed from them) and the rooms around it: the plan's I/O edge, the
    # checks, the views. Each reads plans through planfile; none reaches into another's room.
    "planfile": GROUND | {"plan", "sort"},
    "make": GROUND | {"metadata", "sort", "plan", "planfile"},
    "validate": GROUND | {"metadata", "sort", "plan", "planfile", "make"},
    "inspect": GROUND | {"metadata", "plan", "planfile"},
    "torch": GROUND | {"metadata", "planfile", "online"},
    "cli": GROUND
    | {"metadata", "sort", "plan", "planfile", "make", "validate", "inspect", "online"},
    "integrations": GROUND | {"metadata", "planfile", "torch", "online"},
}
#: third-party packages a varpack package must not import (the plan is pure arrays; a batch
#: planned in memory too: RL loops call it between generation and training)
FORBIDDEN = {
    "plan": {"pyarrow", "polars", "torch", "mpi4py"},
    "online": {"pyarrow", "polars", "torch", "mpi4py"},
}
#: distributions whose import name differs, or that are installed for a binary, not an import
IMPORT_NAME = {"mpich": None}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts)
    return name.removesuffix(".__init__")


def modules() -> Iterator[Path]:
    yield from sorted(PKG.rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    """Every module named by an import statement in ``path`` (module level and inside functions).

    ``from a.b import c`` names ``a.b.c`` when that is a module of varpack, else ``a.b``.
    """
    tree = ast.parse(path.read_text())
    here = module_name(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                pkg = here.split(".")
                pkg = pkg[: len(pkg) - node.level + (1 if path.name == "__init__.py" else 0)]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if _is_module(full) else base)
    return names


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    """varpack module -> the varpack modules it imports."""
    return {
        module_name(p): {n for n in imports_of(p) if n == "varpack" or n.startswith("varpack.")}
        for p in modules()
    }


def test_no_module_over_the_size_limit() -> None:
    long = {
        module_name(p): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_few_loose_modules_at_the_root() -> None:
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose


def test_every_package_says_what_it_owns() -> None:
    for init in PKG.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 20, f"{init.parent.name}/__init__.py needs its purpose paragraph"


@pytest.mark.parametrize(
    "package", ["plan/kernels", "planfile", "make", "make/mpi", "validate", "inspect"]
)
def test_every_module_is_named_by_its_package(package: str) -> None:
    """The package's docstring names each of its modules (what each holds, in a line or a
    phrase), so a reader learns the room from its ``__init__``; the kernels are named in
    docs/architecture.md too."""
    root = PKG / package
    doc = ast.get_docstring(ast.parse((root / "__init__.py").read_text())) or ""
    names = [p.stem for p in root.glob("*.py") if p.name != "__init__.py"]
    names += [p.parent.name for p in root.glob("*/__init__.py")]
    unnamed = sorted(n for n in names if not re.search(rf"(?<![\w]){n}(?![\w])", doc))
    assert not unnamed, f"{package}/__init__.py does not name {unnamed}"
    if package == "plan/kernels":
        arch = (ROOT / "docs" / "architecture.md").read_text()
        missing = sorted(n for n in names if f"`{n}`" not in arch)
        assert not missing, f"docs/architecture.md does not name the kernels {missing}"


def test_no_private_name_crosses_a_module() -> None:
    """A name another module imports is public: ``from varpack.x import _name`` would tie a
    module to another's internals (make the name public, or move the code to where it is used)."""
    private = sorted(
        f"{module_name(path)} imports {node.module}.{alias.name}"
        for path in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("varpack")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    )
    assert not private, private


def test_no_import_circle() -> None:
    g = graph()
    # Tarjan's strongly connected components; any component of 2+ modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_room_is_ranked() -> None:
    """Every package of varpack has its place in :data:`ALLOWED`, so a new room is checked too,
    and each names only rooms that exist (or the ground floor)."""
    rooms = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert rooms == set(ALLOWED), f"rank these rooms in ALLOWED: {sorted(rooms ^ set(ALLOWED))}"
    unknown = {r: sorted(a - rooms - GROUND) for r, a in ALLOWED.items() if a - rooms - GROUND}
    assert not unknown, unknown
    assert GROUND == {p.stem for p in PKG.glob("*.py")} - {"__init__", "__main__"}


def test_rooms_point_only_down() -> None:
    """The rooms form a ladder: no room may import, even through others, a room that may import
    it (nothing points back up); the planner imports none of the rooms above it."""
    reach = {room: set(allowed) for room, allowed in ALLOWED.items()}
    for _ in ALLOWED:  # transitive closure
        for room in reach:
            reach[room] |= set().union(*(reach.get(r, set()) for r in reach[room]))
    back = sorted(room for room in reach if room in reach[room])
    assert not back, f"rooms that reach back up to themselves: {back}"
    above = {"planfile", "make", "validate", "inspect", "online", "torch", "cli", "integrations"}
    assert not reach["plan"] & above
    assert not reach["planfile"] & {"make", "validate", "inspect"}  # the artifact knows no room


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layering(package: str) -> None:
    """Data flows forward: a package imports only the rooms before it (and the ground floor)."""
    wrong = []
    for path in (PKG / package).rglob("*.py"):
        for name in imports_of(path):
            room = _room(name) if name.startswith("varpack.") else None
            if room and room != package and room not in ALLOWED[package]:
                wrong.append(f"{module_name(path)} imports {name}")
            top = name.split(".")[0]
            if top in FORBIDDEN.get(package, set()):
                wrong.append(f"{module_name(path)} imports {top}")
    assert not wrong, wrong


def test_every_declared_dependency_is_used() -> None:
    """Each runtime dependency (and the torch / plot / mpi / hf extras) is imported somewhere."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in ("torch", "plot", "mpi", "hf"):
        declared += project["optional-dependencies"].get(extra, [])
    used: set[str] = set()
    for path in [*modules(), *(ROOT / "jobs").glob("*.py")]:
        used.update(n.split(".")[0] for n in imports_of(path))
    unused = []
    for spec in declared:
        dist = spec.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()
        name = IMPORT_NAME.get(dist, dist.replace("-", "_"))
        if name is not None and name not in used:
            unused.append(dist)
    assert not unused, f"declared but never imported: {unused}"


def test_every_imported_package_is_declared() -> None:
    """Each third-party import of the package and its jobs is a runtime dependency or extra.

    polars, for one, is a runtime dependency for ``--where`` (SQL over metadata) only; the
    statistics stay pyarrow and NumPy (docs/polars.md says why).
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in ("torch", "plot", "mpi", "hf"):
        declared += project["optional-dependencies"].get(extra, [])
    names = {re.split(r"[<>=\[ ]", spec)[0].replace("-", "_") for spec in declared}
    undeclared = sorted(
        f"{module_name(path)} imports {top}"
        for path in [*modules(), *(ROOT / "jobs").glob("*.py")]
        for top in {n.split(".")[0] for n in imports_of(path)}
        if top != "varpack" and top not in sys.stdlib_module_names and top not in names
    )
    assert not undeclared, undeclared
