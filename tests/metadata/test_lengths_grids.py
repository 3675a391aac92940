"""varpack lengths --grid-column: each sample's images by their patches (vision_patches), from
the processor's image_grid_thw (and video_grid_thw) held in a tokenized dataset."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

GRIDS = pa.list_(pa.list_(pa.int64()))


def _dataset(root: Path, n: int = 60, seed: int = 0, video: bool = False,
             grid_type: pa.DataType = GRIDS) -> tuple[Path, list[list[int]]]:  # fmt: skip
    """A tokenized dataset of ``n`` samples in two files (row groups of 16) and each sample's
    expected patches (images first, then videos)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[Any]] = {"sample_id": [], "input_ids": [], "image_grid_thw": []}
    if video:
        rows["video_grid_thw"] = []
    want: list[list[int]] = []
    for i in range(n):
        images = [[1, 2 * int(rng.integers(1, 30)), 2 * int(rng.integers(1, 30))]
                  for _ in range(int(rng.integers(0, 3)))]  # fmt: skip
        videos = [[int(rng.integers(2, 5)), 4, 6]] if video and i % 3 == 0 else []
        rows["sample_id"].append(i * 7)
        rows["input_ids"].append(rng.integers(0, 500, int(rng.integers(3, 40))).tolist())
        rows["image_grid_thw"].append(images or (None if i % 2 else []))
        if video:
            rows["video_grid_thw"].append(videos or None)
        want.append([t * h * w for t, h, w in images + videos])
    table = pa.table({k: pa.array(v, grid_type if k.endswith("grid_thw") else None)
                      for k, v in rows.items()})  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.slice(0, n // 2), root / "a.parquet", row_group_size=16)
    pq.write_table(table.slice(n // 2), root / "b.parquet", row_group_size=16)
    return root, want


def _read(meta: Path) -> pa.Table:
    return pq.read_table(sorted(glob.glob(str(meta / "*.parquet"))))


@pytest.mark.parametrize("grid_type", [GRIDS, pa.list_(pa.list_(pa.int32(), 3)),
                                       pa.large_list(pa.list_(pa.uint16()))])  # fmt: skip
def test_each_images_patches_are_its_grids_product(tmp_path: Path, grid_type: pa.DataType) -> None:
    data, want = _dataset(tmp_path / "d", grid_type=grid_type)
    cli("lengths", data, tmp_path / "m", "--grid-column", "image_grid_thw", "-q")
    table = _read(tmp_path / "m")
    assert table.column("sample_id").to_pylist() == [i * 7 for i in range(60)]
    assert table.column("vision_patches").type == pa.list_(pa.int64())
    assert [x or [] for x in table.column("vision_patches").to_pylist()] == want
    got = json.loads(cli("check", tmp_path / "m", "--json").stdout)["vision"]
    assert got["images"] == sum(len(w) for w in want)


def test_videos_follow_the_images(tmp_path: Path) -> None:
    data, want = _dataset(tmp_path / "d", video=True)
    cli("lengths", data, tmp_path / "m", "--grid-column", "image_grid_thw", "--grid-column",
        "video_grid_thw", "-q")  # fmt: skip
    assert [x or [] for x in _read(tmp_path / "m").column("vision_patches").to_pylist()] == want


def test_without_grid_columns_the_metadata_is_as_before(tmp_path: Path) -> None:
    data, _ = _dataset(tmp_path / "d")
    cli("lengths", data, tmp_path / "m", "-q")
    assert _read(tmp_path / "m").column_names == ["sample_id", "seq_len"]


@pytest.mark.parametrize(
    ("grids", "args", "message"),
    [
        ([[[1, 4, 4]], [[1, 4]]], (), "row 1: --grid-column g: image 0 is [1, 4]"),
        ([[[1, 4, 4], [1, 0, 4]]], (), "row 0: --grid-column g: image 1 is [1, 0, 4]"),
        ([[[1, 4, 4]], [None]], (), "row 1: --grid-column g: image 0 is None"),
        ([[1, 4, 4]], (), "--grid-column g has type list<element: int64>"),
        ([[[1, 4, 4]]], ("--grid-column", "nope"), "--grid-column nope: no such column"),
        ([[[1, 4, 4]]], ("--grid-column", "g"), "--grid-column g: named twice"),
        ([[[1, 4, 4]]], ("--grid-column", "input_ids"), "--grid-column input_ids: also the token"),
    ],
)  # fmt: skip
def test_bad_grids_are_one_line_and_write_nothing(tmp_path: Path, grids: list[Any],
                                                  args: tuple[str, ...], message: str) -> None:  # fmt: skip
    root = tmp_path / "d"
    root.mkdir()
    table = pa.table({"sample_id": list(range(len(grids))),
                      "input_ids": [[1, 2, 3]] * len(grids), "g": grids})  # fmt: skip
    pq.write_table(table, root / "a.parquet")
    extra = ("--grid-column", "g", *args) if "nope" not in args else args
    res = cli("lengths", root, tmp_path / "m", *extra, "-q", expect=2)
    (line,) = res.stderr.strip().splitlines()
    assert message in line, line
    assert not (tmp_path / "m").exists()


def test_huge_grids_and_a_kept_vision_column_are_one_line(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    grids = pa.array([[[1, 4, 4]], [[2**21, 2**21, 1]], [[2**64 - 1, 1, 1]]],
                     pa.list_(pa.list_(pa.uint64())))  # fmt: skip
    pq.write_table(pa.table({"sample_id": [0, 1, 2], "input_ids": [[1, 2]] * 3, "g": grids,
                             "vision_patches": [1, 2, 3]}), root / "a.parquet")  # fmt: skip
    for table, message in ((None, "row 1: --grid-column g: image 0 is [2097152, 2097152, 1]"),):
        del table
        (line,) = cli("lengths", root, tmp_path / "m", "--grid-column", "g", "-q",
                      expect=2).stderr.strip().splitlines()  # fmt: skip
        assert message in line and "at most 2,147,483,647 patches" in line, line
    res = cli("lengths", root, tmp_path / "m", "--grid-column", "g", "--keep", "vision_patches",
              "-q", expect=2)  # fmt: skip
    assert "--keep vision_patches: --grid-column writes vision_patches" in res.stderr
    assert not (tmp_path / "m").exists()
