"""The plan's on-disk format: ``plan.json`` plus one Parquet manifest per data-parallel rank.

This module is the contract between ``varpack plan`` and every reader (``inspect``, ``validate``,
:mod:`varpack.torch`). Writing is atomic: the whole directory appears at once, and ``plan.json``,
which carries the checksums of the rank files and the plan fingerprint over config, input and
checksums (:func:`varpack.planfile.schema.plan_fingerprint`) and its own checksum over all of
it, is written last. Reading refuses, in one line each, a plan whose format, version, keys and
their types (:mod:`varpack.planfile.schema`), fingerprint or checksums do not match, a rank file
that is not a plain file inside the plan directory (:mod:`varpack.planfile.rankfiles`), and an
unreadable one. Plans of every version from :data:`OLDEST` on are read (docs/plan-format.md).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from varpack.atomic import atomic_dir
from varpack.errors import ConfigError, InputError
from varpack.fingerprint import sha256_file
from varpack.planfile.rankfiles import file_problem, name_problem, undeclared
from varpack.planfile.schema import (
    ADDED,
    CHECKSUM_KEY,
    FINGERPRINT_KEY,
    checksum_problem,
    fingerprint_problem,
    meta_problems,
    plan_checksum,
    plan_fingerprint,
)

FORMAT = "varpack.plan"
#: the newest format version this varpack writes; it reads every version from OLDEST on (keys a
#: later version added: :data:`varpack.planfile.schema.ADDED`). 2: config.balance_fill, the
#: stats time_vs_ideal_bound and fill_given_up, and the checksum; 3: ``parent`` (a plan made by
#: ``varpack replan``); 4: ``config.sync`` and ``stats.time_vs_ideal_by_sync`` (an older plan
#: reads as ``sync = "step"``). A plan is written with the lowest version whose readers understand
#: it (:func:`version_of`): ``varpack plan`` writes PLAN_VERSION, the version of its planner
#: (``validate --replay`` refuses older plans: this planner may place their samples otherwise).
VERSION = 4
PLAN_VERSION = 4
OLDEST = 1
PLAN_JSON = "plan.json"
#: parents followed at most (a chain longer than this is a loop or a mistake)
MAX_DEPTH = 64

#: Columns every manifest has, in this order (names and types are the contract).
BASE_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("micro", pa.int32()),
        ("sample_ids", pa.list_(pa.int64())),
        ("seq_lens", pa.list_(pa.int32())),
        ("pad_to", pa.int32()),
        ("lr_factor", pa.float64()),
        ("step_tokens", pa.int64()),
        ("step_samples", pa.int64()),
        ("warmup", pa.bool_()),
    ]
)
#: Columns that features add where they apply (shapes: pad_rows; blocks: block_index; cp;
#: --oversize split: sample_offsets, each piece's first token in its document).
OPTIONAL_FIELDS = {
    "pad_rows": pa.int32(),
    "block_index": pa.list_(pa.int32()),
    "cp_placement": pa.list_(pa.int32()),
    "sample_offsets": pa.list_(pa.int64()),
}
#: Carried metadata columns (``varpack plan --carry COL``): ``carry.COL``, a list parallel to
#: ``sample_ids``, of one of these value types (plan.json's ``carry`` names each column's type).
CARRY_PREFIX = "carry."
CARRY_TYPES = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
}
ROW_GROUP = 65536
_WRITERS = max(1, min(2, os.cpu_count() or 1))  # rank files written at once


def rank_file(rank: int) -> str:
    """File name of a rank's manifest.

    >>> rank_file(3)
    'rank-00003.parquet'
    """
    return f"rank-{rank:05d}.parquet"


def manifest_schema(columns: Sequence[str], carry: Sequence[tuple[str, str]] = ()) -> pa.Schema:
    """Base schema plus the optional columns named in ``columns``, in a fixed order, then the
    carried columns ``carry`` (``(name, type)`` pairs, in plan.json's order)."""
    extra = [pa.field(n, t) for n, t in OPTIONAL_FIELDS.items() if n in columns]
    carried = [pa.field(CARRY_PREFIX + n, pa.list_(CARRY_TYPES[t])) for n, t in carry]
    return pa.schema(list(BASE_SCHEMA) + extra + carried)


def carried_columns(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """plan.json's carried columns as ``(name, type)`` pairs (empty for a plan without)."""
    entry = meta.get("carry")
    if not isinstance(entry, dict):
        return []
    return [(c["name"], c["type"]) for c in entry.get("columns", [])]


def table_carry(schema: pa.Schema) -> list[tuple[str, str]]:
    """The carried columns of a manifest table, ``(name, type)`` in column order."""
    types = {t: n for n, t in CARRY_TYPES.items()}
    return [
        (f.name[len(CARRY_PREFIX) :], types.get(f.type.value_type, str(f.type)))
        for f in schema
        if f.name.startswith(CARRY_PREFIX) and pa.types.is_list(f.type)
    ]


def _write_table(table: pa.Table, path: Path) -> dict[str, Any]:
    """Write one manifest; its entry in plan.json (without rank and extras)."""
    # Fixed writer options: identical tables give byte-identical files (same pyarrow version).
    # No dictionary for sample_ids: ids are unique in a plan, so the writer would only build
    # a dictionary to throw it away (about a third of the write time).
    pq.write_table(table, path, row_group_size=ROW_GROUP, **writer_options(table.column_names))
    return {"file": path.name, "rows": table.num_rows, "sha256": sha256_file(path)}


def writer_options(columns: Sequence[str]) -> dict[str, Any]:
    """The Parquet writer's options of a manifest with these columns (a rank file written in
    row groups of :data:`ROW_GROUP` with them is byte-identical, however it is fed)."""
    return {
        "compression": "zstd",
        "write_statistics": True,
        "use_dictionary": [n for n in columns if n != "sample_ids"],
    }


def _join(pool: ThreadPoolExecutor) -> None:
    """Wait until no writer thread runs, then let an error or a signal go on.

    A signal that arrives while the threads are joined interrupts the join: without a second
    wait a writer could still create a rank file while the temporary directory is removed,
    and the directory would stay. The signal handlers ignore further signals by then
    (:func:`varpack.atomic.interruptible`), so the second wait runs to its end.
    """
    try:
        pool.shutdown(wait=True, cancel_futures=True)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise


def write_plan(
    out: str | os.PathLike[str],
    meta: dict[str, Any],
    tables: Iterable[pa.Table],
    overwrite: bool = False,
    rank_extra: Sequence[dict[str, Any]] | None = None,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write the rank manifests, then ``plan.json`` (with their sha256 and rows), atomically.

    ``meta`` holds everything of plan.json except ``format``, ``version`` and ``ranks``, which
    are filled in here. Each table must match :func:`manifest_schema` for its columns.
    ``tables`` may be a generator (one rank in memory at a time); ``rank_extra[r]`` adds keys to
    rank ``r``'s entry (e.g. its ``shapes``). ``inputs``: paths the plan must stay apart from.
    """
    with atomic_dir(out, overwrite, inputs) as tmp:
        # Rank files are written by worker threads (Parquet encoding, compression and hashing
        # release the GIL) while this thread builds the next table; at most WRITERS in flight.
        pending: list[Future[dict[str, Any]]] = []
        entries: list[dict[str, Any]] = []
        pool = ThreadPoolExecutor(max_workers=_WRITERS)
        try:
            for rank, table in enumerate(tables):
                if len(pending) >= _WRITERS:
                    entries.append(pending.pop(0).result())
                pending.append(pool.submit(write_rank_file, table, tmp / rank_file(rank)))
                del table
            entries.extend(f.result() for f in pending)
        finally:
            _join(pool)
        write_plan_json(tmp, meta, entries, rank_extra)
    return Path(out)


def write_rank_file(table: pa.Table, path: Path) -> dict[str, Any]:
    """Write one rank's manifest (its columns in the manifest's order and types); its entry in
    plan.json (without rank and extras)."""
    schema = manifest_schema(table.column_names, table_carry(table.schema))
    if table.schema != schema:
        table = table.select(schema.names).cast(schema)
    return _write_table(table, path)


def write_plan_json(
    tmp: Path,
    meta: dict[str, Any],
    entries: Sequence[dict[str, Any]],
    rank_extra: Sequence[dict[str, Any]] | None = None,
) -> None:
    """plan.json into the directory ``tmp``: ``meta``, the rank files' ``entries`` (with
    ``rank_extra``), the fingerprint and the checksum."""
    ranks = [
        {"rank": rank, **entry, **(rank_extra[rank] if rank_extra is not None else {})}
        for rank, entry in enumerate(entries)
    ]
    doc = {"format": FORMAT, "version": version_of(meta), **meta, "ranks": ranks}
    doc.pop(CHECKSUM_KEY, None)  # a meta taken from another plan: its checksum goes last
    doc[FINGERPRINT_KEY] = plan_fingerprint(doc)
    text = _dump(doc)  # strict JSON first: the checksum is over what plan.json holds
    doc[CHECKSUM_KEY] = plan_checksum(json.loads(text))
    (tmp / PLAN_JSON).write_text(_dump(doc))


def version_of(meta: dict[str, Any]) -> int:
    """The lowest format version that holds every key of ``meta`` (top-level, and one level in).

    >>> version_of({"config": {}}), version_of({"parent": {}, "config": {"sync": "micro"}})
    (4, 4)
    """
    return max([PLAN_VERSION, *(v for k, v in ADDED.items() if _holds(meta, k))])


def _holds(meta: dict[str, Any], key: str) -> bool:
    """Whether ``meta`` has ``key`` (``section.key``: inside that section)."""
    section, _, name = key.rpartition(".")
    where = meta.get(section) if section else meta
    return isinstance(where, dict) and name in where


def _dump(doc: dict[str, Any]) -> str:
    """plan.json's text: strict JSON, so a figure that overflowed (inf, NaN) is refused here."""
    try:
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except ValueError:
        where = _non_finite(doc) or "?"
        raise ConfigError(
            f"the plan's figure {where} is not a finite number: the cost model overflows; "
            "lower --time-per-flop / --time-fixed (or the model's dimensions)"
        ) from None


def _non_finite(node: Any, path: str = "") -> str | None:
    """The first key path holding inf or NaN (the error message's "where")."""
    if isinstance(node, float) and not math.isfinite(node):
        return path or "."
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        found = _non_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


@dataclass
class Plan:
    """A plan on disk: its directory and the parsed ``plan.json``."""

    path: Path
    meta: dict[str, Any]

    @property
    def dp(self) -> int:
        return int(self.meta["layout"]["dp"])

    @property
    def num_steps(self) -> int:
        return int(self.meta["num_steps"])

    @property
    def grad_accum(self) -> int:
        return int(self.meta["layout"]["grad_accum"])

    @property
    def first_step(self) -> int:
        """The run's step this plan starts at: 0, or the step a replanned plan continues its
        parent from (its manifests number steps from there)."""
        parent = self.meta.get("parent")
        return int(parent["from_step"]) if isinstance(parent, dict) else 0

    def rank_entry(self, rank: int) -> dict[str, Any]:
        if not 0 <= rank < self.dp:
            raise InputError(f"{self.path}: rank {rank} is outside the plan's dp={self.dp} ranks")
        return dict(self.meta["ranks"][rank])

    def rank_path(self, rank: int) -> Path:
        """Rank ``rank``'s manifest path, refused unless it is a plain file inside the plan."""
        entry = self.rank_entry(rank)
        problem = file_problem(self.path, rank, entry["file"])
        if problem is not None:
            raise InputError(problem)
        return self.path / entry["file"]

    def verify_rank(self, rank: int) -> list[str]:
        """Problems with one rank file (outside the plan, missing, wrong sha256, unreadable,
        wrong row count); empty if fine."""
        entry = self.rank_entry(rank)
        problem = file_problem(self.path, rank, entry["file"])
        if problem is not None:
            return [problem]  # never hash or open a file the plan does not own
        path = self.path / entry["file"]
        if not path.is_file():
            return [f"{path}: rank {rank} manifest is missing"]
        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            return [_unreadable(path, rank, exc)]  # one line: its checksum cannot match either
        problems = []
        if sha256_file(path) != entry["sha256"]:
            problems.append(
                f"{path}: sha256 does not match plan.json; the file changed after planning"
            )
        if rows != entry["rows"]:
            problems.append(f"{path}: {rows} rows, plan.json says {entry['rows']}")
        return problems

    def rank_table(self, rank: int, verify: bool = True) -> pa.Table:
        """The manifest of ``rank`` (rows in execution order), checked against plan.json."""
        path = self.rank_path(rank)
        if verify:
            problems = self.verify_rank(rank)
            if problems:
                raise InputError(problems[0] + "; re-run varpack plan")
        try:
            return pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(_unreadable(path, rank, exc) + "; re-run varpack plan") from None

    def undeclared_files(self) -> list[str]:
        """One problem per ``*.parquet`` file in the plan directory that plan.json does not name."""
        return [
            f"{self.path / name}: a manifest that plan.json does not declare; remove it (or "
            "re-run varpack plan into an empty directory)"
            for name in undeclared(self.path, [r["file"] for r in self.meta["ranks"]])
        ]


def _unreadable(path: Path, rank: int, exc: Exception) -> str:
    """One line for a rank file Parquet cannot read (truncated, not Parquet)."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return f"{path}: rank {rank} manifest is unreadable (truncated or not Parquet: {reason})"


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """plan.json's content, with its format and version checked (not yet its keys)."""
    root = Path(path)
    doc_path = root / PLAN_JSON
    if not doc_path.is_file():
        raise InputError(f"{root}: no {PLAN_JSON}; not a varpack plan (or planning did not finish)")
    try:
        meta = json.loads(doc_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{doc_path}: unreadable ({exc}); re-run varpack plan") from None
    if not isinstance(meta, dict):
        raise InputError(f"{doc_path}: not a JSON object; not a varpack plan")
    if meta.get("format") != FORMAT:
        raise InputError(f"{doc_path}: format {meta.get('format')!r} is not {FORMAT!r}")
    version = meta.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < OLDEST:
        raise InputError(
            f"{doc_path}: plan version {version!r} is not one this varpack reads ({OLDEST} to "
            f"{VERSION}); re-run varpack plan"
        )
    if version > VERSION:
        raise InputError(
            f"{doc_path}: plan version {version} was written by a newer varpack (this one reads "
            f"{OLDEST} to {VERSION}); upgrade varpack, or re-run varpack plan with this one"
        )
    return meta


def load_plan(path: str | os.PathLike[str], verify: bool = False, full: bool = False) -> Plan:
    """Open a plan directory; check format, version, plan.json's keys and types (``full``: also
    those inspect shows), and its fingerprint; with ``verify``, every rank file and its checksum
    too. Any problem is an :class:`InputError` of one line."""
    plan = open_meta(path, full)
    if verify:
        for rank in range(plan.dp):
            verify_rank_file(plan, rank)
    return finish_plan(plan, verify)


def open_meta(path: str | os.PathLike[str], full: bool = False) -> Plan:
    """:func:`load_plan`'s first part: plan.json read, its keys and the rank file names checked."""
    meta = read_meta(path)
    where = Path(path)
    problems = meta_problems(meta, full=full)
    if problems:
        more = (
            f" (and {len(problems) - 1} more; varpack validate lists them)"
            if len(problems) > 1
            else ""
        )
        raise InputError(f"{where}: {problems[0]}{more}; re-run varpack plan")
    for rank, entry in enumerate(meta["ranks"]):
        bad = name_problem(rank, entry["file"])
        if bad is not None:
            raise InputError(f"{where}: {bad}")
    return Plan(Path(path), meta)


def verify_rank_file(plan: Plan, rank: int) -> None:
    """:func:`load_plan`'s check of one rank file (its first problem, an :class:`InputError`)."""
    problems = plan.verify_rank(rank)
    if problems:
        raise InputError(problems[0] + "; re-run varpack plan")


def finish_plan(plan: Plan, verify: bool) -> Plan:
    """:func:`load_plan`'s last part, after the rank files (``verify``: they were checked, and
    no undeclared one may lie beside them): plan.json's fingerprint and checksum."""
    if verify:
        extra = plan.undeclared_files()
        if extra:
            raise InputError(extra[0])
    # from plan.json alone, so cheap enough for every reader; after the files, so that a changed
    # manifest is named as such, and with verified files the config is the culprit
    mismatch = fingerprint_problem(plan.meta, manifests_ok=verify) or checksum_problem(plan.meta)
    if mismatch is not None:
        raise InputError(f"{plan.path}: {mismatch}")
    return plan
