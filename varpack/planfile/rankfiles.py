"""The rank files of a plan: plain files inside the plan directory, exactly the declared set.

plan.json names each rank's manifest; a reader opens ``<plan>/<file>``. A name with a directory
part (``../../x.parquet``, an absolute path) or a symlink would make a reader open a file the plan
does not own, so such an entry is refused before anything is read, by name and reason. A
``*.parquet`` file in the plan directory that plan.json does not declare is refused by
``validate`` too: it is a leftover of another plan, or a manifest someone meant to swap in.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path


def name_problem(rank: int, name: str) -> str | None:
    """Why ``name`` is not a plain manifest file name (``None``: it is one)."""
    if os.path.isabs(name) or "/" in name or "\\" in name or name in ("", ".", ".."):
        return (
            f"plan.json ranks[{rank}].file {name!r} points outside the plan directory; a rank "
            "file must be a plain file name inside it (re-run varpack plan)"
        )
    if not name.endswith(".parquet"):
        return f"plan.json ranks[{rank}].file {name!r} is not a .parquet manifest"
    return None


def file_problem(root: Path, rank: int, name: str) -> str | None:
    """Why rank ``rank``'s file may not be read (``None``: a plain file inside ``root``, or
    missing, which the checksum check reports). The file itself is never followed or opened."""
    bad = name_problem(rank, name)
    if bad is not None:
        return bad
    path = root / name
    try:
        mode = os.lstat(path).st_mode  # lstat: a symlink is seen as one, not followed
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: rank {rank} manifest cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        inside = Path(os.path.realpath(path)).parent == Path(os.path.realpath(root))
        where = "inside" if inside else "outside"
        return (
            f"{path}: rank {rank} manifest is a symlink (to {target}, {where} the plan "
            "directory); a plan holds its manifests as plain files (re-run varpack plan)"
        )
    if not stat.S_ISREG(mode):
        return f"{path}: rank {rank} manifest is not a plain file"
    return None


def undeclared(root: Path, names: list[str]) -> list[str]:
    """``*.parquet`` entries of ``root`` that plan.json does not declare, sorted."""
    declared = set(names)
    try:
        found = sorted(p.name for p in root.iterdir() if p.name.endswith(".parquet"))
    except OSError:
        return []
    return [n for n in found if n not in declared]


def duplicate_names(names: list[str]) -> list[str]:
    """File names declared by more than one rank."""
    return sorted(n for n, times in Counter(names).items() if times > 1)
