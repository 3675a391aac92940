"""``varpack lengths``: exact ids and lengths from a tokenized Parquet dataset, streaming, errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli

from varpack.errors import InputError
from varpack.metadata.contract import read_metadata, resolve_files
from varpack.metadata.lengths import derive_lengths, iter_lengths, list_sources


def write_tokens(
    path: Path,
    lens: np.ndarray | list[int],
    ids: np.ndarray | list[int] | None = None,
    row_group_size: int | None = None,
    list_type: pa.DataType | None = None,
    **extra: pa.Array,
) -> Path:
    """A tokenized shard: ``input_ids`` lists of the given lengths (+ optional ``doc_id``)."""
    lens = np.asarray(lens, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = pa.array(np.arange(offsets[-1], dtype=np.int32) % 1000)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), values)
    if list_type is not None:
        tokens = tokens.cast(list_type)
    cols: dict[str, pa.Array] = {"text_len": pa.array(lens * 3), "input_ids": tokens}
    if ids is not None:
        cols["doc_id"] = pa.array(np.asarray(ids, dtype=np.int64))
    cols.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """Four shards (one empty) in a nested directory, written out of path order, 3-7 rows per group."""
    rng = np.random.default_rng(3)
    sizes = {"z/c.parquet": 23, "a.parquet": 17, "b.parquet": 0, "z/b.parquet": 31}
    order = sorted(sizes)  # the file order lengths must follow: a, b, z/b, z/c
    total = sum(sizes.values())
    lens = rng.integers(1, 300, total)
    ids = rng.choice(10**9, size=total, replace=False)
    start = {name: sum(sizes[o] for o in order[: order.index(name)]) for name in order}
    root = tmp_path / "tok"
    for k, name in enumerate(sizes):  # creation order differs from path order
        sl = slice(start[name], start[name] + sizes[name])
        write_tokens(root / name, lens[sl], ids[sl], row_group_size=3 + k)
    return root, ids, lens


def test_row_position_ids(tmp_path: Path, dataset: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, _, lens = dataset
    cli("lengths", root, tmp_path / "meta", "--quiet")
    table = read_metadata(tmp_path / "meta")
    assert table.column("sample_id").to_pylist() == list(range(len(lens)))
    assert table.column("seq_len").to_pylist() == lens.tolist()


def test_id_column_and_shards(tmp_path: Path, dataset: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, ids, lens = dataset
    cli("lengths", root, tmp_path / "meta", "--id-column", "doc_id", "--rows-per-shard", "20", "-q")
    files = resolve_files(tmp_path / "meta")
    assert [f.name for f in files] == [f"part-{k:05d}.parquet" for k in range(4)]
    assert [pq.read_metadata(f).num_rows for f in files] == [20, 20, 20, 11]
    schema = pq.read_schema(files[0])
    assert schema.field("sample_id").type == pa.int64()
    assert schema.field("seq_len").type == pa.int32()
    table = read_metadata(tmp_path / "meta")
    assert table.column("sample_id").to_pylist() == ids.tolist()
    assert table.column("seq_len").to_pylist() == lens.tolist()


def test_column_choice_large_and_fixed_size_lists(tmp_path: Path) -> None:
    write_tokens(tmp_path / "large.parquet", [3, 1, 4], list_type=pa.large_list(pa.int32()))
    derive_lengths(tmp_path / "large.parquet", tmp_path / "o1")
    assert read_metadata(tmp_path / "o1").column("seq_len").to_pylist() == [3, 1, 4]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int32)), 4)
    write_tokens(tmp_path / "f.parquet", [1, 2, 3], pixels=fixed)
    derive_lengths(tmp_path / "f.parquet", tmp_path / "o2", column="pixels")
    assert read_metadata(tmp_path / "o2").column("seq_len").to_pylist() == [4, 4, 4]


def test_streams_one_row_group_at_a_time(dataset: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, _, lens = dataset
    sources = list_sources(resolve_files(root), "input_ids", None)
    assert [s.row_offset for s in sources] == [0, 17, 17, 48]
    chunks = list(iter_lengths(sources, "input_ids", None))
    groups = [
        pq.ParquetFile(s.path).metadata.row_group(i).num_rows
        for s in sources
        for i in range(s.num_row_groups)
    ]
    assert [t.num_rows for _, t in chunks] == groups  # one yield per input row group
    assert (
        np.concatenate([t.column("seq_len").to_numpy() for _, t in chunks]).tolist()
        == lens.tolist()
    )


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 50), max_size=12), min_size=1, max_size=4),
    st.integers(1, 5),
    st.integers(1, 9),
)
def test_any_layout_round_trips(shards: list[list[int]], rg: int, per_shard: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for k, lens in enumerate(shards):
            write_tokens(root / "in" / f"s{k}.parquet", lens, row_group_size=rg)
        flat = [x for lens in shards for x in lens]
        if not flat:
            with pytest.raises(InputError, match="holds no rows"):
                derive_lengths(root / "in", root / "out")
            assert not (root / "out").exists()
            return
        result = derive_lengths(root / "in", root / "out", rows_per_shard=per_shard)
        assert result.num_samples == len(flat) and result.tokens == sum(flat)
        assert len(result.files) == -(-len(flat) // per_shard)
        assert read_metadata(root / "out").column("seq_len").to_pylist() == flat


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    write_tokens(tmp_path / "t.parquet", [1, 2])
    cli("lengths", tmp_path / "t.parquet", tmp_path / "out", "-q")
    result = cli("lengths", tmp_path / "t.parquet", tmp_path / "out", expect=2)
    assert "already exists; pass --overwrite" in result.stderr
    cli("lengths", tmp_path / "t.parquet", tmp_path / "out", "--overwrite", "-q")
    assert read_metadata(tmp_path / "out").num_rows == 2
    # A directory varpack did not write is never replaced, --overwrite or not.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = cli("lengths", tmp_path / "t.parquet", tmp_path / "mine", "--overwrite", expect=2)
    assert "not an output varpack wrote" in result.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# --- bad input -----------------------------------------------------------------------------------


def _bad(d: Path, case: str) -> list[str]:
    """Build a bad dataset under ``d / 'in'``; return the extra CLI options."""
    src = d / "in"
    if case == "missing column":
        write_tokens(src / "a.parquet", [1, 2])
        return ["--column", "tokens"]
    if case == "not a list":
        write_tokens(src / "a.parquet", [1, 2])
        return ["--column", "text_len"]
    if case == "empty list":
        write_tokens(src / "a.parquet", [4, 5])
        write_tokens(src / "b.parquet", [3, 2, 7, 0, 1], row_group_size=2)
        return []
    if case == "null list":
        tokens = pa.array([[1], None, [2, 3]], pa.list_(pa.int32()))
        pq.write_table(pa.table({"input_ids": tokens}), _mk(src / "a.parquet"))
        return []
    if case == "id column missing":
        write_tokens(src / "a.parquet", [1, 2])
        return ["--id-column", "doc_id"]
    if case == "id column not integer":
        write_tokens(src / "a.parquet", [1, 2], doc_id=pa.array(["x", "y"]))
        return ["--id-column", "doc_id"]
    if case == "null id":
        write_tokens(src / "a.parquet", [1, 2, 3], doc_id=pa.array([1, None, 3], pa.int64()))
        return ["--id-column", "doc_id"]
    if case == "negative id":
        write_tokens(src / "a.parquet", [1, 2, 3], ids=[5, -2, 7])
        return ["--id-column", "doc_id"]
    if case == "duplicate id":
        write_tokens(src / "a.parquet", [1, 2, 3], ids=[5, 6, 7])
        write_tokens(src / "b.parquet", [1, 2], ids=[8, 6])
        return ["--id-column", "doc_id"]
    if case == "corrupt file":
        write_tokens(src / "a.parquet", [1, 2])
        _mk(src / "x.parquet").write_bytes(np.random.default_rng(1).bytes(2000))
        return []
    if case == "empty directory":
        src.mkdir()
        return []
    if case == "no rows":
        write_tokens(src / "a.parquet", [])
        return []
    raise AssertionError(case)


def _mk(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


BAD = {
    "missing column": r"a\.parquet: no column 'tokens' \(columns: text_len, input_ids\); choose the token column with --column",
    "not a list": r"a\.parquet: column 'text_len' has type int64, expected a list of token ids",
    "empty list": r"b\.parquet: row 3: empty token list \(length 0\)",
    "null list": r"a\.parquet: row 1: null token list",
    "id column missing": r"a\.parquet: no id column 'doc_id'",
    "id column not integer": r"a\.parquet: id column 'doc_id' has type string, expected an integer",
    "null id": r"a\.parquet: row 1: null in id column 'doc_id'",
    "negative id": r"a\.parquet: row 1 \(sample_id -2\): negative sample_id",
    "duplicate id": r"duplicate sample_id 6 in \S*a\.parquet row 1 and \S*b\.parquet row 1",
    "corrupt file": r"x\.parquet: cannot read as Parquet",
    "empty directory": r"in: directory holds no \*\.parquet files",
    "no rows": r"in: the dataset holds no rows",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_nothing_written(tmp_path: Path, case: str) -> None:
    options = _bad(tmp_path, case)
    result = cli("lengths", tmp_path / "in", tmp_path / "out", *options, expect=2)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("varpack: error: ")
    assert re.search(BAD[case], lines[0]), lines[0]
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no output, no temporary


def test_ids_from_an_id_column_by_default(tmp_path: Path) -> None:
    """Hugging Face-style data with an integer ``id``: the ids are taken from it, as the reader
    does; ``--number-rows`` numbers the rows; a string ``id`` is not an id column."""
    ids = np.array([70, 12, 905, 3], dtype=np.int64)
    src = write_tokens(tmp_path / "hf.parquet", [5, 2, 9, 4], id=pa.array(ids))
    result = cli("lengths", src, tmp_path / "auto")
    assert "ids from column 'id'" in result.stderr
    assert read_metadata(tmp_path / "auto").column("sample_id").to_pylist() == ids.tolist()
    result = cli("lengths", src, tmp_path / "rows", "--number-rows")
    assert "ids from row positions" in result.stderr
    assert read_metadata(tmp_path / "rows").column("sample_id").to_pylist() == [0, 1, 2, 3]
    both = cli("lengths", src, tmp_path / "x", "--number-rows", "--id-column", "id", expect=2)
    assert "choose one" in both.stderr and not (tmp_path / "x").exists()
    named = write_tokens(tmp_path / "s.parquet", [5, 2], id=pa.array(["a", "b"]))
    result = cli("lengths", named, tmp_path / "str")
    assert "ids from row positions" in result.stderr
    assert read_metadata(tmp_path / "str").column("sample_id").to_pylist() == [0, 1]
    # sample_id wins over id, as in the reader
    both_ids = write_tokens(
        tmp_path / "b.parquet", [3, 3], id=pa.array([1, 2]), sample_id=pa.array([40, 50])
    )
    cli("lengths", both_ids, tmp_path / "b", "-q")
    assert read_metadata(tmp_path / "b").column("sample_id").to_pylist() == [40, 50]
