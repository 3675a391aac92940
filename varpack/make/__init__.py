"""The I/O edge of ``varpack plan``: read the input, plan (pure, :mod:`varpack.plan`), write.

Input is either a ``varpack sort`` output (a directory with ``_index.json`` or a ``--single-file``
binary) taken in its global order, or raw metadata (file, directory or glob), which is read and
sorted in-process by the same rule (``seq_len``, ties by ``sample_id``). Either way the plan is
the same: a sorted input, whatever rank count made it, gives byte-identical manifests.

The package is the plan's I/O edge: this module (one process: :func:`plan`), the metadata columns
carried into the manifests (:mod:`.carry`, ``--carry``; sources by path: :mod:`.path_sources`),
``--mix`` (:mod:`.mixing`: each sample's source read, the blend planned), ``varpack replan``
(:mod:`.replan`: a plan continued from one of its steps; :mod:`.remaining`: what a run has left,
planned again in its parent's order) and ``plan`` under MPI (:mod:`.mpi`).
May import: the ground floor, :mod:`varpack.metadata` and :mod:`varpack.sort` (to read an input;
the agreement and exchange under MPI), :mod:`varpack.plan` (the pure planner) and
:mod:`varpack.planfile` (to write and read plans); never :mod:`varpack.validate`,
:mod:`varpack.inspect` or :mod:`varpack.cli`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from varpack.atomic import check_output
from varpack.errors import ConfigError, InputError
from varpack.make import path_sources
from varpack.make.mixing import plan_mixed
from varpack.metadata.where import Where, check_sql, keep, where_ids
from varpack.plan import PlanArrays, PlanConfig, make_plan
from varpack.plan.kernels.split import unit_count
from varpack.plan.mix import Mix
from varpack.plan.stages.select import plan_bytes
from varpack.planfile.format import write_plan
from varpack.planfile.tables import plan_tables
from varpack.sort.output import is_sorted_output

#: Keys of a ``--config`` file that are not planning options: the carried columns (``carry``
#: accepts a list of names), their metadata (``carry_from``), the selection (``where``) and the
#: blend (``mix``, a string or a ``[mix]`` table of weights, and its companions).
CARRY_KEYS = (
    "carry", "carry_from", "where", "mix", "source_column", "mix_unit", "total_tokens",
    "total_samples", "mix_tolerance", "sources",
)  # fmt: skip


def input_paths(path: str | os.PathLike[str]) -> list[Path]:
    """Every path the input consists of (an output must stay apart from all of them)."""
    from varpack.metadata.contract import resolve_files

    p = Path(path)
    if is_sorted_output(p):
        return [p]
    return [*([p] if p.is_dir() else []), *resolve_files(str(path))]


def read_input(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(sample_ids, seq_lens)`` int64 in curriculum order (the sort order)."""
    from varpack.metadata.contract import read_metadata
    from varpack.sort import read_sorted, sort_table

    if is_sorted_output(path):
        table, _ = read_sorted(path)
    else:
        table = sort_table(read_metadata(str(path)), keys=("seq_len",))
    if table.num_rows == 0:
        raise InputError(f"{path}: the input holds no samples; nothing to plan")
    ids = table.column("sample_id").to_numpy().astype(np.int64, copy=False)
    lens = table.column("seq_len").to_numpy().astype(np.int64, copy=False)
    return ids, lens


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), if known."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_short(num_samples: int, cfg: PlanConfig, extra: int = 0) -> tuple[float, float] | None:
    """``(GiB needed, GiB available)`` where planning ``num_samples`` samples with ``cfg`` (and
    ``extra`` bytes beside) would not fit in this machine's memory, else ``None``."""
    need = plan_bytes(num_samples, cfg) + extra
    have = available_memory()
    return (need / 2**30, have / 2**30) if have is not None and need > have else None


