"""Token copies read by ``pread`` give the mapped gather's tokens, and map nothing."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")  # a bare tests/torch namespace must not pass for torch

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from plan_helpers import write_tokens  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.metadata.lengths import derive_lengths  # noqa: E402
from varpack.torch import ParquetTokenDataset  # noqa: E402
from varpack.torch.copy_read import GAP, CopyFiles, spans  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 60),
    width=st.sampled_from([1, 50, GAP // 4, 40 * GAP]),
    dtype=st.sampled_from(["int32", "uint16", "int64"]),
)
def test_pread_reads_what_the_map_gathers(
    tmp_path_factory: pytest.TempPathFactory, seed: int, n: int, width: int, dtype: str
) -> None:
    """Random (start, length) pairs, overlapping, repeated, empty, near and far apart (``width``
    sets how far, so reads are coalesced or not): both ways give the same tokens in order."""
    rng = np.random.default_rng(seed)
    path = tmp_path_factory.mktemp("copy") / "tokens.bin"
    size = int(rng.integers(1, 4 * width + 64))
    data = rng.integers(0, 2**15, size).astype(dtype)
    data.tofile(path)
    starts = rng.integers(0, size, n)
    lens = np.minimum(rng.integers(0, 40, n), size - starts)
    if n > 2:
        starts[1], lens[1] = starts[0], lens[0]  # the same sample twice in one batch
    want = CopyFiles([str(path)], "mmap").gather(0, np.dtype(dtype), starts, lens)
    got = CopyFiles([str(path)], "pread").gather(0, np.dtype(dtype), starts, lens)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)
    assert np.array_equal(
        want, np.concatenate([data[s : s + k] for s, k in zip(starts, lens, strict=True)])
    )


def test_spans_cover_every_range_and_respect_the_gap(rng: np.random.Generator) -> None:
    starts = rng.integers(0, 10**6, 500)
    ends = starts + rng.integers(0, 5000, 500)
    lo, hi = spans(starts, ends, GAP)
    assert np.all(lo[1:] > hi[:-1] + GAP)  # regions further apart than the gap stay apart
    k = np.searchsorted(lo, starts, side="right") - 1
    assert np.all((lo[k] <= starts) & (ends <= hi[k]))  # every range lies in one region
    assert (hi - lo).sum() <= (ends - starts).sum() + GAP * len(starts)  # gaps read are bounded


def test_a_truncated_copy_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.int32).tofile(path)
    files = CopyFiles([str(path)])
    with pytest.raises(InputError, match="truncated or rewritten since its index"):
        files.gather(0, np.dtype(np.int32), np.array([90]), np.array([20]))
    with pytest.raises(InputError, match="pass one of: pread, mmap"):
        CopyFiles([str(path)], "direct")


@pytest.fixture
def copy(tmp_path: Path, rng: np.random.Generator) -> Path:
    ids = rng.choice(10**6, 400, replace=False)
    write_tokens(tmp_path / "tok.parquet", ids, rng.integers(1, 300, 400), row_group_size=50)
    derive_lengths(tmp_path / "tok.parquet", tmp_path / "meta", arrow_copy=tmp_path / "tok.arrow")
    return tmp_path / "tok.arrow"


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


def test_the_dataset_reads_the_same_both_ways(copy: Path, rng: np.random.Generator) -> None:
    pread, mapped = ParquetTokenDataset(copy), ParquetTokenDataset(copy, read="mmap")
    ids = rng.permutation(pread._sorted_ids[:])
    for batch in (ids, ids[:7], np.repeat(ids[:5], 2)):
        a, b = pread.get_flat(batch), mapped.get_flat(batch)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    clone = pickle.loads(pickle.dumps(pread))  # workers open their own handles
    want = mapped.get_flat(ids)[0]
    assert clone._copies.read == "pread" and np.array_equal(clone.get_flat(ids)[0], want)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_pread_maps_nothing_of_the_copy(copy: Path, rng: np.random.Generator) -> None:
    """What keeps RSS at the batch: the copy is never mapped by default (the map is the check
    that can fail: ``read="mmap"`` maps it)."""
    ds = ParquetTokenDataset(copy)
    ds.get_flat(rng.permutation(ds._sorted_ids[:])[:50])
    assert str(copy) not in _mapped_files().replace(f"{copy}.idx", "")
    mapped = ParquetTokenDataset(copy, read="mmap")  # held: the map lives as long as it
    mapped.get_flat(np.asarray(ds._sorted_ids[:3]))
    assert str(copy) in _mapped_files().replace(f"{copy}.idx", "")
