"""Sources by path (``varpack plan --source code=meta/code/ --source chat=meta/chat/``).

A blend whose sources live in directories of their own needs no source column: a sample's
source is the ``--source`` path its metadata file lies under. :func:`read_path_sources` reads
the ids of each path (the id column only) and returns them with a ``source`` column, the shape
:func:`varpack.make.carry.read_carry_source` returns, so the blend, the carried column and
``validate`` treat it like a column read from the metadata. plan.json's ``mix`` records the
paths, and ``validate`` rebuilds the column from them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from varpack.errors import ConfigError, InputError
from varpack.make.carry import read_carry_source, rows_of

#: the column the sources by path make (carried into the manifests as ``carry.source``)
COLUMN = "source"


def parse_sources(specs: Sequence[str]) -> dict[str, str]:
    """``["code=meta/code/", ...]`` as ``{name: path}``; one line for what is wrong.

    >>> parse_sources(["code=meta/code", "chat=meta/chat/"])
    {'code': 'meta/code', 'chat': 'meta/chat/'}
    """
    out: dict[str, str] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        if not eq or not name or not path:
            raise ConfigError(f"--source {spec!r} is not NAME=PATH (--source code=meta/code/)")
        if name in out:
            raise ConfigError(f"--source: source {name!r} named twice")
        out[name] = path
    return out


def _overlap(paths: dict[str, str]) -> tuple[str, str] | None:
    """Two sources whose paths hold one another (a file would belong to both)."""
    real = {name: Path(p).resolve() for name, p in paths.items()}
    for a, pa_ in real.items():
        for b, pb in real.items():
            if a != b and (pa_ == pb or pb.is_relative_to(pa_)):
                return a, b
    return None


def read_path_sources(paths: dict[str, str]) -> tuple[np.ndarray, pa.Table]:
    """Every sample id under each path, and its source's name (``(ids, table[source])``)."""
    both = _overlap(paths)
    if both:
        raise ConfigError(
            f"--source {both[0]}={paths[both[0]]} holds --source {both[1]}={paths[both[1]]}; "
            "give each source a path of its own"
        )
    ids, names = [], []
    for name, path in paths.items():
        if not os.path.exists(path):
            raise InputError(f"--source {name}={path}: no such file or directory")
        got, _ = read_carry_source(path, [])
        ids.append(got)
        names.append(np.full(len(got), name, dtype=object))
    all_ids = np.concatenate(ids)
    order = np.argsort(all_ids, kind="stable")
    twice = np.flatnonzero(all_ids[order][1:] == all_ids[order][:-1])
    if len(twice):
        sid = int(all_ids[order][twice[0]])
        where = [n for n, got in zip(paths, ids, strict=True) if (got == sid).any()]
        raise InputError(
            f"sample id {sid} is under --source {where[0]} and --source {where[-1]}; a sample "
            "has one source (ids must be unique across the sources' metadata)"
        )
    table = pa.table({COLUMN: pa.array(np.concatenate(names), pa.string())})
    return all_ids, table


def with_path_sources(
    paths: dict[str, str], read: tuple[np.ndarray, pa.Table] | None
) -> tuple[np.ndarray, pa.Table]:
    """The carried columns ``read`` (or none) with the path sources' column added, by id."""
    src_ids, src = read_path_sources(paths)
    if read is None:
        return src_ids, src
    ids, table = read
    if COLUMN in table.column_names:
        raise ConfigError(
            f"--source paths make the column '{COLUMN}'; do not --carry a column of that name too"
        )
    row = check_covered(paths, src_ids, ids)
    return ids, table.append_column(COLUMN, src.column(COLUMN).take(pa.array(row)))


def check_covered(paths: dict[str, str], src_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The row of each of ``ids`` in the sources' ids; an id under no path is refused."""
    row = rows_of(src_ids, ids)
    if (row < 0).any():
        raise InputError(
            f"sample id {int(ids[row < 0][0])} is under none of the --source paths "
            f"({', '.join(paths.values())}); every planned sample needs a source (add a "
            "--source for it, or select the samples with --where)"
        )
    return row
