"""Pure parts of the sort: key encoding, splitters, routing, single-process sort, output reader."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from varpack.errors import ConfigError, InputError
from varpack.sort import read_single_file, read_sorted, sort_table
from varpack.sort.bucket import shift_counts, split_counts
from varpack.sort.keys import KeySpec, decode, encode, local_stats, make_layout, merge_stats
from varpack.sort.output import HEADER_BYTES, bin_header, make_index, record_dtype, write_part
from varpack.sort.splitters import choose_splitters, draw_sample


def _reference(table: pa.Table, keys: list[str], descending: list[str]) -> list[int]:
    order = [*keys, "sample_id"] if "sample_id" not in keys else keys
    df = pl.from_arrow(table).sort(order, descending=[k in descending for k in order])
    return df["sample_id"].to_list()


ints = hnp.arrays(np.int64, st.integers(1, 60), elements=st.integers(-(2**40), 2**40))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    desc=st.sampled_from([(), ("a",), ("b",), ("a", "b")]),
    float_b=st.booleans(),
)
def test_encoding_orders_like_polars_and_round_trips(data, desc, float_b):
    n = data.draw(st.integers(1, 60))
    ids = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, 2**62), unique=True))
    a = data.draw(hnp.arrays(np.int64, n, elements=st.integers(-5, 5)))
    if float_b:
        b = data.draw(hnp.arrays(np.float64, n, elements=st.floats(-1e300, 1e300, allow_nan=False)))
        b[b == 0] = 0.0  # -0.0 is written as 0.0 (documented)
    else:
        b = data.draw(hnp.arrays(np.int64, n, elements=st.integers(-(2**62), 2**62)))
    table = pa.table({"sample_id": ids, "seq_len": np.abs(a) + 1, "a": a, "b": b})
    spec = KeySpec(("a", "b"), desc)
    cols = {c: table.column(c).to_numpy() for c in spec.fields}
    floats = ("b",) if float_b else ()
    layout = make_layout(spec, local_stats(cols, spec, floats), floats)
    keys = encode(cols, layout)
    got = ids[np.argsort(keys, kind="stable")].tolist()
    assert got == _reference(table, ["a", "b"], list(desc))
    assert len(np.unique(keys)) == n  # the id makes the key unique
    back = decode(keys, layout)
    for c in spec.fields:
        np.testing.assert_array_equal(back[c], cols[c])


def test_wide_keys_use_byte_strings_and_one_word_when_they_fit():
    cols = {"sample_id": np.array([2**62, 0, 7]), "x": np.array([1.5, -2.0, 1.5])}
    spec = KeySpec(("x",))
    lay = make_layout(spec, local_stats(cols, spec, ("x",)), ("x",))
    assert lay.words == 2 and lay.dtype == np.dtype("S16")
    assert np.argsort(encode(cols, lay)).tolist() == [1, 2, 0]
    narrow = {"sample_id": np.array([5, 3]), "seq_len": np.array([7, 7])}
    lay1 = make_layout(KeySpec(), local_stats(narrow, KeySpec(), ()), ())
    assert lay1.words == 1 and lay1.fields[0].width == 0  # a constant length costs no bits


def test_nan_sorts_last_and_stats_merge():
    cols = {"sample_id": np.arange(4), "x": np.array([np.nan, 1.0, -np.inf, -np.nan])}
    spec = KeySpec(("x",))
    stats = local_stats(cols, spec, ("x",))
    half = merge_stats(
        local_stats({k: v[:2] for k, v in cols.items()}, spec, ("x",)),
        local_stats({k: v[2:] for k, v in cols.items()}, spec, ("x",)),
    )
    np.testing.assert_array_equal(stats, half)
    lay = make_layout(spec, stats, ("x",))
    assert np.argsort(encode(cols, lay), kind="stable").tolist() == [2, 1, 0, 3]


def test_keyspec_rejects_bad_options():
    with pytest.raises(ConfigError, match="--descending"):
        KeySpec(("seq_len",), ("score",))
    with pytest.raises(ConfigError, match="twice"):
        KeySpec(("seq_len", "seq_len"))
    assert KeySpec(("sample_id",)).fields == ("sample_id",)
    assert KeySpec(("score",)).payload == ("seq_len",)


def test_sort_table_matches_polars(rng):
    n = 5000
    t = pa.table(
        {
            "sample_id": rng.permutation(10 * n)[:n],
            "seq_len": rng.integers(1, 8, n),
            "score": rng.normal(size=n).round(1),
            "extra": np.arange(n),
        }
    )
    for keys, desc in [
        (["seq_len"], []),
        (["seq_len", "score"], ["score"]),
        (["score"], ["score"]),
    ]:
        out = sort_table(t, keys, desc)
        assert out.column("sample_id").to_pylist() == _reference(t, keys, desc)
        assert out.column_names == t.column_names


@settings(max_examples=40, deadline=None)
@given(
    keys=hnp.arrays(
        np.uint64, st.integers(1, 400), elements=st.integers(0, 2**64 - 1), unique=True
    ),
    parts=st.integers(1, 6),
)
def test_splitters_and_routing_cover_all_keys(keys, parts):
    sample, w = draw_sample(keys, 10_000, seed=1)
    split = choose_splitters(sample, np.full(len(sample), w), parts)
    assert len(split) == (parts - 1 if parts > 1 else 0)
    ordered = np.sort(keys)
    counts = split_counts(ordered, split)
    assert len(counts) == parts and counts.sum() == len(keys) and counts.min() >= 0
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for r in range(parts):  # part r holds exactly the keys in [split[r-1], split[r])
        got = ordered[bounds[r] : bounds[r + 1]]
        if r > 0:
            assert (got >= split[r - 1]).all()
        if r < parts - 1:
            assert (got < split[r]).all()
    if parts > 1:  # the exact sample: parts are equal up to rounding
        assert counts.max() - counts.min() <= 1 + len(keys) // 100


def test_splitters_split_a_duplicate_heavy_length_evenly(rng):
    n = 200_000
    lens = np.where(rng.random(n) < 0.9, rng.choice([64, 128, 512], n), rng.integers(1, 4096, n))
    keys = (lens.astype(np.uint64) << np.uint64(32)) | rng.permutation(n).astype(np.uint64)
    samples, weights = [], []
    for r, chunk in enumerate(np.array_split(keys, 4)):
        s, w = draw_sample(chunk, 1024, seed=r)
        samples.append(s)
        weights.append(np.full(len(s), w))
    split = choose_splitters(np.concatenate(samples), np.concatenate(weights), 8)
    counts = split_counts(np.sort(keys), split)
    assert counts.max() / counts.mean() <= 1.10


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_shift_counts_reach_exact_shares(sizes):
    parts, total = len(sizes), sum(sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    sends = np.array(
        [shift_counts(c, int(o), total, parts) for c, o in zip(sizes, offsets, strict=False)]
    )
    assert sends.sum(axis=1).tolist() == sizes
    received = sends.sum(axis=0)
    assert received.tolist() == np.diff(np.arange(parts + 1) * total // parts).tolist()


def _write_sorted_dir(root: Path, n: int = 10) -> Path:
    root.mkdir()
    t = pa.table({"sample_id": np.arange(n, dtype=np.int64), "seq_len": np.ones(n, dtype=np.int64)})
    sha = [
        write_part(t.slice(0, 4), root / "part-00000.parquet"),
        write_part(t.slice(4), root / "part-00001.parquet"),
    ]
    meta = {
        "keys": ["seq_len"],
        "descending": [],
        "order": ["seq_len", "sample_id"],
        "columns": {"sample_id": "int64", "seq_len": "int64"},
        "total_tokens": n,
        "fingerprint": "x",
    }
    index = make_index(meta, ["part-00000.parquet", "part-00001.parquet"], [4, n - 4], sha)
    (root / "_index.json").write_text(json.dumps(index))
    return root


def test_read_sorted_checks_index_and_checksums(tmp_path):
    root = _write_sorted_dir(tmp_path / "s")
    table, index = read_sorted(root)
    assert table.column("sample_id").to_pylist() == list(range(10))
    assert [p["offset"] for p in index["parts"]] == [0, 4]
    pq.write_table(pa.table({"sample_id": [0], "seq_len": [1]}), root / "part-00001.parquet")
    with pytest.raises(InputError, match="sha256"):
        read_sorted(root)
    with pytest.raises(InputError, match="not a varpack sort output"):
        read_sorted(tmp_path)
    (root / "_index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="unsupported format"):
        read_sorted(root)


def test_single_file_header_and_reader(tmp_path):
    meta = {
        "keys": ["seq_len", "s"],
        "descending": ["s"],
        "order": ["seq_len", "s", "sample_id"],
        "columns": {"sample_id": "int64", "seq_len": "int64", "s": "float64"},
        "total_tokens": 9,
        "fingerprint": "f",
    }
    dtype = record_dtype(meta["columns"])
    rec = np.zeros(3, dtype=dtype)
    rec["sample_id"], rec["seq_len"], rec["s"] = [3, 1, 2], [2, 3, 4], [0.5, 0.25, -1.0]
    path = tmp_path / "x.bin"
    header = bin_header(meta, 3, hashlib.sha256(rec.tobytes()).hexdigest())
    assert len(header) == HEADER_BYTES and header.startswith(b"VPSORTED")
    path.write_bytes(header + rec.tobytes())
    got = read_single_file(path)
    np.testing.assert_array_equal(got, rec)
    mm = np.memmap(path, dtype=dtype, offset=HEADER_BYTES, mode="r")  # the documented recipe
    assert mm["sample_id"].tolist() == [3, 1, 2]
    table, doc = read_sorted(path)
    assert table.column("s").to_pylist() == [0.5, 0.25, -1.0] and doc["num_rows"] == 3
    path.write_bytes(header + rec.tobytes()[:-8])
    with pytest.raises(InputError, match="truncated"):
        read_single_file(path)
