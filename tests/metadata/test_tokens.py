"""The memory-mappable token copy: ``varpack lengths --arrow-copy`` and ``write_arrow_tokens``."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lengths import write_tokens
from testkit import cli

import varpack.atomic
from varpack.errors import ConfigError, InputError, OutputExistsError, WriteError
from varpack.metadata.contract import read_metadata, resolve_files
from varpack.metadata.lengths import derive_lengths, write_arrow_tokens
from varpack.metadata.tokens import FORMAT, copy_schema


def make_dataset(root: Path, seed: int = 5) -> tuple[np.ndarray, list[list[int]]]:
    """Three shards (one empty) of 3-5 rows per row group; returns ids and tokens in file order."""
    rng = np.random.default_rng(seed)
    sizes = {"a.parquet": 19, "b.parquet": 0, "c/d.parquet": 26}
    total = sum(sizes.values())
    lens = rng.integers(1, 60, total)
    ids = rng.choice(10**8, size=total, replace=False)
    start = 0
    for k, (name, n) in enumerate(sizes.items()):
        write_tokens(root / name, lens[start : start + n], ids[start : start + n], 3 + k)
        start += n
    tokens = [
        row
        for f in resolve_files(root)
        for row in pq.read_table(f, columns=["input_ids"]).column(0).to_pylist()
    ]
    return ids, tokens


def read_copy(path: Path) -> tuple[pa.Schema, int, dict[int, list[int]], list[int]]:
    """(schema, record batches, tokens by id, ids in row order) of a copy."""
    reader = pa.ipc.open_file(path)
    table = reader.read_all()
    ids = table.column("sample_id").to_pylist()
    by_id = dict(zip(ids, table.column("input_ids").to_pylist(), strict=True))
    return reader.schema, reader.num_record_batches, by_id, ids


def source_row_groups(root: Path) -> int:
    return sum(pq.read_metadata(f).num_row_groups for f in resolve_files(root))


@pytest.mark.parametrize("id_column", ["doc_id", None])
def test_copy_is_keyed_like_the_metadata(tmp_path: Path, id_column: str | None) -> None:
    ids, tokens = make_dataset(tmp_path / "tok")
    options = ["--id-column", id_column] if id_column else []
    copy = tmp_path / "tok.arrow"
    cli("lengths", tmp_path / "tok", tmp_path / "meta", *options, "--arrow-copy", copy, "-q")
    meta = read_metadata(tmp_path / "meta")
    schema, batches, by_id, copy_ids = read_copy(copy)
    assert copy_ids == meta.column("sample_id").to_pylist()  # same ids, same order
    assert copy_ids == (ids.tolist() if id_column else list(range(len(tokens))))
    assert [by_id[i] for i in copy_ids] == tokens  # every sample's tokens, by id
    assert [len(by_id[i]) for i in copy_ids] == meta.column("seq_len").to_pylist()
    assert schema.equals(copy_schema(pa.int32()), check_metadata=True)
    assert schema.metadata == FORMAT
    assert batches == source_row_groups(tmp_path / "tok")  # one batch per row group: bounded
    names = ["meta", "tok", "tok.arrow", "tok.arrow.idx"]  # the copy and its location index
    assert sorted(p.name for p in tmp_path.iterdir()) == names


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=10), min_size=1, max_size=3),
    st.integers(1, 4),
)
def test_any_layout_copy_round_trips(shards: list[list[int]], rg: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for k, lens in enumerate(shards):
            write_tokens(root / "in" / f"s{k}.parquet", lens, row_group_size=rg)
        truth = pq.read_table(root / "in").column("input_ids").to_pylist()
        result = derive_lengths(root / "in", root / "meta", arrow_copy=root / "t.arrow")
        _, batches, by_id, ids = read_copy(root / "t.arrow")
        assert ids == list(range(result.num_samples))
        assert [by_id[i] for i in ids] == truth
        assert batches == source_row_groups(root / "in")


def test_write_arrow_tokens_alone(tmp_path: Path) -> None:
    ids, tokens = make_dataset(tmp_path / "tok")
    out = write_arrow_tokens(tmp_path / "tok", tmp_path / "a.arrow", id_column="doc_id")
    _, _, by_id, copy_ids = read_copy(out)
    assert copy_ids == ids.tolist() and [by_id[i] for i in copy_ids] == tokens
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        write_arrow_tokens(tmp_path / "tok", out, id_column=None)
    write_arrow_tokens(tmp_path / "tok", out, id_column=None, overwrite=True)
    assert read_copy(out)[3] == list(range(len(tokens)))
    write_tokens(tmp_path / "dup" / "a.parquet", [1, 2], [4, 4])
    with pytest.raises(InputError, match="duplicate sample_id 4"):
        write_arrow_tokens(tmp_path / "dup", tmp_path / "dup.arrow", id_column="doc_id")
    assert not (tmp_path / "dup.arrow").exists()


def test_token_types_follow_the_first_file(tmp_path: Path) -> None:
    write_tokens(tmp_path / "ok" / "a.parquet", [2, 1])
    big = pa.array([[1, 2], [3]], pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": big}), tmp_path / "ok" / "b.parquet")
    write_arrow_tokens(tmp_path / "ok", tmp_path / "ok.arrow", id_column=None)
    schema, _, by_id, _ = read_copy(tmp_path / "ok.arrow")
    assert schema.field("input_ids").type == pa.large_list(pa.int32())
    assert by_id[2] == [1, 2] and by_id[3] == [3]
    write_tokens(tmp_path / "bad" / "a.parquet", [2, 1])
    huge = pa.array([[1, 2**40]], pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": huge}), tmp_path / "bad" / "b.parquet")
    copy = tmp_path / "x.arrow"
    result = cli("lengths", tmp_path / "bad", tmp_path / "m", "--arrow-copy", copy, expect=2)
    assert "b.parquet: cannot store its tokens as large_list<item: int32>" in result.stderr
    assert not (tmp_path / "m").exists() and not copy.exists()  # refused, nothing written


# --- atomicity -----------------------------------------------------------------------------------


def test_error_in_last_shard_leaves_neither_output(tmp_path: Path) -> None:
    write_tokens(tmp_path / "in" / "a.parquet", [4, 5, 6], row_group_size=2)
    write_tokens(tmp_path / "in" / "b.parquet", [3, 2, 7, 0, 1], row_group_size=2)
    copy = tmp_path / "t.arrow"
    result = cli("lengths", tmp_path / "in", tmp_path / "meta", "--arrow-copy", copy, expect=2)
    assert "b.parquet: row 3: empty token list" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no output, no temporary


def test_failed_overwrite_keeps_the_old_outputs(tmp_path: Path) -> None:
    write_tokens(tmp_path / "good" / "a.parquet", [1, 2, 3])
    meta, copy = tmp_path / "meta", tmp_path / "t.arrow"
    cli("lengths", tmp_path / "good", meta, "--arrow-copy", copy, "-q")
    index = tmp_path / "t.arrow.idx"
    before = copy.read_bytes(), read_metadata(meta), index.read_bytes()
    write_tokens(tmp_path / "bad" / "a.parquet", [1, 0])
    cli("lengths", tmp_path / "bad", meta, "--arrow-copy", copy, "--overwrite", expect=2)
    assert copy.read_bytes() == before[0] and read_metadata(meta).equals(before[1])
    assert index.read_bytes() == before[2]
    names = ["bad", "good", "meta", "t.arrow", "t.arrow.idx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names


def test_existing_copy_needs_overwrite(tmp_path: Path) -> None:
    write_tokens(tmp_path / "t.parquet", [1, 2])
    (tmp_path / "t.arrow").write_bytes(b"old")
    args = (
        "lengths",
        tmp_path / "t.parquet",
        tmp_path / "meta",
        "--arrow-copy",
        tmp_path / "t.arrow",
    )
    result = cli(*args, expect=2)
    assert "t.arrow already exists; pass --overwrite" in result.stderr
    assert not (tmp_path / "meta").exists() and (tmp_path / "t.arrow").read_bytes() == b"old"
    # not a token copy: --overwrite refuses it too
    result = cli(*args, "--overwrite", expect=2)
    assert "not an output varpack wrote" in result.stderr
    assert (tmp_path / "t.arrow").read_bytes() == b"old"
    (tmp_path / "t.arrow").unlink()
    cli(*args, "-q")
    cli(*args, "--overwrite", "-q")
    assert read_copy(tmp_path / "t.arrow")[2] == {0: [0], 1: [1, 2]}


def test_copy_inside_output_is_refused(tmp_path: Path) -> None:
    write_tokens(tmp_path / "t.parquet", [1, 2])
    for copy in (tmp_path / "meta", tmp_path / "meta" / "t.arrow"):
        with pytest.raises(ConfigError, match="must not be OUTPUT or lie inside it"):
            derive_lengths(tmp_path / "t.parquet", tmp_path / "meta", arrow_copy=copy)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def test_failed_copy_publication_takes_the_metadata_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tokens(tmp_path / "t.parquet", [1, 2])
    publish = varpack.atomic.publish

    for last in ("t.arrow.idx", "t.arrow"):  # the index, then the copy, after the metadata

        def fail_for(tmp: Path, path: Path, overwrite: bool, last: str = last) -> None:
            if Path(path).name == last:
                raise OSError(errno.ENOSPC, "No space left on device")
            publish(tmp, path, overwrite)

        monkeypatch.setattr(varpack.atomic, "publish", fail_for)
        with pytest.raises(WriteError, match=f"{last}: No space left on device; the disk is full"):
            derive_lengths(
                tmp_path / "t.parquet", tmp_path / "meta", arrow_copy=tmp_path / "t.arrow"
            )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"], last
