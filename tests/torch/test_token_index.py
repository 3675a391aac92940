"""The token copy's offline location index: same tokens, refused when stale, flat memory."""

from __future__ import annotations

import json
import mmap
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from varpack.errors import InputError
from varpack.metadata.lengths import write_arrow_tokens
from varpack.metadata.token_index import BLOCK, TokenIndex, index_path

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from varpack.torch import ParquetTokenDataset  # noqa: E402


def mapped(array: np.ndarray) -> bool:
    """Whether ``array`` lies in a memory map (not in this process's heap)."""
    base: object = array
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, mmap.mmap)


def tokenized(path: Path, n: int, seed: int = 0, max_len: int = 40) -> dict[int, np.ndarray]:
    """``n`` samples of 1..max_len tokens under shuffled ids, in row groups of 10 K."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, max_len, n)
    offsets = np.r_[0, np.cumsum(lens)].astype(np.int32)
    values = rng.integers(0, 30_000, int(offsets[-1])).astype(np.int32)
    ids = rng.permutation(n).astype(np.int64) * 3 + 5
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"sample_id": ids, "input_ids": tokens}), path, row_group_size=10_000)
    return {int(i): values[offsets[k] : offsets[k + 1]] for k, i in enumerate(ids[:500])}


def test_the_index_gives_the_same_tokens_and_maps_instead_of_building(tmp_path: Path) -> None:
    truth = tokenized(tmp_path / "t.parquet", 30_000)
    copy = write_arrow_tokens(tmp_path / "t.parquet", tmp_path / "t.arrow")
    assert index_path(copy).is_file()
    ds = ParquetTokenDataset(copy)
    assert mapped(ds._sorted_ids) and len(ds) == 30_000  # mapped, not built
    ids = np.array(list(truth))
    flat, lens = ds.get_flat(ids)
    assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in ids]))
    offsets = np.minimum(lens // 2, 3)  # pieces: tokens [offset, offset + length) of each
    pieces, plens = ds.get_flat(ids, offsets, lens - offsets)
    assert np.array_equal(
        pieces, np.concatenate([truth[int(i)][o:] for i, o in zip(ids, offsets, strict=True)])
    )
    index_path(copy).unlink()  # without the index: built in memory, the same answers
    plain = ParquetTokenDataset(copy)
    assert not mapped(plain._sorted_ids)
    assert np.array_equal(plain.get_flat(ids)[0], flat)
    with pytest.raises(InputError, match="is not in the tokenized dataset"):
        ds.get_flat(np.array([4]))


def test_a_worker_maps_the_index_again_and_a_stale_index_is_refused(tmp_path: Path) -> None:
    truth = tokenized(tmp_path / "t.parquet", 2_000)
    copy = write_arrow_tokens(tmp_path / "t.parquet", tmp_path / "t.arrow")
    ds = ParquetTokenDataset(copy)
    state = pickle.dumps(ds)
    assert len(state) < 10_000  # the arrays are not copied into a DataLoader worker
    again = pickle.loads(state)
    some = np.array(list(truth)[:50])
    assert mapped(again._sorted_ids)
    assert np.array_equal(again.get_flat(some)[0], ds.get_flat(some)[0])
    tokenized(tmp_path / "u.parquet", 2_000, seed=1)  # another copy written over this one
    other = write_arrow_tokens(tmp_path / "u.parquet", tmp_path / "u.arrow")
    copy.write_bytes(other.read_bytes())
    with pytest.raises(InputError, match="t.arrow.idx does not belong to .*t.arrow"):
        ParquetTokenDataset(copy)


OPEN = """
import json, sys, time
import numpy as np
from varpack.torch import ParquetTokenDataset