def check_memory(num_samples: int, cfg: PlanConfig) -> None:
    """Refuse, before planning, a plan that would not fit in this machine's memory."""
    short = memory_short(num_samples, cfg)
    if short is not None:
        rows = num_samples * cfg.epochs
        raise ConfigError(
            f"{num_samples:,} samples x --epochs {cfg.epochs} = {rows:,} planned rows need about "
            f"{short[0]:.1f} GiB to plan, and {short[1]:.1f} GiB are available: lower "
            "--epochs (and replay the plan), or plan on a machine with more memory"
        )


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Options from a TOML file: top-level keys, or a ``[plan]`` table (keys use - or _)."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {p}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--config {p}: not UTF-8 text (byte {exc.start}); save the file as UTF-8 TOML"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {p}: invalid TOML ({exc})") from None
    tables = {k: doc.pop(k) for k in ("mix", "sources") if isinstance(doc.get(k), dict)}
    if set(doc) == {"plan"} and isinstance(doc["plan"], dict):
        doc = doc["plan"]
    tables |= {k: doc.pop(k) for k in ("mix", "sources") if isinstance(doc.get(k), dict)}
    if "mix" in tables:  # a [mix] table of weights: the --mix string
        table = tables["mix"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in table.values()):
            raise ConfigError(f"--config {p}: [mix] holds source = weight numbers (code = 0.3)")
        doc["mix"] = ",".join(f"{k}={v}" for k, v in table.items())
    if "sources" in tables:  # a [sources] table of paths: the --source NAME=PATH flags
        if not all(isinstance(v, str) for v in tables["sources"].values()):
            raise ConfigError(
                f'--config {p}: [sources] holds source = "path" (code = "meta/code/")'
            )
        doc["sources"] = [f"{k}={v}" for k, v in tables["sources"].items()]
    carry = {
        str(k).replace("-", "_"): doc.pop(k)
        for k in list(doc)
        if str(k).replace("-", "_") in CARRY_KEYS
    }
    _check_carry_keys(carry, p)
    for key, value in doc.items():
        if isinstance(value, dict):
            raise ConfigError(
                f"--config {p}: unexpected table [{key}]; options are plain keys (or one [plan] table)"
            )
    PlanConfig.from_mapping(doc, where=f"--config {p}")  # unknown keys fail here
    return {**{str(k).replace("-", "_"): v for k, v in doc.items()}, **carry}


def _check_carry_keys(carry: dict[str, Any], p: Path) -> None:
    """``carry`` is a list of column names, ``carry_from`` a path."""
    names = carry.get("carry", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f'--config {p}: carry must be a list of column names (carry = ["source"])'
        )
    if not isinstance(carry.get("carry_from", ""), str):
        raise ConfigError(f"--config {p}: carry_from must be a path (a string)")
    srcs = carry.get("sources", [])
    if not isinstance(srcs, list) or not all(isinstance(v, str) for v in srcs):
        raise ConfigError(f'--config {p}: sources is a [sources] table (code = "meta/code/")')
    for key in ("where", "mix", "source_column", "mix_unit"):
        if not isinstance(carry.get(key, ""), str):
            raise ConfigError(f"--config {p}: {key} must be a string")
    for key in ("total_tokens", "total_samples"):
        value = carry.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--config {p}: {key} must be an integer >= 1")
    tol = carry.get("mix_tolerance", 0.5)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 < tol <= 1:
        raise ConfigError(f"--config {p}: mix_tolerance must be a number in (0, 1] (0.02)")


def where_source(input: str | os.PathLike[str], carry_from: str | os.PathLike[str] | None) -> str:
    """The metadata ``--where`` reads its columns from: INPUT when it is raw metadata, else
    ``--carry-from`` (the metadata a sort output was sorted from)."""
    if not is_sorted_output(input):
        return str(input)
    if carry_from is None:
        raise ConfigError(
            f"--where: {input} is a varpack sort output, which keeps only sample_id, seq_len and "
            "key columns; add --carry-from PATH, a dataset holding the condition's columns by "
            "sample id: the tokenized data, or metadata made with varpack lengths --keep COL"
        )
    return str(carry_from)


def select_input(
    ids: np.ndarray, lens: np.ndarray, sql: str, source: str, flag: str = "--where"
) -> tuple[np.ndarray, np.ndarray, Where]:
    """The samples whose metadata row satisfies the SQL condition ``sql`` (order kept);
    ``flag`` names where the condition came from in an error."""
    from varpack.metadata.contract import resolve_files

    text = check_sql(sql, flag)
    kept = where_ids([str(f) for f in resolve_files(source)], text, flag=flag)
    mask, where = keep(ids, lens, kept, text, source)
    return ids[mask], lens[mask], where


