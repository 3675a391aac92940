"""On-disk format of ``varpack sort`` output: Parquet parts + ``_index.json``, or one binary file.

**Parts** (default): a directory with ``part-00000.parquet`` ... (one per rank, in global order;
a part may be empty) and ``_index.json``, written last::

    {"format": "varpack.sorted", "version": 2, "keys": [...], "descending": [...],
     "order": keys + ["sample_id"], "columns": {"sample_id": "int64", ...},
     "num_rows": N, "total_tokens": T, "fingerprint": "n..-t..-...",
     "parts": [{"file": "part-00000.parquet", "rows": n0, "offset": 0, "sha256": "..."}, ...],
     "balance": {...}, "checksum": "..."}

**Single file** (``--single-file``): a 4096-byte header, then ``num_rows`` fixed-width
little-endian records, memory-mappable with ``np.memmap(path, dtype, offset=4096)``. The header
is the 8-byte magic ``VPSORTED`` followed by a UTF-8 JSON object (format ``varpack.sorted.bin``,
version, ``header_bytes``, ``num_rows``, ``record_bytes``, ``dtype`` as ``[[name, "<i8"], ...]``,
keys, descending, total_tokens, fingerprint, ``sha256`` of the records, checksum), padded with
spaces and ending in a newline.

**Integrity.** Readers check the index or header before opening anything it names
(:func:`check_index`, :func:`check_header`): every key with its type, the parts named exactly
``part-00000.parquet`` ... in order (a name is never a path, so nothing outside the output is
opened), offsets and rows adding up, and ``checksum``, a sha256 over every other key (a flipped
bit or a hand edit anywhere in it is caught); then each part's sha256 or the records' sha256.
Every problem is one :class:`~varpack.errors.InputError` line. An index of version 1 (no
``checksum``) is still read; a version-1 single file, whose records carry no checksum, is
refused with the command that rewrites it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from varpack.errors import InputError
from varpack.fingerprint import sha256_file

INDEX = "_index.json"
FORMAT = "varpack.sorted"
BIN_FORMAT = "varpack.sorted.bin"
VERSION = 2
MAGIC = b"VPSORTED"
HEADER_BYTES = 4096
#: key of the sha256 over every other key of the index or header
CHECKSUM = "checksum"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CODES = {"int64": "<i8", "float64": "<f8"}
_RESORT = "rerun `varpack sort`"


def is_sorted_output(path: str | os.PathLike[str]) -> bool:
    """A ``varpack sort`` output: a directory with ``_index.json`` or a single-file binary."""
    p = Path(path)
    if p.is_dir():
        return (p / INDEX).is_file()
    if p.is_file() and p.suffix != ".parquet":
        try:
            with open(p, "rb") as fh:
                return fh.read(len(MAGIC)) == MAGIC
        except OSError:
            return False
    return False


def part_name(rank: int) -> str:
    """File name of rank ``rank``'s part.

    >>> part_name(3)
    'part-00003.parquet'
    """
    return f"part-{rank:05d}.parquet"


def write_part(table: pa.Table, path: Path) -> str:
    """Write one sorted part (the order is the file's row order); return its sha256."""
    # Dictionary encoding pays off for the sorted, repetitive key columns, not for unique ids.
    dict_cols = [c for c in table.column_names if c != "sample_id"]
    pq.write_table(table, path, use_dictionary=dict_cols, compression="snappy")
    return sha256_file(path)


def make_index(
    meta: dict[str, Any], files: Sequence[str], rows: Sequence[int], sha: Sequence[str]
) -> dict[str, Any]:
    """The index: ``meta`` (keys, columns, fingerprint ...) plus the parts with global offsets."""
    offsets = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
    parts = [
        {"file": f, "rows": int(r), "offset": int(o), "sha256": s}
        for f, r, o, s in zip(files, rows, offsets[:-1], sha, strict=True)
    ]
    index = {
        "format": FORMAT,
        "version": VERSION,
        **meta,
        "num_rows": int(offsets[-1]),
        "parts": parts,
    }
    return {**index, CHECKSUM: doc_checksum(index)}


def doc_checksum(doc: dict[str, Any]) -> str:
    """sha256 over a canonical JSON of every key of ``doc`` but :data:`CHECKSUM`."""
    body = {k: v for k, v in doc.items() if k != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def record_dtype(columns: dict[str, str]) -> np.dtype:
    """Packed little-endian record of the output columns (``int64`` -> ``<i8``, ``float64`` -> ``<f8``).

    >>> record_dtype({"sample_id": "int64", "seq_len": "int64"}).itemsize
    16
    """
    code = {"int64": "<i8", "float64": "<f8"}
    return np.dtype([(name, code[typ]) for name, typ in columns.items()])


def bin_header(meta: dict[str, Any], num_rows: int, sha256: str) -> bytes:
    """The fixed-size header of a single-file output whose records have the hex ``sha256``
    (identical for every rank count)."""
    dtype = record_dtype(meta["columns"])
    doc = {
        "format": BIN_FORMAT,
        "version": VERSION,
        "header_bytes": HEADER_BYTES,
        "num_rows": int(num_rows),
        "record_bytes": dtype.itemsize,
        "dtype": [[name, dtype[name].str] for name in dtype.names or ()],
        **{k: meta[k] for k in ("keys", "descending", "order", "total_tokens", "fingerprint")},
        "sha256": sha256,
    }
    doc[CHECKSUM] = doc_checksum(doc)
    text = json.dumps(doc, separators=(",", ":")).encode()
    room = HEADER_BYTES - len(MAGIC) - 1
    if len(text) > room:
        raise InputError(
            f"too many key columns for the single-file header ({len(text)} > {room} bytes)"
        )
    return MAGIC + text + b" " * (room - len(text)) + b"\n"


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and check the header of a single-file output (:func:`check_header`) and its size."""
    p = Path(path)
    with open(p, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
        raise InputError(
            f"{p}: not a varpack sort single-file output (bad magic); run `varpack sort --single-file`"
        )
    try:
        doc = json.loads(head[len(MAGIC) :].decode())
    except ValueError:
        raise InputError(f"{p}: corrupt single-file header; {_RESORT}") from None
    check_header(doc, p)
    expect = HEADER_BYTES + doc["num_rows"] * doc["record_bytes"]
    size = p.stat().st_size
    if size != expect:
        raise InputError(
            f"{p}: file has {size} bytes, header says {expect}; the output is truncated or corrupt"
        )
    return dict(doc)


def read_single_file(path: str | os.PathLike[str], verify: bool = True) -> np.ndarray:
    """Memory-map a single-file output as a structured array of records in global order
    (``verify``: the records' sha256 checked against the header first)."""
    doc = read_header(path)
    if verify and sha256_file(path, skip=HEADER_BYTES) != doc["sha256"]:
        raise InputError(
            f"{path}: the records' sha256 does not match the header; the file was modified "
            f"or damaged after the sort, {_RESORT}"
        )
    dtype = np.dtype([(name, code) for name, code in doc["dtype"]])
    if doc["num_rows"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(doc["num_rows"],))


def load_index(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``_index.json`` of a parts output, checked by :func:`check_index`."""
    p = Path(path)
    idx = p / INDEX
    if not p.is_dir() or not idx.is_file():
        raise InputError(f"{p}: not a varpack sort output (no {INDEX}); run `varpack sort` first")
    try:
        index = json.loads(idx.read_text())
    except (OSError, ValueError):
        raise InputError(f"{idx}: not valid JSON; {_RESORT}") from None
    check_index(index, idx)
    return dict(index)


def read_sorted(
    path: str | os.PathLike[str], verify: bool = True
) -> tuple[pa.Table, dict[str, Any]]:
    """Read a ``varpack sort`` output in global order; returns ``(table, index)``.

    Works on a parts directory (parts in index order, each part's sha256 and row count checked
    when ``verify``) and on a ``--single-file`` output (header and, with ``verify``, the records'
    sha256 checked). The table has ``sample_id`` int64, ``seq_len`` int64 and the key columns.
    """
    p = Path(path)
    if p.is_file():
        records = read_single_file(p, verify)
        doc = read_header(p)
        return pa.table({name: np.array(records[name]) for name in records.dtype.names or ()}), doc
    index = load_index(p)
    schema = pa.schema(
        [(name, pa.from_numpy_dtype(np.dtype(t))) for name, t in index["columns"].items()]
    )
    tables = []
    for part in index["parts"]:
        f = p / part["file"]
        _check_part_file(f)
        if verify and sha256_file(f) != part["sha256"]:
            raise InputError(
                f"{f}: sha256 does not match {INDEX}; the output was modified, {_RESORT}"
            )
        try:
            table = pq.read_table(f)
        except (OSError, pa.ArrowException) as exc:
            reason = " ".join(str(exc).split())[:120]
            raise InputError(f"{f}: unreadable part ({reason}); {_RESORT}") from None
        if table.num_rows != part["rows"] or table.schema.remove_metadata() != schema:
            raise InputError(
                f"{f}: {table.num_rows} rows of {table.schema.names}, {INDEX} says "
                f"{part['rows']} of {schema.names}; {_RESORT}"
            )
        tables.append(table)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table, index


def _check_part_file(f: Path) -> None:
    """A part must be a plain file (a symlink is not followed, a missing part is named)."""
    try:
        mode = os.lstat(f).st_mode
    except FileNotFoundError:
        raise InputError(f"{f}: part listed in {INDEX} is missing; {_RESORT}") from None
    except OSError as exc:
        raise InputError(f"{f}: part cannot be examined ({exc.strerror}); {_RESORT}") from None
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a plain file"
        raise InputError(f"{f}: part listed in {INDEX} is {kind}, not opened; {_RESORT}")


# -- checks of the index and the header ---------------------------------------------------------

Fail = Callable[[str], NoReturn]


def _describe(value: Any) -> str:
    """A JSON value by its type and (short) text, on one line."""
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list"}
    name = "an object" if isinstance(value, dict) else kind.get(type(value), type(value).__name__)
    text = json.dumps(value)
    return f"{name} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _get(
    doc: dict[str, Any],
    key: str,
    test: Callable[[Any], bool],
    what: str,
    fail: Fail,
    at: str = "",
) -> Any:
    """``doc[key]``, present and passing ``test``; else ``fail`` names the key (inside ``at``)
    and what it must be."""
    if key not in doc:
        fail(f"{at}{': ' if at else ''}missing key {key!r} ({what})")
    value = doc[key]
    if not test(value):
        fail(f"{at}{'.' if at else ''}{key}: expected {what}, found {_describe(value)}")
    return value


def _version(doc: dict[str, Any], fmt: str, oldest: int, what: str, fail: Fail) -> int:
    """The format and a readable version (``oldest`` .. :data:`VERSION`)."""
    if doc.get("format") != fmt:
        fail(f"unsupported format {doc.get('format')!r} (expected {fmt!r}); not {what}")
    version: Any = doc.get("version")
    if not _is_int(version, 1):
        fail(f"unsupported version {version!r}")
    if version > VERSION:
        fail(
            f"{what} of version {version}, newer than this varpack reads ({oldest} to {VERSION}); "
            "upgrade varpack, or rerun `varpack sort` with this one"
        )
    if version < oldest:
        fail(
            f"{what} of version {version}, which carries no checksum of its records (this "
            f"varpack reads {oldest} to {VERSION}); rerun `varpack sort --single-file` to rewrite it"
        )
    return int(version)


def _check_keys(doc: dict[str, Any], columns: list[str], fail: Fail) -> None:
    """keys, descending and order of an index or header, against its columns."""
    keys = _get(doc, "keys", lambda v: _names(v) and len(v) > 0, "a list of key columns", fail)
    _get(
        doc,
        "descending",
        lambda v: _names(v) and set(v) <= set(keys),
        "a list of key columns (among keys)",
        fail,
    )
    order = keys if "sample_id" in keys else [*keys, "sample_id"]
    _get(doc, "order", lambda v: v == order, f"the keys then sample_id, {order}", fail)
    want = list(dict.fromkeys(["sample_id", "seq_len", *keys]))
    if columns != want:
        fail(f"columns {columns} do not fit the keys (expected {want})")
    _get(doc, "total_tokens", _is_int, "an integer >= 0", fail)
    _get(doc, "fingerprint", lambda v: isinstance(v, str), "a string", fail)
    _get(doc, "num_rows", _is_int, "an integer >= 0", fail)


def _check_sum(doc: dict[str, Any], fail: Fail) -> None:
    recorded = _get(doc, CHECKSUM, _sha, "a sha256 (64 hex digits)", fail)
    if recorded != doc_checksum(doc):
        fail(f"{CHECKSUM} does not match the content: it was changed after the sort")


def _sha(v: Any) -> bool:
    return isinstance(v, str) and bool(_HEX64.fullmatch(v))


def _failer(where: Path) -> Fail:
    def fail(what: str) -> NoReturn:
        raise InputError(f"{where}: {what}; {_RESORT}")

    return fail


def check_index(index: Any, where: Path) -> None:
    """Refuse (one line naming the key) an ``_index.json`` that is not the sort's own."""
    fail = _failer(where)
    if not isinstance(index, dict):
        fail(f"expected a JSON object, found {_describe(index)}")
    version = _version(index, FORMAT, 1, "a sort index", fail)
    columns = _get(
        index,
        "columns",
        lambda v: isinstance(v, dict) and all(t in _CODES for t in v.values()),
        'an object of column types ("int64" or "float64")',
        fail,
    )
    if columns.get("sample_id") != "int64" or columns.get("seq_len") != "int64":
        fail('columns: sample_id and seq_len must be "int64"')
    _check_keys(index, list(columns), fail)
    parts = _get(index, "parts", lambda v: isinstance(v, list), "a list of parts", fail)
    offset = 0
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            fail(f"parts[{i}]: expected an object, found {_describe(part)}")
        name = part.get("file")
        if name != part_name(i):
            fail(
                f"parts[{i}].file is {_describe(name)}, not {part_name(i)!r}: a part is named "
                "by its place in the output, never a path (nothing outside the output is opened)"
            )
        _get(part, "rows", _is_int, "an integer >= 0", fail, f"parts[{i}]")
        if part.get("offset") != offset:
            fail(f"parts[{i}].offset is {_describe(part.get('offset'))}, expected {offset}")
        _get(part, "sha256", _sha, "a sha256 (64 hex digits)", fail, f"parts[{i}]")
        offset += part["rows"]
    if offset != index["num_rows"]:
        fail(f"the parts hold {offset} rows, num_rows says {index['num_rows']}")
    if "balance" in index and not isinstance(index["balance"], dict):
        fail(f"balance: expected an object, found {_describe(index['balance'])}")
    if version >= 2 or CHECKSUM in index:  # a version-1 index holds none
        _check_sum(index, fail)


def check_header(doc: Any, where: Path) -> None:
    """Refuse (one line naming the key) a single-file header that is not the sort's own."""
    fail = _failer(where)
    if not isinstance(doc, dict):
        fail(f"expected a JSON object in the header, found {_describe(doc)}")
    _version(doc, BIN_FORMAT, 2, "a single-file sort output", fail)
    _get(doc, "header_bytes", lambda v: v == HEADER_BYTES, str(HEADER_BYTES), fail)
    pairs = _get(
        doc,
        "dtype",
        lambda v: (
            isinstance(v, list)
            and all(
                isinstance(x, list)
                and len(x) == 2
                and isinstance(x[0], str)
                and x[1] in ("<i8", "<f8")
                for x in v
            )
        ),
        'a list of [name, "<i8" or "<f8"]',
        fail,
    )
    columns = [name for name, _ in pairs]
    if pairs[:2] != [["sample_id", "<i8"], ["seq_len", "<i8"]] or len(set(columns)) != len(pairs):
        fail('dtype: sample_id and seq_len must come first as "<i8", each name once')
    _get(doc, "record_bytes", lambda v: v == 8 * len(pairs), f"{8 * len(pairs)}", fail)
    _check_keys(doc, columns, fail)
    _get(doc, "sha256", _sha, "the records' sha256 (64 hex digits)", fail)
    _check_sum(doc, fail)
