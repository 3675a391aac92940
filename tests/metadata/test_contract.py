"""The metadata contract: reading files, directories and globs, and every bad-input message."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli, write_metadata, write_shards

from varpack.errors import InputError
from varpack.metadata.contract import (
    list_pieces,
    read_metadata,
    read_piece,
    resolve_files,
    validate_table,
)

# --- reading valid input -------------------------------------------------------------------------


def test_read_directory_in_path_order_and_normalised(tmp_path: Path) -> None:
    root = tmp_path / "meta"
    # written out of order; read back in path order
    write_metadata(root / "b.parquet", [30, 40], [3, 4])
    write_metadata(root / "a.parquet", [10, 20], [1, 2])
    (root / "sub").mkdir()
    int32 = {"sample_id": pa.array([50], pa.int32()), "seq_len": pa.array([5], pa.int32())}
    pq.write_table(pa.table(int32), root / "sub" / "c.parquet")
    (root / "_index.json").write_text("{}")
    write_metadata(root / ".hidden" / "x.parquet", [1], [1])  # skipped: hidden
    write_metadata(root / "_tmp.parquet", [2], [2])  # skipped: underscore
    table = read_metadata(root)
    assert table.schema.field("sample_id").type == pa.int64()
    assert table.schema.field("seq_len").type == pa.int64()
    assert table.column("sample_id").to_pylist() == [10, 20, 30, 40, 50]
    assert table.column("seq_len").to_pylist() == [1, 2, 3, 4, 5]


def test_read_file_glob_and_list(tmp_path: Path) -> None:
    write_shards(tmp_path / "m", np.arange(10), np.arange(1, 11), [3, 0, 7])
    files = resolve_files(str(tmp_path / "m" / "shard-*.parquet"))
    assert [f.name for f in files] == [
        "shard-000.parquet",
        "shard-001.parquet",
        "shard-002.parquet",
    ]
    assert read_metadata(files[2]).num_rows == 7
    assert read_metadata(files).column("sample_id").to_pylist() == list(range(10))
    assert read_metadata(str(tmp_path / "m" / "*.parquet")).num_rows == 10


def test_key_columns_and_extra_columns(tmp_path: Path) -> None:
    path = write_metadata(
        tmp_path / "m.parquet", [1, 2], [5, 6], difficulty=[0.5, 0.25], note=["a", "b"]
    )
    table = read_metadata(path, keys=["difficulty"])
    assert table.column_names == ["sample_id", "seq_len", "difficulty"]
    assert table.column("difficulty").to_pylist() == [0.5, 0.25]
    assert read_metadata(path).column_names == ["sample_id", "seq_len"]  # other columns ignored


def test_pieces_carry_file_row_offsets(tmp_path: Path) -> None:
    path = write_metadata(tmp_path / "m.parquet", np.arange(10), np.ones(10), row_group_size=4)
    pieces = list_pieces([path])
    assert [(p.row_group, p.num_rows, p.file_row_offset) for p in pieces] == [
        (0, 4, 0),
        (1, 4, 4),
        (2, 2, 8),
    ]
    assert read_piece(pieces[2]).column("sample_id").to_pylist() == [8, 9]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=5),
    st.integers(0, 2**32),
    st.integers(1, 7),
)
def test_read_metadata_round_trips_any_sharding(sizes: list[int], seed: int, rg: int) -> None:
    import tempfile

    n = sum(sizes)
    rng = np.random.default_rng(seed)
    ids = rng.choice(10 * n + 10, size=n, replace=False)
    lens = rng.integers(1, 1000, n)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        start = 0
        for k, size in enumerate(sizes):
            sl = slice(start, start + size)
            write_metadata(root / f"s{k:02d}.parquet", ids[sl], lens[sl], row_group_size=rg)
            start += size
        if n == 0:
            with pytest.raises(InputError, match="holds no rows"):
                read_metadata(root)
            return
        table = read_metadata(root)
        assert table.column("sample_id").to_numpy().tolist() == ids.tolist()
        assert table.column("seq_len").to_numpy().tolist() == lens.tolist()


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 60), st.integers(0, 2**32), st.sampled_from(["null", "zero", "neg_id"]))
def test_first_offending_row_is_named(n: int, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    bad = int(rng.integers(0, n))
    ids = pa.array(np.arange(100, 100 + n), pa.int64())
    lens = np.arange(1, n + 1)
    if kind == "zero":
        lens[bad:] = 0  # several offences: the first one is reported
    lens_arr = pa.array(lens, mask=np.arange(n) >= bad if kind == "null" else None)
    if kind == "neg_id":
        ids = pa.array(np.where(np.arange(n) >= bad, -1, np.arange(100, 100 + n)), pa.int64())
    with pytest.raises(InputError, match=rf"^f\.parquet: row {7 + bad}\b"):
        validate_table(pa.table({"sample_id": ids, "seq_len": lens_arr}), "f.parquet", 7)


# --- every bad input: one message naming what, where and what to do ------------------------------

Case = Callable[[Path], tuple[str, list[str]]]


def _table(path: Path, **cols: pa.Array) -> tuple[str, list[str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return str(path), []


def _i64(values: list[int | None]) -> pa.Array:
    return pa.array(values, pa.int64())


def _missing_len(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", sample_id=_i64([1, 2]), length=_i64([1, 2]))


def _missing_id(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", seq_len=_i64([1, 2]))


def _float_id(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", sample_id=pa.array([1.0, 2.0]), seq_len=_i64([1, 2]))


def _string_len(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", sample_id=_i64([1, 2]), seq_len=pa.array(["1", "2"]))


def _null_id(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", sample_id=_i64([1, None, 3]), seq_len=_i64([1, 2, 3]))


def _null_len(d: Path) -> tuple[str, list[str]]:
    return _table(d / "m.parquet", sample_id=_i64([1, 2, 3]), seq_len=_i64([1, 2, None]))


def _zero_len(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [4, 5, 6], [3, 0, 2])), []


def _negative_len(d: Path) -> tuple[str, list[str]]:
    # the offence sits in the second row group: the row is counted from the file's start
    return str(write_metadata(d / "m.parquet", [4, 5, 6, 7], [3, 1, 2, -5], row_group_size=2)), []


def _negative_id(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [4, -1, 6], [3, 1, 2])), []


def _huge_uint_id(d: Path) -> tuple[str, list[str]]:
    ids = pa.array([1, 2**63 + 5], pa.uint64())
    return _table(d / "m.parquet", sample_id=ids, seq_len=_i64([1, 2]))


def _dup_in_shard(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [9, 5, 7, 5], [1, 1, 1, 1])), []


def _dup_across_shards(d: Path) -> tuple[str, list[str]]:
    write_metadata(d / "m" / "a.parquet", [1, 2, 3], [1, 1, 1])
    write_metadata(d / "m" / "b.parquet", [4, 2], [1, 1])
    return str(d / "m"), []


def _no_rows(d: Path) -> tuple[str, list[str]]:
    write_metadata(d / "m" / "a.parquet", [], [])
    write_metadata(d / "m" / "b.parquet", [], [])
    return str(d / "m"), []


def _empty_dir(d: Path) -> tuple[str, list[str]]:
    (d / "m").mkdir()
    (d / "m" / "notes.txt").write_text("no parquet here")
    return str(d / "m"), []


def _glob_nothing(d: Path) -> tuple[str, list[str]]:
    return str(d / "nothing-*.parquet"), []


def _no_such_path(d: Path) -> tuple[str, list[str]]:
    return str(d / "absent"), []


def _corrupt(d: Path) -> tuple[str, list[str]]:
    write_metadata(d / "m" / "a.parquet", [1], [1])
    (d / "m" / "x.parquet").write_bytes(np.random.default_rng(0).bytes(4096))
    return str(d / "m"), []


def _zero_bytes(d: Path) -> tuple[str, list[str]]:
    (d / "x.parquet").write_bytes(b"")
    return str(d / "x.parquet"), []


def _truncated(d: Path) -> tuple[str, list[str]]:
    path = write_metadata(d / "x.parquet", np.arange(1000), np.ones(1000))
    path.write_bytes(path.read_bytes()[:-100])
    return str(path), []


def _key_missing(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [1], [1])), ["difficulty"]


def _key_string(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [1], [1], difficulty=["hard"])), ["difficulty"]


def _key_null(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [1, 2], [1, 1], difficulty=[0.5, None])), [
        "difficulty"
    ]


def _key_nan(d: Path) -> tuple[str, list[str]]:
    return str(write_metadata(d / "m.parquet", [1, 2], [1, 1], difficulty=[0.5, np.nan])), [
        "difficulty"
    ]


BAD_INPUTS: dict[str, tuple[Case, str]] = {
    "missing seq_len": (
        _missing_len,
        r"m\.parquet: missing column 'seq_len' \(columns: sample_id, length\)",
    ),
    "missing sample_id": (_missing_id, r"m\.parquet: missing column 'sample_id'"),
    "float sample_id": (
        _float_id,
        r"m\.parquet: column 'sample_id' has type double, expected an integer",
    ),
    "string seq_len": (
        _string_len,
        r"m\.parquet: column 'seq_len' has type string, expected an integer",
    ),
    "null sample_id": (_null_id, r"m\.parquet: row 1: null in column 'sample_id'"),
    "null seq_len": (_null_len, r"m\.parquet: row 2: null in column 'seq_len'"),
    "zero seq_len": (_zero_len, r"m\.parquet: row 1 \(sample_id 5\): non-positive seq_len"),
    "negative seq_len": (_negative_len, r"m\.parquet: row 3 \(sample_id 7\): non-positive seq_len"),
    "negative id": (_negative_id, r"m\.parquet: row 1 \(sample_id -1\): negative sample_id"),
    "uint64 id too big": (
        _huge_uint_id,
        r"m\.parquet: row 1: sample_id value [0-9,]+ does not fit int64",
    ),
    "duplicate in shard": (
        _dup_in_shard,
        r"duplicate sample_id 5 in \S*m\.parquet row 1 and \S*m\.parquet row 3",
    ),
    "duplicate across shards": (
        _dup_across_shards,
        r"duplicate sample_id 2 in \S*a\.parquet row 1 and \S*b\.parquet row 1; sample ids must be unique",
    ),
    "no rows": (_no_rows, r"m: the metadata holds no rows"),
    "empty directory": (_empty_dir, r"m: directory holds no \*\.parquet files"),
    "glob matches nothing": (_glob_nothing, r"nothing-\*\.parquet: the pattern matches no file"),
    "no such path": (_no_such_path, r"absent: no such file or directory"),
    "corrupt file": (
        _corrupt,
        r"x\.parquet: cannot read as Parquet \(.+\); replace or remove the file",
    ),
    "zero-byte file": (_zero_bytes, r"x\.parquet: cannot read as Parquet"),
    "truncated file": (_truncated, r"x\.parquet: cannot read as Parquet"),
    "key missing": (_key_missing, r"m\.parquet: missing key column 'difficulty'"),
    "key not numeric": (
        _key_string,
        r"m\.parquet: key column 'difficulty' has type string, expected a numeric",
    ),
    "key null": (_key_null, r"m\.parquet: row 1: null in column 'difficulty'"),
    "key NaN": (_key_nan, r"m\.parquet: row 1 \(sample_id 2\): NaN in key column 'difficulty'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_message(tmp_path: Path, case: str) -> None:
    build, pattern = BAD_INPUTS[case]
    spec, keys = build(tmp_path)
    with pytest.raises(InputError, match=pattern):
        read_metadata(spec, keys)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_cli_one_line_exit_2(tmp_path: Path, case: str) -> None:
    build, pattern = BAD_INPUTS[case]
    spec, keys = build(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    args = ["check", spec, *(a for k in keys for a in ("--key", k))]
    result = cli(*args, expect=2)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("varpack: error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
