"""Inputs are checked the same way by every reader: a corrupt footer, a key that cannot be kept,
a token column that is not token ids, or token data that is not what the plan says is refused in
one line, and nothing is written; nothing is believed that was not read."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from testkit import cli, mpiexec, write_metadata

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


def patch_row_count(path: Path, old: int, new: int, which: slice | list[int] = slice(None)) -> None:
    """Rewrite the i64 fields holding ``old`` in a Parquet footer (the file's row count, the
    column chunks' value counts, then the row group's row count, in footer order; ``which``
    picks among them) to ``new``."""
    data = path.read_bytes()
    size = struct.unpack("<I", data[-8:-4])[0]
    body, footer = data[: -8 - size], data[-8 - size : -8]
    pat = b"\x16" + _varint(old)  # field delta 1, type i64
    found = [i for i in range(len(footer)) if footer.startswith(pat, i)]
    at = found[which] if isinstance(which, slice) else [found[k] for k in which]
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
    """A good shard of 1,023 rows beside one of 77 rows (patched by the tests), with a float
    ``score`` column to carry."""
    root = tmp_path / "meta"
    rng = np.random.default_rng(0)
    write_metadata(
        root / "a.parquet", np.arange(1023), rng.integers(1, 500, 1023), score=rng.random(1023)
    )
    write_metadata(
        root / "b.parquet", np.arange(1023, 1100), rng.integers(1, 500, 77), score=rng.random(77)
    )
    return root


FOOTERS: dict[str, tuple[int, slice | list[int]]] = {
    "row group negative": (-5, slice(-1, None)),
    "file total negative": (-5, slice(0, 1)),
    "every count negative": (-5, slice(None)),
    "row group larger": (78, slice(-1, None)),
    "file total larger": (1_000, slice(0, 1)),
    "row group smaller": (70, slice(-1, None)),
    "2^40 rows declared": (2**40, slice(None)),
    # consistent footers that are not what the pages hold: found by reading the page headers
    "file and row group smaller, agreeing": (50, [0, -1]),
    "every count smaller": (50, slice(None)),
    "zero rows declared over data": (0, slice(None)),
    "every count larger": (100, slice(None)),
    "column chunks' counts only": (70, [1, 2]),
}


@pytest.mark.parametrize("case", FOOTERS)
@pytest.mark.parametrize("command", ["sort", "check", "plan", "validate", "carry"])
def test_a_corrupt_footer_is_refused_by_every_reader(
    shards: Path, tmp_path: Path, case: str, command: str
) -> None:
    new, which = FOOTERS[case]
    out, before = tmp_path / "out", ["meta"]
    if command in ("validate", "carry"):  # a plan of the good shards, then the shard goes bad
        cli("plan", shards, tmp_path / "p", "--max-tokens", 4096, "-q")
        before = ["meta", "p"]
    patch_row_count(shards / "b.parquet", 77, new, which)
    every: dict[str, list[object]] = {
        "sort": [shards, out],
        "check": [shards],
        "plan": [shards, out, "--max-tokens", 4096],
        "validate": [tmp_path / "p", "--metadata", shards],
        "carry": [shards / "a.parquet", out, "--max-tokens", 4096, "--carry", "score"],
    }
    args = every[command]
    if command == "carry":
        command, args = "plan", [*args, "--carry-from", shards]
    line = _one_line(cli(command, *args, expect=2).stderr)
    assert "b.parquet" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before


def test_what_was_read_is_what_counts(shards: Path) -> None:
    patch_row_count(shards / "b.parquet", 77, 2**40)
    with pytest.raises(InputError, match=r"b\.parquet: .*rows declared .*more than this machine"):
        read_metadata(shards)
    assert read_metadata(shards / "a.parquet").num_rows == 1023  # the good shard alone reads


def test_a_declared_size_is_checked_against_the_pages_before_reading(shards: Path) -> None:
    """A footer agreeing with itself on 2^24 rows (loadable, so the memory bound passes) is
    refused from its page headers, before any row is allocated or decoded."""
    patch_row_count(shards / "b.parquet", 77, 2**24)
    with pytest.raises(
        InputError, match=r"pages of column 'sample_id' hold 77 values but the foot"
    ):
        read_metadata(shards)


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


def _keyed(root: Path, name: str, first_id: int, typ: pa.DataType, values: list) -> None:
    ids = np.arange(first_id, first_id + len(values), dtype=np.int64)
    table = {"sample_id": pa.array(ids), "seq_len": pa.array(np.full(len(values), 10))}
    root.mkdir(exist_ok=True)
    pq.write_table(pa.table({**table, "k": pa.array(values, typ)}), root / name)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((pa.int8(), [-128, 127, 3]), (pa.int64(), [-(2**40), 2**40, 3])),
        ((pa.uint32(), [2**32 - 1, 0]), (pa.int16(), [-7, 300])),
        ((pa.int64(), [2**53, -(2**53), 5]), (pa.float32(), [1.5, -0.5])),
        ((pa.uint64(), [2**53, 1]), (pa.float64(), [2.0**60, -1e300])),
    ],
)
def test_a_key_stored_as_other_types_in_other_shards(tmp_path: Path, a: tuple, b: tuple) -> None:
    """Each shard may store a key as another numeric type: check reads them, sort orders them
    as the numbers they are (floats where any shard holds floats, every integer exact)."""
    root = tmp_path / "m"
    _keyed(root, "a.parquet", 0, *a)
    _keyed(root, "b.parquet", 100, *b)
    values = [*a[1], *b[1]]
    ids = [*range(len(a[1])), *range(100, 100 + len(b[1]))]
    cli("check", root, "--key", "k")
    cli("sort", root, tmp_path / "s", "--key", "k", "-q")
    got = ds.dataset(tmp_path / "s", format="parquet").to_table()
    want = sorted(range(len(values)), key=lambda i: (values[i], ids[i]))
    assert got.column("sample_id").to_pylist() == [ids[i] for i in want]
    assert got.column("k").to_pylist() == [values[i] for i in want]


def test_an_integer_key_a_float_cannot_hold_is_refused(tmp_path: Path) -> None:
    """Where a key is float in one shard, an integer of another beyond 2^53 would be rounded
    (sorted and written as another number): refused, naming its file and row, in one process
    and when the two shards lie on different MPI ranks."""
    root = tmp_path / "m"
    _keyed(root, "a.parquet", 0, pa.int64(), [5, 2**53 + 1])
    _keyed(root, "b.parquet", 100, pa.float64(), [0.5, 1.5])
    says = "a.parquet: row 1.*9,007,199,254,740,993 is an integer that a float cannot hold"
    for command, args in (("check", ["--key", "k"]), ("sort", [tmp_path / "s", "--key", "k"])):
        line = _one_line(cli(command, root, *args, expect=2).stderr)
        assert re.search(says, line), line
    proc = mpiexec(2, "sort", root, tmp_path / "s", "--key", "k", check=False)
    assert proc.returncode == 2 and re.search(says, proc.stderr), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


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
    "beyond int64": (pa.array([[1], [2**64 - 1]], pa.list_(pa.uint64())), "row 1: a token id over"),
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


#: a token file of 77 rows of 2 tokens: footer fields holding 77 (the file's and the row group's
#: rows, the id chunk's values) or 154 (the token chunk's values), patched to agree on a lie
TOKEN_FOOTERS: dict[str, tuple[int, int, slice]] = {
    "fewer rows, agreeing": (77, 50, slice(None)),
    "no rows over data": (77, 0, slice(None)),
    "more rows, agreeing": (77, 90, slice(None)),
    "fewer token values": (154, 100, slice(None)),
}


@pytest.mark.parametrize("ids", ["sample_id", "numbered rows"])
@pytest.mark.parametrize("case", TOKEN_FOOTERS)
def test_lengths_reads_what_the_pages_hold(tmp_path: Path, case: str, ids: str) -> None:
    old, new, which = TOKEN_FOOTERS[case]
    src = _tokens(tmp_path / "tok.parquet", pa.array([[1, 2]] * 77))
    patch_row_count(src, old, new, which)
    more = ["--number-rows"] if ids == "numbered rows" else []
    line = _one_line(cli("lengths", src, tmp_path / "meta", *more, expect=2).stderr)
    assert "tok.parquet" in line and "corrupt" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok.parquet"]


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


@pytest.mark.parametrize("case", TOKEN_FOOTERS)
def test_the_reader_reads_what_the_pages_hold(tmp_path: Path, case: str) -> None:
    """A token file whose footer lies is refused when opened (ids read at open) or when its row
    group is read (numbered rows), never read short."""
    from varpack.torch import ParquetTokenDataset

    old, new, which = TOKEN_FOOTERS[case]
    src = _tokens(tmp_path / "tok.parquet", pa.array([[1, 2]] * 77))
    patch_row_count(src, old, new, which)
    for id_column in ("sample_id", None):
        with pytest.raises(InputError, match=r"tok\.parquet: .*corrupt"):
            ParquetTokenDataset(src, id_column=id_column).get_flat(np.array([0]))


@pytest.mark.parametrize(
    ("tokens", "says"),
    [
        (pa.array([[1, 2], [3, -4]]), "sample id 1: token id -4 in the dataset"),
        (
            pa.array([[1], [2**63]], pa.list_(pa.uint64())),
            "sample id 1: token id 9223372036854775808",
        ),
    ],
)
def test_the_reader_refuses_token_ids_an_embedding_cannot_take(
    tmp_path: Path, tokens: pa.Array, says: str
) -> None:
    """Token ids below 0 or beyond int64 (data that did not come through ``varpack lengths``)
    are refused by the reader in one line, from Parquet, an Arrow copy or any dataset keyed by id."""
    from varpack.metadata.tokens import TokenCopyWriter
    from varpack.torch import ParquetTokenDataset
    from varpack.torch.dataset import fetch_flat

    src = _tokens(tmp_path / "tok.parquet", tokens)
    with TokenCopyWriter(tmp_path / "tok.arrow", tokens.type.value_type) as copy:
        copy.write(pa.array([0, 1]), tokens)  # as if written by something else than lengths
    dtype = tokens.type.value_type.to_pandas_dtype()
    as_dict = {i: np.asarray(t, dtype=dtype) for i, t in enumerate(tokens.to_pylist())}
    for dataset in (ParquetTokenDataset(src), ParquetTokenDataset(tmp_path / "tok.arrow"), as_dict):
        with pytest.raises(InputError, match=says):
            fetch_flat(dataset, np.array([0, 1]))
    with pytest.raises(InputError, match="float64 tokens, expected integer token ids"):
        fetch_flat({0: np.array([1.5, 2.0])}, np.array([0]))