def status_mb(key):
    line = next(x for x in open("/proc/self/status") if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024

def anon_mb():  # this process's own memory; mapped file pages are the shared page cache
    fields = open("/proc/self/smaps_rollup").read().split()
    return int(fields[fields.index("Anonymous:") + 1]) / 1024

before, own = status_mb('VmRSS'), anon_mb()
t = time.perf_counter()
ds = ParquetTokenDataset(sys.argv[1])
ds.get_flat(np.arange(5, 5 + 3 * 200, 3))  # a first micro-batch of 200 samples
took = time.perf_counter() - t
grew = status_mb('VmHWM') - before  # peak RSS (reset at exec, unlike ru_maxrss)
print(json.dumps({"mb": grew, "anon_mb": anon_mb() - own, "s": took, "n": len(ds)}))
"""


@pytest.mark.slow
def test_opening_a_ten_times_larger_copy_takes_the_same_memory(tmp_path: Path) -> None:
    grown = []
    for n in (100_000, 1_000_000):
        tokenized(tmp_path / f"{n}.parquet", n, max_len=8)
        copy = write_arrow_tokens(tmp_path / f"{n}.parquet", tmp_path / f"{n}.arrow")
        out = subprocess.run([sys.executable, "-c", OPEN, str(copy)], capture_output=True,
                             text=True, check=True)  # fmt: skip
        grown.append(json.loads(out.stdout))
    assert [g["n"] for g in grown] == [100_000, 1_000_000]
    assert abs(grown[1]["mb"] - grown[0]["mb"]) < 50, grown  # nothing grows with the data
    assert all(g["mb"] < 100 and g["anon_mb"] < 100 for g in grown), grown


def test_find_agrees_with_a_binary_search_over_all_ids() -> None:
    rng = np.random.default_rng(1)
    for n in (1, 5, 511, 512, 513, 5000):
        ids = np.sort(rng.choice(10 * n + 10, n, replace=False)).astype(np.int64)
        index = TokenIndex(ids, ids, ids, ids[::BLOCK], np.dtype("int32"))
        queries = rng.integers(-5, 10 * n + 20, 2000)
        pos, found = index.find(queries)
        truth = np.searchsorted(ids, queries)
        present = (truth < n) & (ids[np.minimum(truth, n - 1)] == queries)
        assert np.array_equal(found, present), n
        assert np.array_equal(pos[found], truth[present]), n


def _shard(path: Path, ids: np.ndarray, seed: int) -> dict[int, np.ndarray]:
    """A tokenized shard of the given ids (1..40 tokens each); its tokens by id."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 40, len(ids))
    offsets = np.r_[0, np.cumsum(lens)].astype(np.int32)
    values = rng.integers(0, 30_000, int(offsets[-1])).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"sample_id": ids, "input_ids": tokens}), path, row_group_size=700)
    return {int(i): values[offsets[k] : offsets[k + 1]] for k, i in enumerate(ids)}


def test_copies_of_several_shards_open_through_their_indexes(tmp_path: Path) -> None:
    """One copy per input shard (ids of disjoint ranges, in any file order): opened as one
    through the copies' indexes, nothing built; the tokens are those of the copies opened
    without indexes, also pieces and in a DataLoader worker."""
    copies = tmp_path / "copies"
    copies.mkdir()
    truth: dict[int, np.ndarray] = {}
    for k, lo in enumerate([20_000, 0, 50_000]):  # the files' order is not the ids' order
        ids = np.random.default_rng(k).permutation(3_000) * 3 + lo
        truth |= _shard(tmp_path / f"s{k}.parquet", ids, seed=10 + k)
        write_arrow_tokens(tmp_path / f"s{k}.parquet", copies / f"s{k}.arrow")
    ds = ParquetTokenDataset(copies)
    assert len(ds) == 9_000 and ds._index is not None and not isinstance(ds._tok_start, np.ndarray)
    ids = np.random.default_rng(5).choice(np.array(list(truth)), 700, replace=False)
    flat, lens = ds.get_flat(ids)
    assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in ids]))
    offsets = np.minimum(lens // 2, 3)
    pieces, _ = ds.get_flat(ids, offsets, lens - offsets)
    want = [truth[int(i)][o:] for i, o in zip(ids, offsets, strict=True)]
    assert np.array_equal(pieces, np.concatenate(want))
    assert int(ids[0]) in ds and 1 not in ds  # 1: inside a copy's range, not an id
    again = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(again.get_flat(ids)[0], flat)
    with pytest.raises(InputError, match="is not in the tokenized dataset"):
        ds.get_flat(np.array([40_000]))  # between two copies' ranges
    for idx in copies.glob("*.idx"):
        idx.unlink()
    plain = ParquetTokenDataset(copies)
    assert plain._index is None and np.array_equal(plain.get_flat(ids)[0], flat)


def test_copies_with_overlapping_id_ranges_are_opened_without_indexes(tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    truth: dict[int, np.ndarray] = {}
    for k in range(2):  # interleaved ids: both ranges span the same values
        truth |= _shard(tmp_path / f"s{k}.parquet", np.arange(k, 4_000, 2), seed=k)
        write_arrow_tokens(tmp_path / f"s{k}.parquet", copies / f"s{k}.arrow")
    ds = ParquetTokenDataset(copies)
    assert ds._index is None  # positions built at open, as without indexes
    ids = np.array([3, 0, 3_999, 2_000])
    assert np.array_equal(ds.get_flat(ids)[0], np.concatenate([truth[int(i)] for i in ids]))
