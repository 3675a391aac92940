"""Inputs are checked the same way by every reader: a corrupt footer, a key that cannot be kept,
a token column that is not token ids, or token data that is not what the plan says is refused in
one line, and nothing is written; nothing is believed that was not read."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from testkit import cli, write_metadata

from varpack.errors import InputError
from varpack.metadata.contract import read_metadata


def _varint(n: int) -> bytes:
    """Thrift compact protocol: a zigzag varint."""
    z = ((n << 1) ^ (n >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while True:
        b, z = z & 0x7F, z >> 7
        out.append(b | 0x80 if z else b)
        if not z:
            return bytes(out)


def patch_row_count(path: Path, old: int, new: int, which: slice = slice(None)) -> None:
    """Rewrite the i64 fields holding ``old`` in a Parquet footer (the file's row count, its row
    group's and the column chunks' value counts, in footer order) to ``new``."""
    data = path.read_bytes()
    size = struct.unpack("<I", data[-8:-4])[0]
    body, footer = data[: -8 - size], data[-8 - size : -8]
    pat = b"\x16" + _varint(old)  # field delta 1, type i64
    at = [i for i in range(len(footer)) if footer.startswith(pat, i)][which]
    assert at, "no such field"
    for i in reversed(at):
        footer = footer[:i] + b"\x16" + _varint(new) + footer[i + len(pat) :]
    path.write_bytes(body + footer + struct.pack("<I", len(footer)) + b"PAR1")


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("varpack: error: "), stderr
    return lines[0]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """A good shard of 1,023 rows beside one of 77 rows (patched by the tests)."""
    root = tmp_path / "meta"
    rng = np.random.default_rng(0)
    write_metadata(root / "a.parquet", np.arange(1023), rng.integers(1, 500, 1023))
    write_metadata(root / "b.parquet", np.arange(1023, 1100), rng.integers(1, 500, 77))
    return root


FOOTERS = {
    "row group negative": (-5, slice(-1, None)),
    "file total negative": (-5, slice(0, 1)),
    "every count negative": (-5, slice(None)),
    "row group larger": (78, slice(-1, None)),
    "file total larger": (1_000, slice(0, 1)),
    "row group smaller": (70, slice(-1, None)),
    "2^40 rows declared": (2**40, slice(None)),
}


@pytest.mark.parametrize("case", FOOTERS)
@pytest.mark.parametrize("command", ["sort", "check", "plan"])
def test_a_corrupt_footer_is_refused_by_every_reader(
    shards: Path, tmp_path: Path, case: str, command: str
) -> None:
    new, which = FOOTERS[case]
    patch_row_count(shards / "b.parquet", 77, new, which)
    out = tmp_path / "out"
    args = {"sort": [out], "check": [], "plan": [out, "--max-tokens", 4096]}[command]
    line = _one_line(cli(command, shards, *args, expect=2).stderr)
    assert "b.parquet" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["meta"]


def test_what_was_read_is_what_counts(shards: Path) -> None:
    patch_row_count(shards / "b.parquet", 77, 2**40)
    with pytest.raises(InputError, match=r"b\.parquet: .*rows declared .*more than this machine"):
        read_metadata(shards)
    assert read_metadata(shards / "a.parquet").num_rows == 1023  # the good shard alone reads


@pytest.mark.parametrize(
    ("typ", "values"),
    [
        (pa.int8(), [-128, 127, 0, -1, 5, 5]),
        (pa.uint32(), [2**32 - 1, 0, 7, 2**31, 7, 1]),
        (pa.uint64(), [2**63 - 1, 0, 3, 2**62, 9, 9]),
        (pa.int64(), [-(2**63), 2**63 - 1, 0, -1, 1, 1]),
    ],
)
def test_integer_keys_sort_in_their_own_order(tmp_path: Path, typ: pa.DataType, values) -> None:
    n = len(values)
    path = tmp_path / "m.parquet"
    table = pa.table(
        {
            "sample_id": pa.array(np.arange(n, dtype=np.int64)),
            "seq_len": pa.array(np.full(n, 10, dtype=np.int64)),
            "score": pa.array(values, typ),
        }
    )
    pq.write_table(table, path)
    cli("sort", path, tmp_path / "s", "--key", "score", "-q")
    got = ds.dataset(tmp_path / "s", format="parquet").to_table()
    want = sorted(range(n), key=lambda i: (values[i], i))
    assert got.column("sample_id").to_pylist() == want
    assert got.column("score").to_pylist() == [values[i] for i in want]


def test_a_key_beyond_int64_is_refused_not_wrapped(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    big = pa.array([3, 2**64 - 1, 2**63], pa.uint64())
    pq.write_table(
        pa.table({"sample_id": pa.array([0, 1, 2]), "seq_len": pa.array([5, 5, 5]), "k": big}),
        path,
    )
    for command, args in (("sort", [tmp_path / "s", "--key", "k"]), ("check", ["--key", "k"])):
        line = _one_line(cli(command, path, *args, expect=2).stderr)
        assert "row 1: k value 18,446,744,073,709,551,615 does not fit int64" in line
    assert not (tmp_path / "s").exists()


# --- token columns ----------------------------------------------------------------------------


def _tokens(path: Path, column: pa.Array) -> Path:
    n = len(column)
    pq.write_table(pa.table({"sample_id": pa.array(np.arange(n)), "input_ids": column}), path)
    return path


BAD_TOKENS = {
    "floats": (pa.array([[1.5, 2.0], [3.0]]), "holds double values"),
    "strings": (pa.array([["a", "b"], ["c"]]), "holds string values"),
    "nested lists": (pa.array([[[1, 2]], [[3]]]), "holds list<"),
    "null token": (pa.array([[1, 2], [3, None, 4]]), "row 1: a null token id"),
    "negative token": (pa.array([[1, 2], [3], [4, -7]]), "row 2: a negative token id"),
    "not a list": (pa.array([1, 2]), "expected a list of token ids"),
}


@pytest.mark.parametrize("case", BAD_TOKENS)
def test_lengths_refuses_what_is_not_token_ids(tmp_path: Path, case: str) -> None:
    column, says = BAD_TOKENS[case]
    src = _tokens(tmp_path / "tok.parquet", column)
    out = tmp_path / "meta"
    line = _one_line(
        cli("lengths", src, out, "--arrow-copy", tmp_path / "c.arrow", expect=2).stderr
    )
    assert "tok.parquet" in line and says in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok.parquet"]


def test_lengths_refuses_a_token_file_whose_footer_lies(tmp_path: Path) -> None:
    src = _tokens(tmp_path / "tok.parquet", pa.array([[1, 2]] * 77))
    patch_row_count(src, 77, -3, slice(0, 1))
    line = _one_line(cli("lengths", src, tmp_path / "meta", expect=2).stderr)
    assert "the footer declares -3 rows" in line


# --- the reader ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _token_data(path: Path, lens: np.ndarray, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = pa.array(rng.integers(1, 1000, int(lens.sum())).astype(np.int32))
    return _tokens(path, pa.ListArray.from_arrays(pa.array(offsets), values))


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("change", [+1, -1, +40])
def test_the_reader_checks_every_sample_against_the_plan(
    tmp_path: Path, split: bool, change: int
) -> None:
    from varpack.torch import ParquetTokenDataset, PlanLoader

    rng = np.random.default_rng(1)
    lens = rng.integers(1, 300, 60)
    lens[:5] = [700, 333, 256, 512, 128]  # split into pieces of 128 (and exact multiples)
    _token_data(tmp_path / "tok.parquet", lens)
    cli("lengths", tmp_path / "tok.parquet", tmp_path / "meta", "-q")
    opts = ["--max-tokens", 256, "--oversize", "split", "--split-len", 128] if split else []
    cli("plan", tmp_path / "meta", tmp_path / "plan", "--max-tokens", 1024, *opts, "-q")
    loader = PlanLoader(tmp_path / "plan", ParquetTokenDataset(tmp_path / "tok.parquet"))
    assert sum(int(b.seq_lens.sum()) for b in loader) == int(lens.sum())  # the data it was made of
    for doc in (0, 7):  # a split document and a short one, each changed alone
        other = lens.copy()
        other[doc] += change
        _token_data(tmp_path / "other.parquet", other)
        loader = PlanLoader(tmp_path / "plan", ParquetTokenDataset(tmp_path / "other.parquet"))
        with pytest.raises(InputError, match=rf"sample id {doc} has {other[doc]} tokens"):
            for _ in loader:
                pass


@pytest.mark.parametrize("case", ["floats", "null token"])
def test_the_reader_refuses_what_is_not_token_ids(tmp_path: Path, case: str) -> None:
    from varpack.torch import ParquetTokenDataset

    src = _tokens(tmp_path / "tok.parquet", BAD_TOKENS[case][0])
    with pytest.raises(InputError, match="tok.parquet: column 'input_ids'"):
        ParquetTokenDataset(src).get_flat(np.array([0, 1]))
