"""``varpack synth``: distribution shapes, ids, shards, determinism, atomic output, tokenized mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli

from varpack.cli.synth import Count
from varpack.errors import ConfigError
from varpack.metadata.contract import read_metadata, resolve_files
from varpack.metadata.synth import (
    DISTS,
    group_cuts,
    lengths_range,
    sample_lengths,
    shard_sizes,
    sparse_ids,
    write_synth,
)

N = 200_000


@pytest.fixture(scope="module")
def drawn() -> dict[str, np.ndarray]:
    return {d: sample_lengths(d, N, np.random.default_rng(7)) for d in DISTS}


def test_long_tail_shape(drawn: dict[str, np.ndarray]) -> None:
    lens = drawn["long-tail"]
    assert lens.dtype == np.int64
    assert np.median(lens) < 1000  # most samples are short
    assert np.percentile(lens, 99) > 10_000  # ... and about 2% are tens of thousands
    assert 0.01 < (lens >= 10_000).mean() < 0.03
    assert (lens >= 50_000).sum() > 0
    assert lens.min() >= 16 and lens.max() <= 131_072
    # the tail is bounded, not clipped: no pile-up at the cap
    assert (lens == 131_072).mean() < 1e-4


def test_bimodal_shape(drawn: dict[str, np.ndarray]) -> None:
    lens = drawn["bimodal"]
    assert 0.35 <= (lens < 8192).mean() <= 0.45
    assert lens.min() >= 64 and lens.max() <= 131_072
    # two modes: both a short and a long bulk, with the long one reaching beyond 64K
    assert np.median(lens[lens < 8192]) < 2048
    assert np.median(lens[lens >= 8192]) > 16_384
    assert (lens > 65_536).mean() > 0.02


def test_video_shape(drawn: dict[str, np.ndarray]) -> None:
    lens = drawn["video"]
    assert lens.min() == 3 and lens.max() == 94  # the full range of Action Genome
    assert 20 <= lens.mean() <= 25
    assert np.median(lens) < lens.mean()  # right-skewed


def test_uniform_shape(drawn: dict[str, np.ndarray]) -> None:
    lens = drawn["uniform"]
    assert lens.min() == 64 and lens.max() == 8192
    assert abs(lens.mean() - (64 + 8192) / 2) < 50
    counts = np.histogram(lens, bins=8, range=(64, 8193))[0]
    assert counts.min() > 0.9 * counts.max()


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(DISTS), st.integers(1, 20_000), st.integers(0, 200_000), st.integers(0, 99))
def test_bounds_overrides_are_respected(dist: str, lo: int, span: int, seed: int) -> None:
    hi = lo + span
    if dist == "bimodal" and not lo < 8192 < hi:
        with pytest.raises(ConfigError, match="bimodal splits at 8192"):
            sample_lengths(dist, 10, np.random.default_rng(seed), lo, hi)
        return
    lens = sample_lengths(dist, 2000, np.random.default_rng(seed), lo, hi)
    assert lens.min() >= lo and lens.max() <= hi


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(min_len=0), "--min-len 0: lengths must be >= 1"),
        (dict(min_len=10, max_len=5), "--max-len 5 is below --min-len 10"),
        (dict(max_len=2**31), "exceeds 2147483647"),
    ],
)
def test_bad_bounds(args: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sample_lengths("uniform", 10, np.random.default_rng(0), **args)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**40))
def test_sparse_ids_unique_nonnegative_sparse(n: int, seed: int) -> None:
    ids = sparse_ids(np.arange(n), n, seed)
    assert ids.dtype == np.int64
    assert len(np.unique(ids)) == n
    assert ids.min() >= 0 and ids.max() < max(256, 8 * n)
    # any slice computes the same ids on its own (streaming)
    cut = n // 3
    assert (sparse_ids(np.arange(cut, n), n, seed) == ids[cut:]).all()


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 40), st.integers(0, 2**31))
def test_shard_sizes(n: int, shards: int, seed: int) -> None:
    sizes = shard_sizes(n, shards, seed)
    assert len(sizes) == shards and sizes.sum() == n
    if n >= shards:
        assert sizes.min() >= 1


def test_lengths_are_independent_of_block_cuts() -> None:
    whole = lengths_range("bimodal", 0, 300_000, seed=4)
    pieces = [
        lengths_range("bimodal", a, b, 4) for a, b in [(0, 1), (1, 65_537), (65_537, 300_000)]
    ]
    assert (np.concatenate(pieces) == whole).all()
    assert not (lengths_range("bimodal", 0, 300_000, seed=5) == whole).all()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=200),
    st.integers(1, 50),
    st.integers(1, 2000),
)
def test_group_cuts_bound_rows_and_tokens(lens: list[int], rows: int, tokens: int) -> None:
    arr = np.array(lens)
    cuts = group_cuts(arr, rows, tokens)
    assert cuts[0] == 0 and cuts[-1] == len(arr) and (np.diff(cuts) > 0).all()
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        assert b - a <= rows
        assert arr[a : b - 1].sum() < tokens or b - a == 1  # over budget only by its last row


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_synth_cli_ids_shards_and_determinism(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    cli("synth", a, "--num-samples", "30K", "--shards", "6", "--seed", "11", "--quiet")
    cli("synth", b, "-n", "30000", "--shards", "6", "--seed", "11", "--quiet")
    cli("synth", c, "-n", "30000", "--shards", "6", "--seed", "12", "--quiet")
    assert _files(a) == _files(b)  # same seed -> byte-identical files
    assert _files(a) != _files(c)
    files = resolve_files(a)
    assert len(files) == 6
    sizes = [pq.read_metadata(f).num_rows for f in files]
    assert sum(sizes) == 30_000 and len(set(sizes)) > 1  # unequal shards
    table = read_metadata(a)  # valid metadata: unique ids, positive lengths
    ids = table.column("sample_id").to_numpy()
    assert not (np.diff(ids) > 0).all()  # shuffled
    assert (np.diff(np.sort(ids)) > 1).any()  # not contiguous
    assert pq.read_schema(files[0]).field("seq_len").type.bit_width == 32


def test_content_does_not_depend_on_shard_count(tmp_path: Path) -> None:
    one = write_synth(tmp_path / "one", "video", 5000, shards=1, seed=3)
    many = write_synth(tmp_path / "many", "video", 5000, shards=9, seed=3)
    assert len(one.files) == 1 and len(many.files) == 9
    t1, t9 = read_metadata(tmp_path / "one"), read_metadata(tmp_path / "many")
    assert t1.equals(t9)
    assert one.tokens == many.tokens == int(pc.sum(t1.column("seq_len")).as_py())


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("synth", out, "-n", "100", expect=2)
    assert result.stderr.strip().splitlines() == [
        f"varpack: error: output {out} already exists; pass --overwrite to replace it"
    ]
    assert (out / "keep.txt").read_text() == "mine"
    # --overwrite never replaces a directory varpack did not write (it may hold anything)
    result = cli("synth", out, "-n", "100", "--overwrite", expect=2)
    assert "not an output varpack wrote" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"
    cli("synth", ours, "-n", "100", "-q")
    cli("synth", ours, "-n", "100", "--shards", "2", "--overwrite", "-q")
    names = ["_varpack.json", "part-00000.parquet", "part-00001.parquet"]
    assert sorted(p.name for p in ours.iterdir()) == names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "out"]  # no temporary left


def test_bad_options_one_line(tmp_path: Path) -> None:
    result = cli("synth", tmp_path / "o", "--dist", "bimodal", "--max-len", "4096", expect=2)
    assert result.stderr.count("\n") == 1 and "bimodal splits at 8192" in result.stderr
    assert not (tmp_path / "o").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "value"),
    [("1000", 1000), ("1_000", 1000), ("1e6", 10**6), ("2.5M", 2_500_000), ("3k", 3000)],
)
def test_count_parser(text: str, value: int) -> None:
    assert Count().convert(text, None, None) == value


@pytest.mark.parametrize("text", ["abc", "0", "1.5", "-3"])
def test_count_parser_rejects(text: str) -> None:
    import click

    with pytest.raises(click.BadParameter):
        Count().convert(text, None, None)


def test_tokenized_matches_metadata(tmp_path: Path) -> None:
    args = ["-n", "3000", "--shards", "3", "--seed", "5", "--dist", "long-tail", "-q"]
    cli("synth", tmp_path / "meta", *args)
    cli(
        "synth",
        tmp_path / "tok",
        *args,
        "--tokenized",
        "--vocab-size",
        "100",
        "--row-group-size",
        "256",
    )
    meta = read_metadata(tmp_path / "meta")
    files = resolve_files(tmp_path / "tok")
    assert len(files) == 3
    footers = [pq.read_metadata(f) for f in files]
    assert [m.num_row_groups for m in footers] == [-(-m.num_rows // 256) for m in footers]
    assert max(m.num_row_groups for m in footers) >= 3
    import pyarrow as pa

    tok = pa.concat_tables(pq.read_table(f) for f in files)
    assert tok.schema.field("input_ids").type == pa.list_(pa.int32())
    assert tok.column("sample_id").equals(meta.column("sample_id"))
    lens = pc.list_value_length(tok.column("input_ids")).cast(pa.int64())
    assert lens.equals(meta.column("seq_len"))
    flat = pc.list_flatten(tok.column("input_ids"))
    assert pc.min(flat).as_py() >= 0 and pc.max(flat).as_py() < 100
    assert len(pc.unique(flat)) > 90  # random tokens, not a constant


def test_sources_column_is_a_function_of_the_id(tmp_path):
    """--sources K: the same source per id whatever the shards, in metadata and tokens alike."""
    import pyarrow.parquet as pq

    from varpack.metadata.sources import source_names

    one = write_synth(tmp_path / "one", "uniform", 3000, shards=1, seed=2, sources=3)
    many = write_synth(tmp_path / "many", "uniform", 3000, shards=5, seed=2, sources=3)
    tok = write_synth(tmp_path / "tok", "uniform", 3000, shards=2, seed=2, sources=3,
                      tokenized=True, max_len=100)  # fmt: skip

    def by_id(files):
        t = pq.read_table([str(f) for f in files], columns=["sample_id", "source"])
        ids, names = t.column("sample_id").to_pylist(), t.column("source").to_pylist()
        return dict(zip(ids, names, strict=True))

    a = by_id(one.files)
    assert a == by_id(many.files) == by_id(tok.files)
    counts = [list(a.values()).count(s) for s in source_names(3)]
    assert counts[0] > counts[1] > counts[2] > 0  # skewed like a mixture, every source used


def test_count_pattern_counts_up_in_every_sample(tmp_path: Path) -> None:
    """--pattern count: each sample counts up by one from some id, wrapping at the vocabulary;
    the same ids and lengths as the metadata, the same tokens whatever the shard count; refused
    without --tokenized."""
    import pyarrow as pa

    args = ["-n", "2000", "--seed", "5", "--dist", "video", "--tokenized", "--vocab-size", "50"]
    cli("synth", tmp_path / "one", *args, "--pattern", "count", "--shards", "1", "-q")
    cli("synth", tmp_path / "many", *args, "--pattern", "count", "--shards", "5", "-q")
    cli("synth", tmp_path / "meta", *args[:6], "--shards", "5", "-q")
    read = [pa.concat_tables(pq.read_table(f) for f in resolve_files(tmp_path / d))
            for d in ("one", "many")]  # fmt: skip
    assert read[0].equals(read[1])
    meta = read_metadata(tmp_path / "meta")
    assert read[1].column("sample_id").equals(meta.column("sample_id"))
    rows = read[0].column("input_ids").to_pylist()
    assert [len(r) for r in rows] == meta.column("seq_len").to_pylist()
    assert all(np.array_equal(np.diff(r) % 50, np.ones(len(r) - 1)) for r in rows)
    assert len({r[0] for r in rows}) > 40 and max(max(r) for r in rows) == 49  # starts vary, wrap
    bad = cli("synth", tmp_path / "bad", "-n", "10", "--pattern", "count", expect=2)
    assert "--pattern count" in bad.output and "--tokenized" in bad.output
    assert not (tmp_path / "bad").exists()
