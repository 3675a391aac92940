"""Collation (packed, padded, blocks), masks and the tokenized-Parquet dataset."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("torch.nn")  # a bare tests/torch namespace must not pass for torch

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from plan_helpers import write_tokens  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.torch import IGNORE_INDEX, ParquetTokenDataset  # noqa: E402
from varpack.torch.collate import RowInfo, collate, pack_blocks, pack_packed, pack_padded  # noqa: E402
from varpack.torch.dataset import fetch_flat, write_arrow_tokens  # noqa: E402
from varpack.torch.masks import block_causal_mask, padded_causal_mask  # noqa: E402

lengths = st.lists(st.integers(1, 30), min_size=0, max_size=12)


def _tokens(lens: list[int]) -> np.ndarray:
    return np.arange(1, sum(lens) + 1, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(lengths, st.integers(0, 20))
def test_packed_layout_properties(lens: list[int], extra: int) -> None:
    lens_a = np.asarray(lens, dtype=np.int64)
    n = int(lens_a.sum())
    a = pack_packed(_tokens(lens), lens_a, pad_to=n + extra)
    assert a["input_ids"].shape == (n + extra,)
    assert (a["input_ids"][:n] == _tokens(lens)).all() and (a["input_ids"][n:] == 0).all()
    cu = a["cu_seqlens"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == n + extra
    seg = np.diff(cu)
    assert (seg[: len(lens)] == lens_a).all() and (len(seg) == len(lens) + (extra > 0))
    assert a["max_seqlen"] == (int(seg.max()) if len(seg) else 0)
    # Positions restart at every segment; labels ignore sample starts and padding only.
    for s, e in zip(cu[:-1], cu[1:], strict=True):
        assert (a["position_ids"][s:e] == np.arange(e - s)).all()
    ignored = np.zeros(n + extra, bool)
    ignored[cu[: len(lens)]] = True
    ignored[n:] = True
    assert ((a["labels"] == IGNORE_INDEX) == ignored).all()
    assert (a["labels"][~ignored] == a["input_ids"][~ignored]).all()


@settings(max_examples=60, deadline=None)
@given(lengths.filter(bool), st.integers(0, 5), st.integers(0, 3))
def test_padded_layout_properties(lens: list[int], extra_t: int, pad_rows: int) -> None:
    lens_a = np.asarray(lens, dtype=np.int64)
    t = max(lens) + extra_t
    a = pack_padded(_tokens(lens), lens_a, t, pad_rows)
    assert a["input_ids"].shape == (len(lens) + pad_rows, t)
    cu = np.concatenate([[0], np.cumsum(lens_a)])
    for r, n in enumerate(lens):
        assert (a["input_ids"][r, :n] == _tokens(lens)[cu[r] : cu[r + 1]]).all()
        assert (a["attention_mask"][r] == (np.arange(t) < n)).all()
        assert a["labels"][r, 0] == IGNORE_INDEX and (a["labels"][r, n:] == IGNORE_INDEX).all()
        assert (a["labels"][r, 1:n] == a["input_ids"][r, 1:n]).all()
    assert (a["attention_mask"][len(lens) :] == 0).all() and (
        a["labels"][len(lens) :] == IGNORE_INDEX
    ).all()


def test_blocks_reset_table() -> None:
    # Block 0: samples of 3 and 2 tokens (tail 1); block 1: one of 4 (tail 2); T = 6.
    lens = np.array([3, 2, 4])
    a = pack_blocks(_tokens([3, 2, 4]), lens, np.array([0, 0, 1]), pad_to=6)
    assert a["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert a["starts"].tolist() == [0, 3, 0]
    assert a["resets"].astype(int).tolist() == [[1, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert a["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert a["cu_seqlens"].tolist() == [0, 3, 5, 6, 10, 12]
    assert a["labels"].tolist() == [[-100, 2, 3, -100, 5, -100], [-100, 7, 8, 9, -100, -100]]


def test_block_batch_reorders_samples_by_block(tmp_path) -> None:
    data = {10: np.array([1, 2]), 11: np.array([3, 4, 5]), 12: np.array([6])}
    row = RowInfo(0, 0, np.array([10, 11, 12]), np.array([2, 3, 1]), 4, 1.0, 6, 3, False, True,
                  block_index=np.array([1, 0, 0]))  # fmt: skip
    b = collate(row, lambda ids: fetch_flat(data, ids), "blocks")
    assert b.sample_ids.tolist() == [11, 12, 10]
    assert b.input_ids.tolist() == [[3, 4, 5, 6], [1, 2, 0, 0]]
    assert b.starts.tolist() == [0, 3, 0] and b.block_index.tolist() == [0, 0, 1]
    seg = b.segment_ids()
    assert seg.tolist() == [[0, 0, 0, 1], [2, 2, 3, 3]]


def test_masks_are_block_diagonal_and_never_empty() -> None:
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    m = block_causal_mask(cu, 6)[0, 0]
    seg = [0, 0, 1, 2, 2, 2]
    for i in range(6):
        for j in range(6):
            assert bool(m[i, j]) == (seg[i] == seg[j] and j <= i)
    am = torch.tensor([[1, 1, 0], [0, 0, 0]])
    pm = padded_causal_mask(am)[:, 0]
    assert pm.any(-1).all()  # every query row attends somewhere (no NaN in SDPA)
    assert not pm[0, 1, 2] and not pm[0, 2, 0] and pm[0, 1, 0] and pm[0, 2, 2]


def test_length_mismatch_names_the_sample() -> None:
    data = {5: np.array([1, 2, 3])}
    row = RowInfo(7, 1, np.array([5]), np.array([4]), 8, 1.0, 4, 1, False, True)
    with pytest.raises(
        InputError, match=r"step 7 micro 1: sample id 5 has 3 tokens .* plan says 4"
    ):
        collate(row, lambda ids: fetch_flat(data, ids), "packed")


def test_too_long_for_pad_to_is_an_error() -> None:
    with pytest.raises(InputError, match="do not fit pad_to=4"):
        pack_packed(_tokens([3, 2]), np.array([3, 2]), 4)
    with pytest.raises(InputError, match="does not fit pad_to=2"):
        pack_padded(_tokens([3]), np.array([3]), 2)


# -- dataset -------------------------------------------------------------------------------
@pytest.fixture
def token_dir(tmp_path, rng):
    ids = rng.permutation(300)[:200] * 7 + 3
    lens = rng.integers(1, 50, 200)
    a = write_tokens(
        tmp_path / "d" / "part-0.parquet", ids[:120], lens[:120], seed=1, row_group_size=16
    )
    b = write_tokens(
        tmp_path / "d" / "part-1.parquet", ids[120:], lens[120:], seed=2, row_group_size=25
    )
    return tmp_path / "d", {**a, **b}


def test_parquet_dataset_random_access(token_dir, rng) -> None:
    path, truth = token_dir
    ds = ParquetTokenDataset(path, cache_row_groups=2)
    assert len(ds) == len(truth)
    ids = rng.choice(np.fromiter(truth, dtype=np.int64), 60, replace=False)
    flat, lens = ds.get_flat(ids)
    assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in ids]))
    assert lens.tolist() == [len(truth[int(i)]) for i in ids]
    for i, arr in zip(ids, ds.get_many(ids), strict=True):
        assert np.array_equal(arr, truth[int(i)])
    assert np.array_equal(ds[int(ids[0])], truth[int(ids[0])])
    assert len(ds._cache) <= 2
    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers: no open files travel
    assert clone._files == {} and np.array_equal(clone.get_flat(ids)[0], flat)


def test_arrow_ipc_copy_is_memory_mapped(token_dir, tmp_path, rng) -> None:
    path, truth = token_dir
    arrow = write_arrow_tokens(path, tmp_path / "tokens.arrow")
    ds = ParquetTokenDataset(arrow)
    assert ds.ipc and len(ds) == len(truth)
    ids = rng.choice(np.fromiter(truth, dtype=np.int64), 50, replace=False)
    flat, _ = ds.get_flat(ids)
    assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in ids]))
    assert np.array_equal(
        ParquetTokenDataset(tmp_path).get_flat(ids)[0], flat
    )  # a directory of *.arrow


def test_parquet_dataset_errors(token_dir, tmp_path) -> None:
    path, _ = token_dir
    ds = ParquetTokenDataset(path)
    with pytest.raises(InputError, match="sample id 1 is not in the tokenized dataset"):
        ds.get_flat(np.array([1]))
    with pytest.raises(InputError, match="no column 'tokens'"):
        ParquetTokenDataset(path, column="tokens")
    write_tokens(tmp_path / "dup" / "a.parquet", [1, 2], [3, 3])
    write_tokens(tmp_path / "dup" / "b.parquet", [2], [3])
    with pytest.raises(InputError, match="sample id 2 appears more than once"):
        ParquetTokenDataset(tmp_path / "dup")


def test_parquet_dataset_row_position_ids(token_dir) -> None:
    path, truth = token_dir
    ds = ParquetTokenDataset(path, id_column=None)  # ids = global row in file order
    first_file_ids = list(truth)[:120]
    assert np.array_equal(ds[5], truth[first_file_ids[5]])
    assert np.array_equal(ds[120], truth[list(truth)[120]])


def test_map_style_dataset_accepted() -> None:
    data = {3: torch.tensor([7, 8]), 9: [1, 2, 3]}
    flat, lens = fetch_flat(data, np.array([9, 3]))
    assert flat.tolist() == [1, 2, 3, 7, 8] and lens.tolist() == [3, 2]
    with pytest.raises(InputError, match="sample id 4 is not in the dataset"):
        fetch_flat(data, np.array([4]))