def carry_source(
    input: str | os.PathLike[str], names: Sequence[str], carry_from: str | None
) -> str | None:
    """Where the carried columns are read: ``--carry-from``, else the input when it is raw
    metadata (``None`` without ``--carry``)."""
    if not names:
        return None
    if carry_from is not None:
        return str(carry_from)
    if is_sorted_output(input):
        raise ConfigError(
            f"--carry {names[0]}: {input} is a varpack sort output, which keeps only sample_id, "
            f"seq_len and key columns; add --carry-from PATH, a dataset holding '{names[0]}' by "
            f"sample id: the tokenized data, or metadata made with varpack lengths --keep {names[0]}"
        )
    return str(input)


def plan(
    input: str | os.PathLike[str],
    out: str | os.PathLike[str],
    cfg: PlanConfig,
    overwrite: bool = False,
    carry: Sequence[str] = (),
    carry_from: str | os.PathLike[str] | None = None,
    where: str | None = None,
    mix: Mix | None = None,
    source_column: str | None = None,
    source_paths: dict[str, str] | None = None,
) -> tuple[PlanArrays, dict[str, Any]]:
    """Plan ``input`` with ``cfg`` and write the plan directory ``out`` (atomically).

    ``carry`` names metadata columns to take into the manifests (``carry.COL``), read from
    ``carry_from`` or else from ``input`` when it is raw metadata; ``where``, a SQL condition
    over the metadata's columns (read from the same place), selects the samples planned
    (:mod:`varpack.metadata.where`; plan.json's ``selection``); ``mix`` blends the sources of
    ``source_column`` (read from there too, and carried) at its weights, or those of
    ``source_paths`` (a sample's source: the path its metadata lies under,
    :mod:`varpack.make.path_sources`) (:mod:`varpack.make.mixing`; plan.json's ``mix``). Fails before any work when
    ``out`` exists without ``overwrite``, and writes nothing on error. Returns the plan arrays
    and plan.json's content (without ranks).
    """
    from varpack.make.carry import check_names, join, read_carry_source

    inputs = input_paths(input) + (input_paths(carry_from) if carry_from is not None else [])
    inputs += [Path(p) for p in (source_paths or {}).values()]
    check_output(out, overwrite, inputs)
    cfg = cfg.resolved()
    where = None if where is None else check_sql(where)  # refused before the input is read
    if source_paths:
        if source_column is not None:
            raise ConfigError("--source NAME=PATH and --source-column: give one of them")
        source_column = path_sources.COLUMN
    if (mix is None) != (source_column is None):
        raise ConfigError(
            "--mix and --source-column (or --source NAME=PATH) go together: the weights, and "
            "where each sample's source is read"
        )
    if source_column is not None and source_column not in carry:
        carry = (*carry, source_column)  # the source travels into the manifests
    names = check_names(carry)
    read = [n for n in names if not (source_paths and n == path_sources.COLUMN)]
    source = carry_source(input, read, None if carry_from is None else str(carry_from))
    # the carried columns are read (and refused) before the planning work
    carried_from = None if source is None else read_carry_source(source, read)
    if source_paths:
        carried_from = path_sources.with_path_sources(source_paths, carried_from)
        source = source or str(input)
    if carry_from is not None and not names and where is None:
        raise ConfigError("--carry-from needs --carry COL or --where (what to read from it)")
    ids, lens = read_input(input)
    selected = None
    if where is not None:
        ids, lens, selected = select_input(ids, lens, where, where_source(input, carry_from))
    if source_paths and carried_from is not None:
        path_sources.check_covered(source_paths, carried_from[0], ids)
    split = cfg.split_len if cfg.oversize == "split" else None
    check_memory(unit_count(lens, split), cfg)  # pieces are planned rows too
    if mix is not None:
        assert source_column is not None and source is not None
        arrays, meta, extra = plan_mixed(
            ids, lens, cfg, mix, source_column, source, str(input), carried_from,
            lambda rows, extra: memory_short(rows, cfg, extra),
        )  # fmt: skip
    else:
        arrays, meta, extra = make_plan(ids, lens, cfg, source=str(input))
    carried = None
    if carried_from is not None:
        assert source is not None
        carried = join(arrays.ids, *carried_from, source)  # ids: the kept samples

        meta["carry"] = carried.entry(source)
    if source_paths:
        meta["mix"]["paths"] = source_paths
    if selected is not None:
        meta["selection"] = selected.entry()
    write_plan(out, meta, plan_tables(arrays, carried), overwrite, extra, inputs)
    return arrays, meta
