"""``varpack lengths --keep COL``: dataset columns copied into the metadata, one type across files,
then read there by ``plan --where`` and ``plan --carry`` (no ``--carry-from`` needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    root = tmp_path / "tokens"
    root.mkdir()
    start = 0
    for k, n in enumerate([300, 450]):
        lens = rng.integers(1, 200, n)
        source = rng.choice(["web", "code", "math"], n)
        pq.write_table(
            pa.table({
                "id": np.arange(start, start + n, dtype=np.int64) * 3,
                "input_ids": [rng.integers(0, 100, m) for m in lens],
                # one file stores strings plainly, another dictionary-encoded; ints as int32 / int64
                "source": pa.array(source).dictionary_encode() if k else pa.array(source),
                "score": rng.random(n).astype(np.float32 if k else np.float64),
                "tier": rng.integers(0, 3, n).astype(np.int32 if k else np.int64),
                "nested": [[1]] * n,
            }),
            root / f"part-{k}.parquet",
            row_group_size=128,
        )  # fmt: skip
        start += n
    return root


def test_kept_columns_land_in_the_metadata_row_for_row_in_one_type(
    tmp_path: Path, tokens: Path
) -> None:
    cli("lengths", tokens, tmp_path / "meta", "--id-column", "id", "--keep", "source",
        "--keep", "score", "--keep", "tier", "-q")  # fmt: skip
    meta = pq.read_table(sorted((tmp_path / "meta").glob("*.parquet")))
    assert meta.schema.names == ["sample_id", "seq_len", "source", "score", "tier"]
    assert [str(t) for t in meta.schema.types[2:]] == ["string", "double", "int64"]
    src = pq.read_table(sorted(tokens.glob("*.parquet")), columns=["id", "source", "score", "tier"])
    want = {
        int(i): (str(s), float(c), int(t))
        for i, s, c, t in zip(*(src[c].to_pylist() for c in src.column_names), strict=True)
    }
    got = {
        int(i): (s, c, t)
        for i, s, c, t in zip(
            *(meta[c].to_pylist() for c in ("sample_id", "source", "score", "tier")), strict=True
        )
    }
    assert got == want
    # the metadata now serves --where and --carry by itself
    cli("plan", tmp_path / "meta", tmp_path / "plan", "--max-tokens", 512, "--dp", 2,
        "--carry", "source", "--where", "source = 'code' AND tier > 0", "-q")  # fmt: skip
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    keep = sum(
        1
        for s, t in zip(src["source"].to_pylist(), src["tier"].to_pylist(), strict=True)
        if s == "code" and t > 0
    )
    assert doc["selection"]["kept_samples"] == keep
    out = cli("validate", tmp_path / "plan", "--metadata", tmp_path / "meta").stdout
    assert out.startswith("OK") and "carried source (checked against the metadata)" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--keep", "nope"), "--keep nope: no such column (columns: id, input_ids, source"),
        (("--keep", "nested"), "--keep nested: type list"),
        (("--keep", "input_ids"), "--keep input_ids: the token or id column"),
        (("--keep", "id"), "--keep id: the token or id column"),
        (("--keep", "source", "--keep", "source"), "--keep source: named twice"),
    ],
)
def test_a_bad_keep_is_one_line_and_writes_nothing(
    tmp_path: Path, tokens: Path, args: tuple[str, ...], words: str
) -> None:
    out = cli("lengths", tokens, tmp_path / "meta", "--id-column", "id", *args, expect=2)
    assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr, out.stderr
    assert not (tmp_path / "meta").exists()
