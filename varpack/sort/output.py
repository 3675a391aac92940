"""On-disk format of ``varpack sort`` output: Parquet parts + ``_index.json``, or one binary file.

**Parts** (default): a directory with ``part-00000.parquet`` ... (one per rank, in global order;
a part may be empty) and ``_index.json``, written last::

    {"format": "varpack.sorted", "version": 1, "keys": [...], "descending": [...],
     "order": keys + ["sample_id"], "columns": {"sample_id": "int64", ...},
     "num_rows": N, "total_tokens": T, "fingerprint": "n..-t..-...",
     "parts": [{"file": "part-00000.parquet", "rows": n0, "offset": 0, "sha256": "..."}, ...],
     "balance": {...}}

**Single file** (``--single-file``): a 4096-byte header, then ``num_rows`` fixed-width
little-endian records, memory-mappable with ``np.memmap(path, dtype, offset=4096)``. The header
is the 8-byte magic ``VPSORTED`` followed by a UTF-8 JSON object (format ``varpack.sorted.bin``,
version, ``header_bytes``, ``num_rows``, ``record_bytes``, ``dtype`` as ``[[name, "<i8"], ...]``,
keys, descending, total_tokens, fingerprint), padded with spaces and ending in a newline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from varpack.errors import InputError
from varpack.fingerprint import sha256_file

INDEX = "_index.json"
FORMAT = "varpack.sorted"
BIN_FORMAT = "varpack.sorted.bin"
VERSION = 1
MAGIC = b"VPSORTED"
HEADER_BYTES = 4096


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
    return {
        "format": FORMAT,
        "version": VERSION,
        **meta,
        "num_rows": int(offsets[-1]),
        "parts": parts,
    }


def record_dtype(columns: dict[str, str]) -> np.dtype:
    """Packed little-endian record of the output columns (``int64`` -> ``<i8``, ``float64`` -> ``<f8``).

    >>> record_dtype({"sample_id": "int64", "seq_len": "int64"}).itemsize
    16
    """
    code = {"int64": "<i8", "float64": "<f8"}
    return np.dtype([(name, code[typ]) for name, typ in columns.items()])


def bin_header(meta: dict[str, Any], num_rows: int) -> bytes:
    """The fixed-size header of a single-file output (identical for every rank count)."""
    dtype = record_dtype(meta["columns"])
    doc = {
        "format": BIN_FORMAT,
        "version": VERSION,
        "header_bytes": HEADER_BYTES,
        "num_rows": int(num_rows),
        "record_bytes": dtype.itemsize,
        "dtype": [[name, dtype[name].str] for name in dtype.names or ()],
        **{k: meta[k] for k in ("keys", "descending", "order", "total_tokens", "fingerprint")},
    }
    text = json.dumps(doc, separators=(",", ":")).encode()
    room = HEADER_BYTES - len(MAGIC) - 1
    if len(text) > room:
        raise InputError(
            f"too many key columns for the single-file header ({len(text)} > {room} bytes)"
        )
    return MAGIC + text + b" " * (room - len(text)) + b"\n"


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and check the header of a single-file output."""
    p = Path(path)
    with open(p, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
        raise InputError(
            f"{p}: not a varpack sort single-file output (bad magic); run `varpack sort --single-file`"
        )
    try:
        doc: dict[str, Any] = json.loads(head[len(MAGIC) :].decode())
    except ValueError:
        raise InputError(f"{p}: corrupt single-file header; rerun `varpack sort`") from None
    if doc.get("format") != BIN_FORMAT or doc.get("version") != VERSION:
        raise InputError(f"{p}: unsupported format {doc.get('format')} v{doc.get('version')}")
    expect = HEADER_BYTES + doc["num_rows"] * doc["record_bytes"]
    size = p.stat().st_size
    if size != expect:
        raise InputError(
            f"{p}: file has {size} bytes, header says {expect}; the output is truncated or corrupt"
        )
    return doc


def read_single_file(path: str | os.PathLike[str]) -> np.ndarray:
    """Memory-map a single-file output as a structured array of records in global order."""
    doc = read_header(path)
    dtype = np.dtype([(name, code) for name, code in doc["dtype"]])
    if doc["num_rows"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(doc["num_rows"],))


def load_index(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``_index.json`` of a parts output (format and version only)."""
    p = Path(path)
    idx = p / INDEX
    if not p.is_dir() or not idx.is_file():
        raise InputError(f"{p}: not a varpack sort output (no {INDEX}); run `varpack sort` first")
    try:
        index: dict[str, Any] = json.loads(idx.read_text())
    except ValueError:
        raise InputError(f"{idx}: not valid JSON; rerun `varpack sort`") from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise InputError(f"{idx}: unsupported format {index.get('format')} v{index.get('version')}")
    return index


def read_sorted(
    path: str | os.PathLike[str], verify: bool = True
) -> tuple[pa.Table, dict[str, Any]]:
    """Read a ``varpack sort`` output in global order; returns ``(table, index)``.

    Works on a parts directory (parts in index order, each part's sha256 and row count checked
    when ``verify``) and on a ``--single-file`` output (header checked). The table has
    ``sample_id`` int64, ``seq_len`` int64 and the key columns.
    """
    p = Path(path)
    if p.is_file():
        doc = read_header(p)
        records = read_single_file(p)
        return pa.table({name: np.array(records[name]) for name in records.dtype.names or ()}), doc
    index = load_index(p)
    tables = []
    expect = 0
    for part in index["parts"]:
        f = p / part["file"]
        if not f.is_file():
            raise InputError(f"{f}: part listed in {INDEX} is missing; rerun `varpack sort`")
        if verify and sha256_file(f) != part["sha256"]:
            raise InputError(
                f"{f}: sha256 does not match {INDEX}; the output was modified, rerun `varpack sort`"
            )
        table = pq.read_table(f)
        if table.num_rows != part["rows"] or part["offset"] != expect:
            raise InputError(
                f"{f}: {table.num_rows} rows at offset {expect}, {INDEX} says {part['rows']} at {part['offset']}"
            )
        expect += table.num_rows
        tables.append(table)
    if expect != index["num_rows"]:
        raise InputError(f"{p}: parts hold {expect} rows, {INDEX} says {index['num_rows']}")
    schema = pa.schema(
        [(name, pa.from_numpy_dtype(np.dtype(t))) for name, t in index["columns"].items()]
    )
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table, index
