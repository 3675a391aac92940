"""`varpack validate` on a blend of split documents: forged pieces are caught, one line each.

Each forgery rewrites a manifest (its sha256 and rows updated in plan.json) the way a planner bug
would: a piece out of place, a piece's source changed, a piece planned once more than its document's
other pieces, two pieces of one document in one micro-batch, plan.json's piece count edited.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.planfile.format import PLAN_JSON, _write_table, rank_file, sha256_file


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A shuffled blend of long documents (pieces of 1,024 tokens), books drawn twice over."""
    tmp = tmp_path_factory.mktemp("blend")
    rng = np.random.default_rng(11)
    n = 600
    src = rng.choice(["books", "code"], n, p=[0.4, 0.6])
    lens = np.where(src == "books", rng.integers(1500, 5000, n), rng.integers(30, 900, n))
    meta = tmp / "m.parquet"
    pq.write_table(pa.table({"sample_id": np.arange(n, dtype=np.int64), "seq_len": lens,
                             "source": src}), meta)  # fmt: skip
    cli("plan", meta, tmp / "p", "--max-tokens", 1024, "--dp", 2, "--grad-accum", 2,
        "--order", "shuffle", "--oversize", "split", "--source-column", "source",
        "--mix", "books=0.8,code=0.2", "--total-tokens", int(1.6 * lens[src == "books"].sum() / 0.8), "-q")  # fmt: skip
    assert cli("validate", tmp / "p", "--metadata", meta).stdout.startswith("OK")
    return tmp / "p", meta


@pytest.fixture
def plan(blend: tuple[Path, Path], tmp_path: Path) -> Path:
    out = tmp_path / "p"
    out.mkdir()
    for f in blend[0].iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def _rows(plan: Path, rank: int = 0) -> list[dict[str, Any]]:
    return pq.read_table(plan / rank_file(rank)).to_pylist()


def _rewrite(plan: Path, rows: list[dict[str, Any]], rank: int = 0) -> None:
    path = plan / rank_file(rank)
    _write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["ranks"][rank].update(sha256=sha256_file(path), rows=len(rows))
    (plan / PLAN_JSON).write_text(json.dumps(doc))


def _find(rows: list[dict[str, Any]], piece: bool, copies: int | None = None) -> tuple[int, int]:
    """A row and position holding a piece in the middle of its document (or a whole sample);
    with ``copies``, one whose piece this rank holds that many times."""
    later = {(i, off) for row in rows for i, off in zip(row["sample_ids"], row["sample_offsets"], strict=True)}  # fmt: skip
    drawn = Counter((i, off) for row in rows for i, off in zip(row["sample_ids"], row["sample_offsets"], strict=True))  # fmt: skip
    for r, row in enumerate(rows):
        for k, (i, off) in enumerate(zip(row["sample_ids"], row["sample_offsets"], strict=True)):
            if copies is not None and drawn[(i, off)] != copies:
                continue
            middle = off > 0 and (i, off + row["seq_lens"][k]) in later
            if middle if piece else off == 0 and (i, row["seq_lens"][k]) not in later:
                return r, k
    raise AssertionError("no such sample")


def _out(plan: Path, meta: Path | None = None) -> str:
    args = ("--metadata", meta) if meta else ()
    return cli("validate", plan, *args, expect=1).stdout


def test_a_piece_out_of_place_breaks_the_tiling(plan: Path) -> None:
    rows = _rows(plan)
    r, k = _find(rows, piece=True)
    doc, off = rows[r]["sample_ids"][k], rows[r]["sample_offsets"][k]
    rows[r]["sample_offsets"][k] += 1
    _rewrite(plan, rows)
    assert f"mix: sample_id {doc} offset {off + 1}: " in _out(plan)


@pytest.mark.parametrize("copies", [1, 2], ids=["drawn-once", "drawn-twice"])
def test_a_piece_with_another_source(plan: Path, copies: int) -> None:
    """A piece of a document drawn once disagrees with its siblings; a piece of a document drawn
    twice also disagrees with its own other copy."""
    rows = _rows(plan)
    drawn = Counter((i, off) for row in rows for i, off in zip(row["sample_ids"], row["sample_offsets"], strict=True))  # fmt: skip
    r, k = _find(rows, piece=True, copies=copies)
    row = rows[r]
    i, off = row["sample_ids"][k], row["sample_offsets"][k]
    assert drawn[(i, off)] == copies  # copies on this rank
    row["carry.source"][k] = "code" if row["carry.source"][k] == "books" else "books"
    _rewrite(plan, rows)
    out = _out(plan)
    if copies == 2:
        assert f"pieces planned with two lengths or sources (sample_id@offset): {i}@{off}" in out
    assert f"documents whose pieces have two sources: {i}" in out


def test_a_piece_planned_once_more_than_its_document(plan: Path) -> None:
    rows = _rows(plan)
    r, k = _find(rows, piece=True)
    s = (r + 1) % len(rows)
    for col in ("sample_ids", "seq_lens", "sample_offsets", "carry.source"):
        rows[s][col].append(rows[r][col][k])
    _rewrite(plan, rows)
    out = _out(plan)
    assert "documents whose pieces are planned unlike often (a document is drawn whole)" in out
    assert str(rows[r]["sample_ids"][k]) in out


def test_two_pieces_of_a_document_in_one_micro_batch(plan: Path) -> None:
    rows = _rows(plan)
    where: dict[int, list[tuple[int, int, int]]] = {}
    for r, row in enumerate(rows):
        for k, (i, off) in enumerate(zip(row["sample_ids"], row["sample_offsets"], strict=True)):
            where.setdefault(i, []).append((r, k, off))
    doc, places = next((i, p) for i, p in where.items() if len({x[2] for x in p}) > 1)
    (r, k, _), (s, _, _) = next(
        (a, b) for a in places for b in places if a[0] != b[0] and a[2] != b[2]
    )
    for col in ("sample_ids", "seq_lens", "sample_offsets", "carry.source"):
        rows[s][col].append(rows[r][col][k])  # beside another piece of its document
    _rewrite(plan, rows)
    assert f"pieces of sample_id {doc} at offsets" in _out(plan)


def test_each_sources_pieces_are_plan_jsons(plan: Path) -> None:
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["mix"]["sources"]["books"]["planned_pieces"] += 1
    (plan / PLAN_JSON).write_text(json.dumps(doc))
    out = cli("validate", plan, expect=None).stdout
    assert "mix: source books: " in out and "pieces planned; plan.json says" in out


def test_the_metadata_length_is_the_tiling(plan: Path, blend: tuple[Path, Path]) -> None:
    """With --metadata, each document's pieces must sum to its metadata length."""
    meta = pq.read_table(blend[1]).to_pydict()
    rows = _rows(plan)
    r, k = _find(rows, piece=True)
    doc = rows[r]["sample_ids"][k]
    at = meta["sample_id"].index(doc)
    meta["seq_len"][at] += 5
    pq.write_table(pa.table(meta), plan.parent / "edited.parquet")
    out = _out(plan, plan.parent / "edited.parquet")
    assert "mix: sample ids planned with another length than the metadata's" in out
    assert str(doc) in out
