"""``ParquetTokenDataset`` over the Arrow copy returns exactly what it returns from the Parquet."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")  # a bare tests/torch namespace must not pass for torch

import pyarrow as pa  # noqa: E402
import pyarrow.feather as feather  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from plan_helpers import write_tokens  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.metadata.lengths import derive_lengths, write_arrow_tokens  # noqa: E402
from varpack.torch import ParquetTokenDataset  # noqa: E402
from varpack.torch import dataset as torch_dataset  # noqa: E402


@pytest.fixture
def tokens(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, dict[int, np.ndarray]]:
    """Three shards, 7-19 rows per row group, sparse ids: id -> tokens."""
    ids = rng.choice(10**6, 260, replace=False)
    lens = rng.integers(1, 70, 260)
    truth: dict[int, np.ndarray] = {}
    for k, (lo, hi, rg) in enumerate(((0, 90, 7), (90, 150, 19), (150, 260, 11))):
        path = tmp_path / "tok" / f"part-{k}.parquet"
        truth |= write_tokens(path, ids[lo:hi], lens[lo:hi], seed=k, row_group_size=rg)
    return tmp_path / "tok", truth


def _same(a: ParquetTokenDataset, b: ParquetTokenDataset, ids: np.ndarray) -> None:
    fa, la = a.get_flat(ids)
    fb, lb = b.get_flat(ids)
    assert fa.dtype == fb.dtype and np.array_equal(fa, fb) and np.array_equal(la, lb)


@pytest.mark.parametrize("id_column", ["sample_id", None])
def test_copy_from_lengths_reads_like_the_source(
    tokens: tuple[Path, dict[int, np.ndarray]],
    tmp_path: Path,
    rng: np.random.Generator,
    id_column: str | None,
) -> None:
    src, truth = tokens
    copy = tmp_path / "tok.arrow"
    derive_lengths(src, tmp_path / "meta", id_column=id_column, arrow_copy=copy)
    parquet = ParquetTokenDataset(src, id_column=id_column, cache_row_groups=3)
    arrow = ParquetTokenDataset(copy)  # the copy is always keyed by its sample_id column
    assert arrow.ipc and len(arrow) == len(parquet) == len(truth)
    assert np.array_equal(arrow._sorted_ids, parquet._sorted_ids)
    every = rng.permutation(parquet._sorted_ids)
    _same(parquet, arrow, every)  # every sample, in a shuffled order, in one call
    for _ in range(5):  # micro-batch sized draws over all record batches
        _same(parquet, arrow, rng.choice(every, 9, replace=False))
    if id_column == "sample_id":
        for i in rng.choice(every, 20):
            assert np.array_equal(arrow[int(i)], truth[int(i)])
    clone = pickle.loads(pickle.dumps(arrow))  # DataLoader workers map the file themselves
    assert not clone._copies.is_open() and np.array_equal(
        clone.get_flat(every)[0], arrow.get_flat(every)[0]
    )
    with pytest.raises(InputError, match="is not in the tokenized dataset"):
        arrow.get_flat(np.array([10**7]))


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_several_copies_in_a_directory(splits: list[int], data: st.DataObject) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        truth: dict[int, np.ndarray] = {}
        next_id = 0
        for k, n in enumerate(splits):
            lens = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
            ids = range(next_id, next_id + n)
            next_id += n
            part = root / f"src{k}" / "a.parquet"
            truth |= write_tokens(part, list(ids), lens, seed=k, row_group_size=2)
            write_arrow_tokens(part.parent, root / "copies" / f"{k}.arrow")
        ds = ParquetTokenDataset(root / "copies")
        order = np.asarray(data.draw(st.permutations(list(truth))), dtype=np.int64)
        flat, lens_out = ds.get_flat(order)
        assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in order]))
        assert lens_out.tolist() == [len(truth[int(i)]) for i in order]


def test_older_and_foreign_arrow_files(tmp_path: Path) -> None:
    """A list<int32> copy (the older format) is read; a compressed one is refused with advice."""
    table = pa.table(
        {
            "sample_id": pa.array([5, 2], pa.int64()),
            "input_ids": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32())),
        }
    )
    feather.write_feather(table, tmp_path / "old.arrow", compression="uncompressed")
    ds = ParquetTokenDataset(tmp_path / "old.arrow")
    assert ds.get_flat(np.array([2, 5]))[0].tolist() == [4, 1, 2, 3]
    feather.write_feather(table, tmp_path / "lz4.arrow", compression="lz4")
    with pytest.raises(InputError, match="not stored uncompressed.*--arrow-copy"):
        ParquetTokenDataset(tmp_path / "lz4.arrow")


def test_compatibility_reexport() -> None:
    assert torch_dataset.write_arrow_tokens is write_arrow_tokens
