"""The vision_patches column: each sample's images by their patches, checked, summarised by
`check`, and a sort key by its per-sample total (one process and MPI)."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli, mpiexec

from varpack.errors import InputError
from varpack.metadata.contract import read_metadata

INT32_LIST = pa.list_(pa.int32())


def _images(n: int, seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for i in range(n):
        k = int(rng.integers(0, 4))
        out.append(None if k == 0 and i % 2 else rng.integers(16, 16384, k).tolist())
    return out


def _write(root: Path, images: list[Any], typ: pa.DataType = INT32_LIST,
           shards: int = 2) -> Path:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    n = len(images)
    lens = np.random.default_rng(1).integers(50, 4000, n)
    table = pa.table({"sample_id": np.arange(n) * 3 + 1, "seq_len": lens,
                      "vision_patches": pa.array(images, typ)})  # fmt: skip
    cut = np.linspace(0, n, shards + 1).astype(int)
    for k in range(shards):
        pq.write_table(table.slice(cut[k], cut[k + 1] - cut[k]), root / f"part-{k:05d}.parquet")
    return root


def _totals(images: list[Any]) -> np.ndarray:
    return np.array([sum(x) if x else 0 for x in images], dtype=np.int64)


def test_check_summarises_the_images(tmp_path: Path) -> None:
    images = _images(600)
    meta = _write(tmp_path / "m", images)
    flat = np.array([p for x in images if x for p in x])
    got = json.loads(cli("check", meta, "--json").stdout)["vision"]
    assert got["samples"] == 600 and got["images"] == len(flat)
    assert got["samples_with_images"] == sum(1 for x in images if x)
    assert got["patches"] == int(flat.sum()) and got["max"] == int(flat.max())
    assert got["p50"] == pytest.approx(float(np.percentile(flat, 50)))
    text = cli("check", meta).stdout
    assert f"images       {len(flat):,} in {got['samples_with_images']:,} samples" in text
    # a selection counts its own samples' images
    sel = json.loads(cli("check", meta, "--json", "--where", "sample_id < 301").stdout)["vision"]
    assert sel["samples"] == 100 and sel["images"] == sum(len(x or []) for x in images[:100])
    # metadata without the column says nothing of images
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"sample_id": [1, 2], "seq_len": [3, 4]}), plain / "a.parquet")
    assert "vision" not in json.loads(cli("check", plain, "--json").stdout)


@pytest.mark.parametrize("typ", [pa.list_(pa.int32()), pa.large_list(pa.int64()),
                                 pa.list_(pa.uint16())])  # fmt: skip
def test_a_key_by_its_total(tmp_path: Path, typ: pa.DataType) -> None:
    images = _images(300, 2)
    table = read_metadata(_write(tmp_path / "m", images, typ), ["vision_patches"])
    assert table.column("vision_patches").type == pa.int64()
    assert table.column("vision_patches").to_numpy().tolist() == _totals(images).tolist()


@pytest.mark.parametrize("ranks", [1, 2])
def test_sort_orders_by_the_images_patches(tmp_path: Path, ranks: int) -> None:
    images = _images(500, 3)
    meta = _write(tmp_path / "m", images, shards=3)
    args = ("sort", meta, tmp_path / "s", "--key", "vision_patches", "--descending",
            "vision_patches")  # fmt: skip
    if ranks == 1:
        cli(*args)
    else:
        mpiexec(ranks, *args)
    out = pq.read_table(sorted(glob.glob(str(tmp_path / "s" / "*.parquet"))))
    got = out.column("vision_patches").to_numpy()
    assert (np.diff(got) <= 0).all()
    by_id = dict(zip((np.arange(500) * 3 + 1).tolist(), _totals(images).tolist(), strict=True))
    assert [by_id[i] for i in out.column("sample_id").to_pylist()] == got.tolist()


@pytest.mark.parametrize(
    ("images", "typ", "message"),
    [
        ([[5, 0], [3]], pa.list_(pa.int32()),
         "row 0 (sample_id 1): image 1 has 0 patches in 'vision_patches'"),
        ([[5], [3, None]], pa.list_(pa.int32()), "row 1 (sample_id 4): image 1 has None patches"),
        ([[5], [-2]], pa.list_(pa.int64()), "image 0 has -2 patches"),
        ([[5.0], [3.0]], pa.list_(pa.float64()), "expected a list of integers"),
    ],
)  # fmt: skip
def test_bad_images_are_one_line(tmp_path: Path, images: list[Any], typ: pa.DataType,
                                 message: str) -> None:  # fmt: skip
    meta = _write(tmp_path / "m", images, typ, shards=1)
    res = cli("check", meta, expect=2)
    (line,) = res.stderr.strip().splitlines()
    assert message in line and "part-00000.parquet" in line, line
    if typ != pa.list_(pa.float64()):
        with pytest.raises(InputError, match="patches in 'vision_patches'"):
            read_metadata(meta, ["vision_patches"])


def test_a_sorted_output_holds_totals_that_check_reads(tmp_path: Path) -> None:
    images = _images(200, 4)
    meta = _write(tmp_path / "m", images)
    cli("sort", meta, tmp_path / "s", "--key", "vision_patches")
    got = json.loads(cli("check", tmp_path / "s", "--json").stdout)["vision"]
    totals = _totals(images)
    assert got["per"] == "sample" and "images" not in got
    assert got["samples_with_images"] == int((totals > 0).sum())
    assert got["patches"] == int(totals.sum()) and got["max"] == int(totals.max())
    assert (
        "(each sample's total: its images are not told apart)"
        in cli("check", tmp_path / "s").stdout
    )
    # sorted again by its totals: the same order
    cli("sort", tmp_path / "s", tmp_path / "s2", "--key", "vision_patches")
    a = pq.read_table(sorted(glob.glob(str(tmp_path / "s" / "*.parquet"))))
    b = pq.read_table(sorted(glob.glob(str(tmp_path / "s2" / "*.parquet"))))
    assert a.column("sample_id").to_pylist() == b.column("sample_id").to_pylist()


def test_files_without_the_column_hold_text_only_samples(tmp_path: Path) -> None:
    meta = _write(tmp_path / "m", [[100, 200], None, [5]], shards=1)
    pq.write_table(
        pa.table({"sample_id": [50, 51], "seq_len": [3, 4]}), meta / "part-00009.parquet"
    )
    got = json.loads(cli("check", meta, "--json").stdout)["vision"]
    assert got["samples"] == 5 and got["samples_with_images"] == 2 and got["images"] == 3
    # a file of totals beside files of images: one line, not a mixed figure
    pq.write_table(pa.table({"sample_id": [60], "seq_len": [5], "vision_patches": [7]}),
                   meta / "part-00010.parquet")  # fmt: skip
    (line,) = cli("check", meta, expect=2).stderr.strip().splitlines()
    assert "holds each sample's total here and its images in other files" in line


@pytest.mark.parametrize(
    ("images", "typ", "args", "message"),
    [
        ([[2**64 - 1]], pa.list_(pa.uint64()), (), "image 0 has 18446744073709551615 patches"),
        ([[2**40]], pa.list_(pa.int64()), (), "image 0 has 1099511627776 patches"),
        ([3.5], pa.float64(), ("--key", "vision_patches"), "expected a list of integers"),
        ([-3], pa.int64(), ("--key", "vision_patches"), "'vision_patches' is -3"),
    ],
)  # fmt: skip
def test_out_of_range_patches_are_one_line(tmp_path: Path, images: list[Any], typ: pa.DataType,
                                           args: tuple[str, ...], message: str) -> None:  # fmt: skip
    meta = _write(tmp_path / "m", images, typ, shards=1)
    (line,) = cli("check", meta, *args, expect=2).stderr.strip().splitlines()
    assert message in line, line
